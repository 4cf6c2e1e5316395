"""Event-loop stalls, each recorded with what the loop was running: the tail behind a p99.

Every request a service answers waits while its event loop runs one long callback (a walk over
10,000 replicas, a large protobuf parse, an fsync, a full garbage collection). A latency
histogram shows that such waits happen, not what caused them. So every service runs:

- a ticker on the loop that notes the time every `LOOP_TICK_MS`;
- a watchdog thread that looks every `WATCHDOG_CHECK_MS`; once the loop has not ticked for
  `limits.LOOP_STALL_RECORD_MS` it takes the loop thread's stack (`sys._current_frames`)
  while the stall is still going on;
- when the loop ticks again, the stall's length goes to `highwater_event_loop_stall_seconds`
  and, past the record bound, one WARNING line with the stack taken and the garbage
  collections that ran meanwhile (how many, how long, the oldest generation: `gc.callbacks`),
  at most `STALL_LOG_PER_MINUTE_MAX` lines a minute (the histogram counts all of them).

The watchdog needs the GIL to read the stack: a stall in Python code releases it every switch
interval (5 ms), so the stack is the stalling one; a stall inside native code holding the GIL
(a C extension) is read when the GIL comes back, and the line then says so when the stack has
moved on. The cost: 1 / `LOOP_TICK_MS` callbacks a second on the loop and a thread that wakes
1 / `WATCHDOG_CHECK_MS` times a second, well under 1% of a core.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

from prometheus_client import Histogram

from services.common import limits

log = logging.getLogger("highwater.loop_stalls")

LOOP_STALL_RECORD_ENV = "HIGHWATER_LOOP_STALL_RECORD_MS"
LOOP_STALL_LOG_PER_MINUTE_ENV = "HIGHWATER_LOOP_STALL_LOG_PER_MINUTE"
# How often the loop notes that it runs; a stall is measured to within this.
LOOP_TICK_MS = 10
# How often the watchdog thread looks at the loop's last tick.
WATCHDOG_CHECK_MS = 5
# Stack frames kept in a record: the innermost ones are where the time went.
STACK_FRAMES_MAX = 14
# Log lines a minute at most: a loop that stalls all the time needs one line to be found, not
# thousands (every stall still goes to the histogram).
STALL_LOG_PER_MINUTE_MAX = 30

LOOP_STALLS = Histogram(
    "highwater_event_loop_stall_seconds",
    "How late the event loop's 10 ms ticker ran: the time every request waited for one callback",
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)


@dataclass
class StallRecord:
    """One stall: how long, the loop thread's stack taken during it, and garbage collections."""

    seconds: float
    stack: list[str] = field(default_factory=list)
    gc_collections: int = 0
    gc_seconds: float = 0.0
    gc_generation_max: int = -1

    def describe(self, service: str) -> str:
        where = "".join(self.stack) if self.stack else "  (no stack taken: the GIL was not released)\n"
        collected = (
            f"; {self.gc_collections} garbage collection(s) ran, {self.gc_seconds * 1000:.0f} ms, "
            f"the oldest generation {self.gc_generation_max}"
            if self.gc_collections
            else ""
        )
        stalled = f"{service}: event loop stalled {self.seconds * 1000:.0f} ms{collected}"
        return f"{stalled}; the loop was in:\n{where}"


class LoopStallWatch:
    """The ticker and the watchdog of one event loop (the module docstring says how)."""

    def __init__(
        self,
        service: str,
        record_ms: int = limits.LOOP_STALL_RECORD_MS,
        log_per_minute: int = STALL_LOG_PER_MINUTE_MAX,
    ) -> None:
        self.service = service
        self.record_s = record_ms / 1000
        self.log_per_minute = log_per_minute
        self.records: list[StallRecord] = []  # the last few, for tests and a debugger
        self._last_tick = time.monotonic()
        self._loop_thread_id = 0
        # The stack the watchdog took, with the tick it took it after: a stack taken just as the
        # stall ended is not given to the next one.
        self._taken: tuple[float, list[str]] = (0.0, [])
        self._gc_collections = 0
        self._gc_seconds = 0.0
        self._gc_generation_max = -1
        self._gc_started = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._logged_at: list[float] = []

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop_thread_id = threading.get_ident()
        self._last_tick = time.monotonic()
        gc.callbacks.append(self._on_gc)
        self._ticker = loop.create_task(self._tick(), name="loop-stall-ticker")
        self._thread = threading.Thread(target=self._watch, name="loop-stall-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.cancel()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if threading.get_ident() != self._loop_thread_id:
            return
        if phase == "start":
            self._gc_collections += 1
            self._gc_generation_max = max(self._gc_generation_max, info["generation"])
            self._gc_started = time.perf_counter()
        elif self._gc_started:
            self._gc_seconds += time.perf_counter() - self._gc_started
            self._gc_started = 0.0

    async def _tick(self) -> None:
        tick_s = LOOP_TICK_MS / 1000
        while True:
            self._gc_collections = 0
            self._gc_seconds = 0.0
            self._gc_generation_max = -1
            self._last_tick = tick = time.monotonic()
            await asyncio.sleep(tick_s)
            late = time.monotonic() - tick - tick_s
            if late > 0:
                LOOP_STALLS.observe(late)
            if late >= self.record_s:
                taken_after, stack = self._taken
                self._record(
                    StallRecord(
                        late,
                        stack if taken_after == tick else [],
                        self._gc_collections,
                        self._gc_seconds,
                        self._gc_generation_max,
                    )
                )

    def _record(self, record: StallRecord) -> None:
        self.records = [*self.records[-9:], record]
        now = time.monotonic()
        self._logged_at = [t for t in self._logged_at if now - t < 60.0]
        if len(self._logged_at) < self.log_per_minute:
            self._logged_at.append(now)
            log.warning("%s", record.describe(self.service))

    def _watch(self) -> None:
        check_s = WATCHDOG_CHECK_MS / 1000
        while not self._stop.wait(check_s):
            last = self._last_tick
            if self._taken[0] == last or time.monotonic() - last < self.record_s:
                continue
            frame = sys._current_frames().get(self._loop_thread_id)
            if frame is not None:
                self._taken = (last, traceback.format_stack(frame, limit=STACK_FRAMES_MAX))


def install(loop: asyncio.AbstractEventLoop, service: str) -> LoopStallWatch:
    """Watch `loop` (the running one, in its own thread) for the life of the process. The
    environment's `HIGHWATER_LOOP_STALL_RECORD_MS` lowers or raises the record bound (a
    benchmark hunting a 30 ms tail wants 20) and `HIGHWATER_LOOP_STALL_LOG_PER_MINUTE` the lines
    a minute (a benchmark wants every stall of its measured phase, after a busy one)."""
    record_ms = int(os.environ.get(LOOP_STALL_RECORD_ENV, limits.LOOP_STALL_RECORD_MS))
    per_minute = int(os.environ.get(LOOP_STALL_LOG_PER_MINUTE_ENV, STALL_LOG_PER_MINUTE_MAX))
    watch = LoopStallWatch(service, record_ms, per_minute)
    watch.start(loop)
    return watch
