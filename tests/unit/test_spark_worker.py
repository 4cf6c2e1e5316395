"""spark_connector/worker.py: what a read task does to its Python worker process.

The malloc settings are checked by their effect, in fresh processes: glibc's own report
(malloc_info) counts the arenas threads allocated from. Without the setting every new
thread that allocates gets an arena of its own; with it they share what exists.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THREADS = 4
ARENA_REPORT = textwrap.dedent(f"""
    import ctypes, os, sys, tempfile, threading
    if sys.argv[1] == "prepared":
        from spark_connector.worker import prepare_python_worker
        prepare_python_worker()
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    barrier = threading.Barrier({THREADS} + 1)

    def hold():
        block = bytes(1024 * 1024)  # allocated, and held while the other threads allocate too
        barrier.wait()
        barrier.wait()

    threads = [threading.Thread(target=hold) for _ in range({THREADS})]
    for t in threads:
        t.start()
    barrier.wait()
    fd, path = tempfile.mkstemp()
    os.close(fd)
    report = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, report)
    libc.fclose(report)
    barrier.wait()
    for t in threads:
        t.join()
    print(open(path).read().count("<heap nr="))
    os.unlink(path)
""")


def _glibc() -> bool:
    try:
        return hasattr(ctypes.CDLL(None), "malloc_info")
    except OSError:
        return False


def _arenas(mode: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", ARENA_REPORT, mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return int(done.stdout.strip())


@pytest.mark.skipif(not _glibc(), reason="malloc_info and mallopt are glibc's")
def test_a_prepared_worker_keeps_its_threads_in_the_existing_malloc_arenas() -> None:
    plain, prepared = _arenas("plain"), _arenas("prepared")
    assert plain > THREADS, f"without the setting each allocating thread should get an arena: {plain}"
    assert prepared <= 2, f"a prepared worker's threads should share the arenas already there: {prepared}"


def test_preparing_freezes_what_the_worker_holds_and_can_be_repeated() -> None:
    # In a fresh process: preparing changes process-wide state this test process should keep.
    script = (
        "import gc\nfrom spark_connector.worker import prepare_python_worker\n"
        "prepare_python_worker()\nfirst = gc.get_freeze_count()\n"
        "prepare_python_worker()\nprint(first, gc.get_freeze_count())"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    first, second = map(int, done.stdout.split())
    assert first > 0 and second >= first
