"""The broker's page-cache window (limits.LOG_CACHE_WINDOW_BYTES_DEFAULT) on real files.

Which pages of a file the kernel holds is read with mincore(2) on a fresh mapping of it (a
mapping reports the page cache without reading anything in). The file is fsynced before the
append that asks for the drop, so every page asked about is clean and droppable: without
that, a page still being written back would be dropped only by a later step.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from pathlib import Path

import pytest

from services.broker.log.file_storage import FileStorage
from services.common.limits import (
    LOG_CACHE_DROP_STEPS_PER_WINDOW,
    LOG_CACHE_WINDOW_BYTES_MIN,
    LOG_CACHE_WINDOW_OFF,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="mincore(2) and posix_fadvise are Linux's")

WINDOW = LOG_CACHE_WINDOW_BYTES_MIN
STEP = WINDOW // LOG_CACHE_DROP_STEPS_PER_WINDOW
PAGE = mmap.PAGESIZE


def resident_pages(path: Path) -> list[bool]:
    """For each page of the file: is it in the page cache?"""
    size = path.stat().st_size
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    pages = (size + PAGE - 1) // PAGE
    vector = (ctypes.c_ubyte * pages)()
    with path.open("rb") as file, mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY) as mapping:
        start = ctypes.c_char.from_buffer(mapping)
        try:
            if libc.mincore(ctypes.addressof(start), size, vector) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            del start  # the mapping cannot close while a buffer of it is exported
    return [bool(v & 1) for v in vector]


def write_then_step(tmp_path: Path, window: int) -> tuple[Path, int]:
    """Three windows of appends, fsync, one more step of appends: the last asks for the drop."""
    path = tmp_path / "00000000000000000000.log"
    file = FileStorage(cache_window_bytes=window).open(str(path))
    chunk = os.urandom(STEP)
    try:
        for _ in range(3 * WINDOW // STEP):
            file.append(chunk)
        file.fsync()
        file.append(chunk)
        return path, file.size
    finally:
        file.close()


def test_a_log_file_drops_what_lies_one_window_behind_its_end_and_keeps_the_newest_window(
    tmp_path: Path,
) -> None:
    path, size = write_then_step(tmp_path, WINDOW)
    resident = resident_pages(path)
    behind = resident[(size - 2 * WINDOW) // PAGE : (size - WINDOW) // PAGE]
    newest = resident[-(WINDOW // PAGE) :]
    assert not any(behind), f"{sum(behind)} of {len(behind)} pages behind the window still cached"
    assert all(newest), f"{newest.count(False)} of {len(newest)} pages of the newest window were dropped"


def test_with_the_window_off_the_page_cache_is_left_to_the_kernel(tmp_path: Path) -> None:
    path, _ = write_then_step(tmp_path, LOG_CACHE_WINDOW_OFF)
    resident = resident_pages(path)
    assert all(resident), f"{resident.count(False)} of {len(resident)} pages dropped with the window off"


@pytest.mark.parametrize("window", [0, LOG_CACHE_WINDOW_BYTES_MIN - 1, -2])
def test_a_window_below_one_mebibyte_is_refused_naming_the_bounds(window: int) -> None:
    with pytest.raises(ValueError, match="at least 1048576, or -1"):
        FileStorage(cache_window_bytes=window)
