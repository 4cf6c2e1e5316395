"""Event-loop stalls are measured and recorded with the stack that caused them
(services/common/loop_stalls.py), on a real asyncio loop."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import pytest

from services.common.loop_stalls import LOOP_STALLS, LoopStallWatch

RECORD_MS = 40
# A stall long enough that the watchdog (every 5 ms) surely looks during it, even on a busy machine.
STALL_S = 0.2
WAIT_FOR_RECORD_S = 5.0


def hold_the_loop_sleeping(seconds: float) -> None:
    time.sleep(seconds)  # blocks the loop; releases the GIL, as an fsync does


def hold_the_loop_computing(seconds: float) -> None:
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:  # pure Python: the GIL is handed over every switch interval
        n += 1
    gc.collect()


def stall_seconds_observed() -> float:
    for metric in LOOP_STALLS.collect():
        for sample in metric.samples:
            if sample.name.endswith("_sum"):
                return sample.value
    raise AssertionError("no _sum sample")


async def run_stall(stall: object) -> LoopStallWatch:
    loop = asyncio.get_running_loop()
    watch = LoopStallWatch("test-service", record_ms=RECORD_MS)
    watch.start(loop)
    try:
        await asyncio.sleep(0.05)  # a few ticks first
        loop.call_soon(stall, STALL_S)  # type: ignore[arg-type]
        deadline = time.monotonic() + WAIT_FOR_RECORD_S
        while not any(r.seconds >= STALL_S * 0.9 for r in watch.records) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        watch.stop()
    return watch


@pytest.mark.parametrize("stall", [hold_the_loop_sleeping, hold_the_loop_computing])
def test_a_stall_is_recorded_with_the_stack_it_was_in(
    stall: object, caplog: pytest.LogCaptureFixture
) -> None:
    before = stall_seconds_observed()
    with caplog.at_level(logging.WARNING, logger="highwater.loop_stalls"):
        watch = asyncio.run(run_stall(stall))
    name = stall.__name__  # type: ignore[attr-defined]
    # A loaded machine may add a stall of its own: the one caused here is the one in `stall`.
    (record,) = [r for r in watch.records if any(name in line for line in r.stack)]
    assert STALL_S * 0.9 <= record.seconds < STALL_S + 1.0, record.seconds
    if stall is hold_the_loop_computing:
        assert record.gc_collections >= 1 and record.gc_generation_max == 2 and record.gc_seconds > 0
    assert stall_seconds_observed() - before >= STALL_S * 0.9
    (line,) = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert line.startswith("test-service: event loop stalled")


def test_short_waits_are_measured_but_not_recorded() -> None:
    async def main() -> LoopStallWatch:
        # A bound far above the 5 ms waits: a loaded machine's own delays stay under it.
        watch = LoopStallWatch("test-service", record_ms=150)
        watch.start(asyncio.get_running_loop())
        try:
            for _ in range(5):
                await asyncio.sleep(0.02)
                hold_the_loop_sleeping(0.005)
        finally:
            watch.stop()
        return watch

    assert asyncio.run(main()).records == []
