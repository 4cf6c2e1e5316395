"""Set-up of the PySpark Python worker a read task runs in.

A reused worker runs many tasks, and two of its process-wide defaults cost a read more
than the read itself (bench/RESULTS.md, "Spark connector"):

- The cyclic garbage collector. PySpark's daemon runs a full `gc.collect()` after every
  task, which walks every container object in the process: with numba, pyarrow and grpc
  imported that is ~150,000 objects and ~0.1 s per task (py-spy: 39% of a worker's samples
  on a 2M-record read). `gc.freeze()` takes what the worker holds at a task's start out of
  its sight; objects a task creates are still collected as usual.
- glibc's malloc returning memory to the kernel. A read moves 8 MiB Fetch answers through
  several buffers (gRPC's receive, the protobuf field, the decoder's Arrow buffers, the
  Arrow IPC bytes for the JVM). With glibc's defaults each of those comes from a fresh
  mmap (or a heap top trimmed after the last free), so every page is faulted in and zeroed
  again: perf showed the worker spending more time in the kernel (page faults, zeroing)
  than in the decoder. Raising the mmap and trim thresholds lets freed buffers be reused.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import sys

log = logging.getLogger(__name__)

# --- limits -----------------------------------------------------------------------------------
# Allocations below this come from malloc's heaps (and are reused once freed) instead of a
# fresh mmap each. glibc caps the setting at 32 MiB on 64-bit; an 8 MiB Fetch answer and
# everything derived from it are below it.
MALLOC_MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
# Free memory at the top of a heap is given back to the kernel only beyond this. The worker
# holds a few Fetch answers at a time (~50 MiB at the default 8 MiB fetch size), so this
# keeps one read's working set between tasks and gives back anything beyond it.
MALLOC_TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024

# Malloc arenas. gRPC receives on threads it starts and stops as it likes; each new thread
# got an arena of its own whose fresh pages it then faulted in (perf: 85% of those threads'
# time in page faults). With one arena every thread reuses the memory the others freed.
MALLOC_ARENAS_MAX = 1

# mallopt parameter numbers, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

_malloc_tuned = False


def prepare_python_worker() -> None:
    """Called at the start of every read task; cheap after the first call in a process."""
    gc.freeze()
    _tune_malloc()


def _tune_malloc() -> None:
    """Raise glibc malloc's mmap and trim thresholds, once per process; elsewhere a no-op."""
    global _malloc_tuned
    if _malloc_tuned or not sys.platform.startswith("linux"):
        return
    _malloc_tuned = True
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt): keep its defaults
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    for parameter, value in (
        (_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES),
        (_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES),
        (_M_ARENA_MAX, MALLOC_ARENAS_MAX),
    ):
        if mallopt(parameter, value) != 1:
            log.debug("mallopt(%d, %d) refused; keeping malloc's default", parameter, value)
