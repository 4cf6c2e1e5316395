"""The broker's storage: real files under the `Storage` seam of storage.py.

The only module of the log that touches the file system (os.pread/os.pwrite, fsync,
syncfs, atomic renames); everything else in services/broker/log/ runs unchanged on MemoryStorage
in the unit tests and the deterministic simulation. Only the broker's drivers
(replica_manager) and tools import it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
import shutil
import sys
from collections.abc import Callable

from clients.common.errors import StorageError, check
from clients.common.transport.host import host_id
from services.common.limits import (
    LOG_CACHE_DROP_STEPS_PER_WINDOW,
    LOG_CACHE_WINDOW_BYTES_MIN,
    LOG_CACHE_WINDOW_OFF,
    OPEN_SEGMENT_FILES_MAX,
)

from .storage import TEMP_SUFFIX, Buffer, FileLocation, OpenFileCache, StorageFile

log = logging.getLogger("highwater.broker.storage")
# posix_fadvise exists on Linux and most Unixes; elsewhere the page cache is the kernel's alone.
_CAN_DROP_CACHE = hasattr(os, "posix_fadvise")


class _RealFile:
    """A file descriptor with a tracked size; writes use pwrite at that size (no seek state).

    With a cache window (limits.LOG_CACHE_WINDOW_BYTES_DEFAULT), every window/16 bytes appended
    the file asks the kernel to write back and drop the window of bytes that lies one window
    behind its end (posix_fadvise DONTNEED: it starts the write-back of dirty pages and drops the
    clean ones; a page still being written is dropped by a later call).
    """

    __slots__ = ("_cache_asked_at", "_cache_step", "_cache_window", "_fd", "_path", "_size")

    # Descriptors open in this process, for the broker's open-segment-files gauge.
    open_count = 0

    def __init__(self, path: str, *, create: bool, cache_window_bytes: int = LOG_CACHE_WINDOW_OFF) -> None:
        self._path = path
        self._fd = -1
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | (os.O_CREAT if create else 0)
        try:
            self._fd = os.open(path, flags, 0o644)
            _RealFile.open_count += 1
            self._size = os.fstat(self._fd).st_size
        except OSError as error:
            self.close()
            raise StorageError(f"cannot open {path}: {error}") from error
        self._cache_window = cache_window_bytes if _CAN_DROP_CACHE else LOG_CACHE_WINDOW_OFF
        self._cache_step = max(cache_window_bytes // LOG_CACHE_DROP_STEPS_PER_WINDOW, 1)
        self._cache_asked_at = self._size

    @property
    def size(self) -> int:
        return self._size

    def append(self, data: Buffer) -> int:
        start = self._size
        view = memoryview(data).cast("B")
        written = 0
        try:
            while written < len(view):
                written += os.pwrite(self._fd, view[written:], start + written)
        except OSError as error:
            raise StorageError(f"write to {self._path} at byte {start + written} failed: {error}") from error
        finally:
            self._size = start + written
        window_on = self._cache_window != LOG_CACHE_WINDOW_OFF
        if window_on and self._size - self._cache_asked_at >= self._cache_step:
            self._drop_cache_behind_window()
        return start

    def _drop_cache_behind_window(self) -> None:
        self._cache_asked_at = self._size
        end = self._size - self._cache_window
        if end <= 0:
            return
        start = max(0, end - self._cache_window)
        try:
            os.posix_fadvise(self._fd, start, end - start, os.POSIX_FADV_DONTNEED)
        except OSError as error:
            # Only a hint: the file is still written and read correctly without it.
            log.warning(
                "page-cache hint on %s failed (%s); leaving its cache to the kernel", self._path, error
            )
            self._cache_window = LOG_CACHE_WINDOW_OFF

    def read_at(self, position: int, size: int) -> bytes:
        size = max(0, min(size, self._size - position))
        try:
            data = os.pread(self._fd, size, position)
            if len(data) == size:
                return data
            # A short read happens only for very large sizes (Linux caps one read at ~2 GiB).
            parts = [data]
            got = len(data)
            while got < size:
                more = os.pread(self._fd, size - got, position + got)
                if not more:
                    break
                parts.append(more)
                got += len(more)
            return b"".join(parts)
        except OSError as error:
            raise StorageError(
                f"read of {size} bytes from {self._path} at byte {position} failed: {error}"
            ) from error

    def truncate(self, size: int) -> None:
        check(0 <= size <= self._size, "truncate %s to %d bytes: file has %d", self._path, size, self._size)
        try:
            os.ftruncate(self._fd, size)
        except OSError as error:
            raise StorageError(f"truncate of {self._path} to {size} bytes failed: {error}") from error
        self._size = size
        self._cache_asked_at = min(self._cache_asked_at, size)

    def fsync(self) -> None:
        try:
            os.fsync(self._fd)
        except OSError as error:
            raise StorageError(f"fsync of {self._path} failed: {error}") from error

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            _RealFile.open_count -= 1


def open_real_file_count() -> int:
    """Segment files open in this process through every FileStorage (the broker's gauge)."""
    return _RealFile.open_count


class FileStorage:
    """The broker's storage: real files with os.pread/os.pwrite, no buffering of our own.

    One per broker, so `open_files` bounds the handles of all its replicas together.
    """

    def __init__(
        self,
        *,
        open_files_max: int = OPEN_SEGMENT_FILES_MAX,
        use_syncfs: bool = True,
        cache_window_bytes: int = LOG_CACHE_WINDOW_OFF,
    ) -> None:
        if cache_window_bytes != LOG_CACHE_WINDOW_OFF and cache_window_bytes < LOG_CACHE_WINDOW_BYTES_MIN:
            raise ValueError(
                f"cache_window_bytes {cache_window_bytes}: give at least {LOG_CACHE_WINDOW_BYTES_MIN}, "
                f"or {LOG_CACHE_WINDOW_OFF} to leave the page cache to the kernel"
            )
        self.cache_window_bytes = cache_window_bytes
        self.open_files = OpenFileCache(self, open_files_max)
        self._host_id = host_id()
        # sync_all: syncfs(2) where it reports write errors, else an fsync of every file.
        self._syncfs = _syncfs_function() if use_syncfs else None

    def open(self, path: str, *, create: bool = True) -> StorageFile:
        return _RealFile(path, create=create, cache_window_bytes=self.cache_window_bytes)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def mkdir(self, path: str) -> None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as error:
            raise StorageError(f"cannot create the directory {path}: {error}") from error
        if self._syncfs is not None:
            self._file_system_fd(path)

    def list_dir(self, path: str) -> list[str]:
        # A StorageError as every other call here: a raw OSError (EMFILE at the open-files
        # limit) escaped LeaderAndIsr as an unexpected exception, a gRPC UNKNOWN, not
        # STORAGE_ERROR for the partition.
        try:
            with os.scandir(path) as entries:
                return sorted(entry.name for entry in entries if entry.is_file())
        except OSError as error:
            raise StorageError(f"cannot list the directory {path}: {error}") from error

    def delete(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target)
        _fsync_dir(os.path.dirname(target) or ".")

    def read_file(self, path: str) -> bytes:
        with open(path, "rb") as file:
            return file.read()

    def write_atomic(self, path: str, data: bytes) -> None:
        temp = path + TEMP_SUFFIX
        try:
            _write_new(temp, data, fsync=True)
            os.replace(temp, path)
            _fsync_dir(os.path.dirname(path) or ".")
        except OSError as error:
            raise StorageError(f"atomic write of {path} failed: {error}") from error

    def write_unsynced(self, path: str, data: bytes) -> None:
        try:
            _write_new(path, data, fsync=False)
        except OSError as error:
            raise StorageError(f"write of {path} failed: {error}") from error

    def rename_unsynced(self, source: str, target: str) -> None:
        try:
            os.replace(source, target)
        except OSError as error:
            raise StorageError(f"rename of {source} to {target} failed: {error}") from error

    def link_unsynced(self, source: str, target: str) -> None:
        try:
            os.link(source, target)
        except FileExistsError:
            pass  # the name exists already: left as it is (the Storage contract)
        except OSError as error:
            raise StorageError(f"link of {source} to {target} failed: {error}") from error

    def sync_all(self, directory: str) -> None:
        """syncfs(2) of the file system holding `directory`: one barrier for every file there.

        Chosen over an fsync per file for the broker's clean close (ARCHITECTURE.md section 5):
        1,000 partitions cost ~11,000 fsyncs (~1.5 s) one by one. It also writes back other
        programs' dirty data on the same file system, which a dedicated data disk does not
        have. Without a syncfs that reports errors (Linux before 5.8, other systems) every
        file and directory under `directory` is fsynced instead: slow, but as safe.
        """
        try:
            if self._syncfs is None:
                _fsync_tree(directory)
                return
            fd = self._file_system_fd(directory)
            if self._syncfs(fd) != 0:
                error = ctypes.get_errno()
                raise OSError(error, os.strerror(error))
        except OSError as error:
            raise StorageError(f"sync of the file system of {directory} failed: {error}") from error

    def _file_system_fd(self, directory: str) -> int:
        """A descriptor of the file system holding `directory`: of its mount point where readable,
        so it pins no data directory (which stays free to be removed) and counts against none."""
        device = os.stat(directory).st_dev
        fd = _FILE_SYSTEM_FDS.get(device)
        if fd is None:
            flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
            try:
                fd = os.open(_mount_point(directory), flags)
            except OSError:
                fd = os.open(directory, flags)
            _FILE_SYSTEM_FDS[device] = fd
        return fd

    def delete_dir(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def file_location(self, path: str) -> FileLocation | None:
        if not self._host_id:
            return None  # no boot id to tell hosts apart: no local reads
        try:
            stat = os.stat(path)
        except OSError:
            return None
        return FileLocation(os.path.abspath(path), stat.st_dev, stat.st_ino, self._host_id)


# One descriptor per file system that a FileStorage of this process made a directory on,
# opened at the first mkdir there (the broker's start) and kept: syncfs reports the write
# errors of the file system since *its descriptor* was opened, so a late one would miss
# earlier errors. Per process, not per FileStorage, so tools and tests making many leak none.
_FILE_SYSTEM_FDS: dict[int, int] = {}

# syncfs(2) reports write-back errors (those since the descriptor was opened) from Linux 5.8
# on; before, it returned 0 whatever happened, which would hide a failed write.
_SYNCFS_REPORTS_ERRORS_SINCE = (5, 8)


@functools.cache
def _syncfs_function() -> Callable[[int], int] | None:
    """libc's syncfs where it reports write errors, else None (looked up once per process)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        major, minor = (int(part) for part in platform.release().split(".")[:2])
    except ValueError:
        return None
    if (major, minor) < _SYNCFS_REPORTS_ERRORS_SINCE:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: libc's among them
        function = libc.syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    syncfs: Callable[[int], int] = function
    return syncfs


def _mount_point(path: str) -> str:
    path = os.path.realpath(path)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
    return path


def _write_new(path: str, data: bytes, *, fsync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(directory: str) -> None:
    """fsync every file and directory under `directory`, the directories after their files."""
    for root, _, names in os.walk(directory, topdown=False):
        for name in names:
            fd = os.open(os.path.join(root, name), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(root)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
