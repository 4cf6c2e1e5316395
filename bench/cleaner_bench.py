"""The log cleaner's throughput, memory and event-loop stall on one compacted log (issue 39).

Builds a log on real files in a temporary directory (`--records` updates of `--value-bytes`
values over `--keys` keys, `--batch` records a batch, random keys so most batches lose some
records), then runs the broker's LogCleaner (services/broker/log_cleaner.py) over it unthrottled
(no I/O limit; no CPU share limit unless --cpu-max-share) until it has nothing left to do, and
prints:

- MB/s cleaned: the log's bytes before cleaning / the wall time of the passes, and per CPU
  second (wall time depends on what else the machine runs; CPU time much less);
- the bytes read (map + filter) and written, the records kept;
- the peak resident memory the passes added (VmHWM reset before them) and the offset map's
  entries with their estimated size (LOG_CLEANER_OFFSET_MAP_ENTRY_BYTES each);
- the event loop's lag during the passes, from a 5 ms ticker (how late each tick woke): the
  longest stall, p50 and p99 over all ticks, and how many ticks were late by over 10 ms. Produce
  and fetch wait this long behind the cleaner's work on the loop (its swap's commit).

    .venv/bin/python bench/cleaner_bench.py [--records 1000000] [--keys 100000] [--value-bytes 100]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/cleaner_bench.py` from anywhere

from clients.common.records import Record, encode_batch
from services.broker.log import Log, LogConfig
from services.broker.log.file_storage import FileStorage
from services.broker.log_cleaner import CleanerConfig, LogCleaner
from services.broker.partition import Role
from services.broker.producer_state import ProducerStateManager
from services.common import limits

TICK_S = 0.005
# A tick this late counts as a stall a produce or fetch would feel.
LATE_S = 0.010


@dataclass
class _Replica:
    """What the cleaner reads of a partition (services/broker/partition.py's fields)."""

    log: Log
    high_watermark: int
    role: Role = Role.LEADER
    producers: ProducerStateManager = field(default_factory=ProducerStateManager)


def _status_kib(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak_rss() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux: reset VmHWM to the current RSS
    except OSError:
        pass


def build_log(directory: Path, args: argparse.Namespace) -> Log:
    config = LogConfig(cleanup_policy="compact", segment_bytes=args.segment_bytes, retention_ms=-1)
    log = Log.open(directory, config, storage=FileStorage(), now_ms=1_000)
    rng = random.Random(39)
    value = b"x" * args.value_bytes
    now = int(time.time() * 1000) - 60_000
    for n in range(args.records // args.batch):
        records = [
            Record(b"key-%08d" % rng.randrange(args.keys), value, [], now + n) for _ in range(args.batch)
        ]
        log.append_as_leader(
            encode_batch(records, compression=args.compression), leader_epoch=0, now_ms=now + n
        )
    log.roll(now + args.records)
    log.flush(now + args.records)
    return log


async def clean(log: Log, args: argparse.Namespace) -> None:
    replica = _Replica(log, log.log_end_offset)
    cleaner = LogCleaner(
        CleanerConfig(
            io_max_bytes_per_second=0,
            dedupe_buffer_bytes=args.dedupe_buffer_bytes,
            cpu_max_share=args.cpu_max_share,
            # The cleaner's own rate at that share: not lowered by the machine's load.
            cpu_share_under_pressure=args.cpu_max_share,
        ),
        lambda: {("bench", 0): replica},  # type: ignore[dict-item]  # a partition's fields the cleaner reads
    )
    size_before = sum(view.size_bytes for view in log.segments_for_cleaning())
    lags_s: list[float] = []
    # (start, end) of each late tick's wait, on the loop's clock (time.monotonic).
    late_ticks: list[tuple[float, float]] = []
    done = False

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        while not done:
            before = loop.time()
            await asyncio.sleep(TICK_S)
            after = loop.time()
            lags_s.append(max(0.0, after - before - TICK_S))
            if lags_s[-1] > LATE_S:
                late_ticks.append((before, after))

    swaps = _time_swaps_on_the_loop()
    ticking = asyncio.create_task(ticker())
    rss_before = _status_kib("VmRSS")
    _reset_peak_rss()
    started = time.monotonic()
    cpu_started = time.process_time()
    passes = 0
    while await cleaner.clean_once():
        passes += 1
    seconds = time.monotonic() - started
    cpu_s = time.process_time() - cpu_started
    peak = _status_kib("VmHWM")
    done = True
    await ticking
    size_after = sum(view.size_bytes for view in log.segments_for_cleaning())
    read = sum(p.map_bytes_read + p.stats.bytes_read for p in cleaner.passes)
    written = sum(p.stats.bytes_written for p in cleaner.passes)
    kept = cleaner.passes[-1].stats.records_kept if cleaner.passes else 0
    entries_max = cleaner._offset_map.capacity_entries
    print(
        f"log {size_before / 1e6:.1f} MB ({args.records} records, {args.keys} keys, "
        f"{args.value_bytes} B values, {args.compression}) -> {size_after / 1e6:.1f} MB "
        f"in {passes} pass(es), {seconds:.2f} s"
    )
    print(
        f"cleaned {size_before / 1e6 / seconds:.1f} MB/s of log; "
        f"I/O read {read / 1e6:.1f} MB, wrote {written / 1e6:.1f} MB"
    )
    print(
        f"CPU {cpu_s:.2f} s (the process, loop included): {size_before / 1e6 / max(cpu_s, 1e-9):.1f} MB "
        f"of log a CPU second; CPU share limit {args.cpu_max_share or 'none'}"
    )
    print(f"records kept in the last pass: {kept}")
    print(
        f"memory: peak RSS +{(peak - rss_before) / 1024:.1f} MiB over {rss_before / 1024:.1f} MiB; "
        "offset map up to "
        f"{min(args.keys, entries_max)} entries x {limits.LOG_CLEANER_OFFSET_MAP_ENTRY_BYTES} B "
        f"(dedupe buffer {args.dedupe_buffer_bytes / 2**20:.0f} MiB = {entries_max} entries)"
    )
    lags_s.sort()
    print(
        f"event loop: longest stall {_quantile_ms(lags_s, 1.0):.1f} ms during the passes; lag p50 "
        f"{_quantile_ms(lags_s, 0.5):.2f} ms, p99 {_quantile_ms(lags_s, 0.99):.2f} ms over "
        f"{len(lags_s)} ticks, {sum(lag > LATE_S for lag in lags_s)} late by over "
        f"{LATE_S * 1000:.0f} ms (ticker every {TICK_S * 1000:.0f} ms)"
    )

    swaps_s = [end - start for start, end in swaps]
    during_swap = [t for t in late_ticks if any(s < t[1] and t[0] < e for s, e in swaps)]
    print(
        f"swap work on the loop: {len(swaps)} swap(s), longest {max(swaps_s, default=0) * 1000:.1f} ms, "
        f"total {sum(swaps_s) * 1000:.1f} ms; {len(during_swap)} of the {len(late_ticks)} late ticks "
        "waited across one"
    )


def _time_swaps_on_the_loop() -> list[tuple[float, float]]:
    """(start, end), on time.monotonic, of each call of the swap's part that runs on the loop:
    Log.commit_swap, or the whole Log.replace_segments where the cleaner calls that (before the
    swap was split into a prepare on the cleaner's thread and a commit on the loop)."""
    name = "commit_swap" if hasattr(Log, "commit_swap") else "replace_segments"
    original = getattr(Log, name)
    intervals: list[tuple[float, float]] = []

    def timed(self: Log, *args: object, **kwargs: object) -> object:
        started = time.monotonic()
        try:
            return original(self, *args, **kwargs)
        finally:
            intervals.append((started, time.monotonic()))

    setattr(Log, name, timed)
    return intervals


def _quantile_ms(sorted_s: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of sorted seconds, in ms; 0 for no samples."""
    if not sorted_s:
        return 0.0
    return sorted_s[min(len(sorted_s) - 1, int(q * len(sorted_s)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--compression", default="none")
    parser.add_argument("--segment-bytes", type=int, default=16 * 2**20)
    parser.add_argument(
        "--dedupe-buffer-bytes", type=int, default=limits.LOG_CLEANER_DEDUPE_BUFFER_BYTES_DEFAULT
    )
    parser.add_argument(
        "--cpu-max-share",
        type=float,
        default=0.0,
        help="the cleaner's --log-cleaner-cpu-max-share (default 0: no limit, its full speed; the "
        f"broker's default is {limits.LOG_CLEANER_CPU_MAX_SHARE_DEFAULT})",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cleaner-bench-") as tmp:
        log = build_log(Path(tmp) / "bench-0", args)
        try:
            asyncio.run(clean(log, args))
        finally:
            log.close()


if __name__ == "__main__":
    main()
