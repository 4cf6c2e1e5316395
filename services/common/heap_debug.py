"""Where a service's memory goes: heap dumps on SIGUSR1, for finding a leak in a running process.

Off unless the environment names a directory: `HIGHWATER_HEAP_DEBUG_DIR=/tmp/heap highwater broker ...`.
Then each SIGUSR1 writes `<dir>/<service>-<pid>-<n>.txt`:

- the first one starts tracemalloc (unless PYTHONTRACEMALLOC already did) and writes the live
  objects counted by type (gc) and the process's RSS: the baseline;
- every later one writes the same counts, what changed since the previous dump (objects by
  type, and tracemalloc's allocations by source line, largest growth first), and the top
  allocations alive now.

Starting tracemalloc on demand keeps its cost (every allocation traced, about twice the memory
of what is traced) out of a process until someone asks, and the diff between two dumps says
what grew in between, which is what a soak test (bench/soak.py --heap-debug) wants to know.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import time
import tracemalloc
from collections import Counter
from pathlib import Path

log = logging.getLogger("highwater.heap_debug")

HEAP_DEBUG_DIR_ENV = "HIGHWATER_HEAP_DEBUG_DIR"
# Frames kept per traced allocation: enough to see which of our functions called into a library.
TRACEMALLOC_FRAMES = 8
# Lines of each table in a dump: the top of a diff is where a leak shows; the tail is noise.
DUMP_LINES_MAX = 40


def _rss_kib() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(value.split()[0])
    except (OSError, ValueError):
        pass
    return out


def _type_counts() -> Counter[str]:
    # gc.get_objects() lists container objects only (bytes and str are not tracked), and not
    # those gc.freeze() set aside at start-up (settle_heap): what grows later is all there,
    # and what it misses shows in tracemalloc's lines instead.
    return Counter(type(o).__qualname__ for o in gc.get_objects())


class HeapDumper:
    """Writes one dump per call of dump(); keeps the previous counts and snapshot to diff against."""

    def __init__(self, directory: Path, service: str) -> None:
        self.directory = directory
        self.service = service
        self.dumps = 0
        self._counts: Counter[str] | None = None
        self._snapshot: tracemalloc.Snapshot | None = None

    def dump(self) -> Path:
        self.dumps += 1
        path = self.directory / f"{self.service}-{os.getpid()}-{self.dumps}.txt"
        lines = [
            f"# {self.service} pid {os.getpid()} dump {self.dumps} at {time.time():.0f}",
            f"rss_kib {_rss_kib()}",
        ]
        counts = _type_counts()
        lines.append(f"gc_objects {sum(counts.values())}")
        if self._counts is not None:
            grown = counts.copy()
            grown.subtract(self._counts)
            lines.append("## objects by type, change since the previous dump")
            lines += [f"{n:+10d}  {name}" for name, n in grown.most_common(DUMP_LINES_MAX) if n]
        lines.append("## objects by type, now")
        lines += [f"{n:10d}  {name}" for name, n in counts.most_common(DUMP_LINES_MAX)]
        self._counts = counts
        if not tracemalloc.is_tracing():
            tracemalloc.start(TRACEMALLOC_FRAMES)
            # Nearly empty: the next dump's diff is everything allocated since and still alive.
            self._snapshot = tracemalloc.take_snapshot()
            lines.append("## tracemalloc started now: the next dump shows what grew")
        else:
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            traced, peak = tracemalloc.get_traced_memory()
            lines.append(f"tracemalloc_traced_bytes {traced} peak {peak}")
            if self._snapshot is not None:
                lines.append("## allocations by line, change since the previous dump (bytes, blocks)")
                for stat in snapshot.compare_to(self._snapshot, "lineno")[:DUMP_LINES_MAX]:
                    lines.append(f"{stat.size_diff:+12d} {stat.count_diff:+8d}  {stat.traceback}")
                lines.append("## the same by call stack, largest growth first")
                for stat in snapshot.compare_to(self._snapshot, "traceback")[:10]:
                    lines.append(f"{stat.size_diff:+12d} {stat.count_diff:+8d}")
                    lines += [f"      {frame}" for frame in stat.traceback.format()]
            lines.append("## allocations alive now, by line (bytes, blocks)")
            for alive in snapshot.statistics("lineno")[:DUMP_LINES_MAX]:
                lines.append(f"{alive.size:12d} {alive.count:8d}  {alive.traceback}")
            self._snapshot = snapshot
        path.write_text("\n".join(lines) + "\n")
        return path


def install(loop: asyncio.AbstractEventLoop, service: str) -> HeapDumper | None:
    """Dump on SIGUSR1 when HIGHWATER_HEAP_DEBUG_DIR is set; nothing (None) otherwise."""
    directory = os.environ.get(HEAP_DEBUG_DIR_ENV)
    if not directory:
        return None
    dumper = HeapDumper(Path(directory), service)
    dumper.directory.mkdir(parents=True, exist_ok=True)

    def on_signal() -> None:
        try:
            log.info("heap dump written to %s", dumper.dump())
        except OSError as exc:
            log.warning("heap dump to %s failed: %s", dumper.directory, exc)

    loop.add_signal_handler(signal.SIGUSR1, on_signal)
    log.info("heap dumps on SIGUSR1 into %s (%s is set)", directory, HEAP_DEBUG_DIR_ENV)
    return dumper
