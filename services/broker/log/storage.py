"""The storage seam under the partition log: real files, or memory that can crash.

STYLE.md practice 4 (raft's Storage/MemoryStorage): the log's logic runs unchanged on
`FileStorage` (the broker; file_storage.py, the only module of the log that touches files)
and on `MemoryStorage` (unit tests and the deterministic simulation in tests/sim/). The
seam is deliberately small: files addressed by path, appended at their end, read at a
position, truncated, fsynced; plus the few directory operations the log needs and an
atomic whole-file write for checkpoints.

Open files are bounded (issue 17: tiny segments once took brokers to 20,000 open files).
Segment files are opened through the storage's `OpenFileCache`: the active segments'
files stay open, every other handle sits in one LRU of OPEN_SEGMENT_FILES_MAX, closed
when evicted and reopened at its next use. Both sides share that cache, so the
simulation runs the same open/evict/reopen sequence as the broker.

Durability model (what `MemoryStorage.crash()` keeps, and what the log may rely on):
- bytes appended to a file survive a crash only once that file was fsynced after them;
- a file that was never fsynced does not survive a crash at all (its directory entry
  was never made durable);
- `write_atomic` (temp file, fsync, rename, fsync of the directory) is all-or-nothing;
- `mkdir`, `rename`, `delete` are durable at once (FileStorage fsyncs the directory
  after rename; the log never depends on a delete surviving a crash: a segment that
  comes back is below the log start offset checkpoint and is deleted again);
- `write_unsynced`, `rename_unsynced` and `link_unsynced` are not durable until a `sync_all`
  of a directory holding them: a crash before it loses the new file, and undoes the rename
  or the link. Renaming or linking a file whose content is not durable yet is refused
  (after a power cut the new name could hold an empty file), so `write_unsynced` +
  `sync_all` + `rename_unsynced` + `sync_all` is `write_atomic` with its fsyncs shared by
  any number of files (the broker's clean close, log.close_logs, ARCHITECTURE.md section 5).
"""

from __future__ import annotations

import os
import random
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from clients.common.errors import StorageError, check
from services.common.limits import OPEN_SEGMENT_FILES_MAX

Buffer = bytes | bytearray | memoryview

TEMP_SUFFIX = ".tmp"


class StorageFile(Protocol):
    """One open file. Owned by one segment or index; not shared between tasks."""

    @property
    def size(self) -> int: ...

    def append(self, data: Buffer) -> int:
        """Write `data` at the end of the file; return the position it starts at."""
        ...

    def read_at(self, position: int, size: int) -> bytes:
        """Up to `size` bytes from `position` (fewer only at the end of the file)."""
        ...

    def truncate(self, size: int) -> None: ...

    def fsync(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class FileLocation:
    """How another process on this host finds a file: its absolute path and identity.

    `host_id` is the host's boot id; a reader elsewhere (another host, or a container
    that sees other files at the path) tells by it, or by the device and inode of what it
    opens, that the file is not the one meant.
    """

    path: str
    device: int
    inode: int
    host_id: str


class Storage(Protocol):
    """Directory and file operations. Paths are strings; directories are created explicitly."""

    # The bounded set of open segment files of this storage (one storage per broker).
    open_files: OpenFileCache

    def open(self, path: str, *, create: bool = True) -> StorageFile:
        """Open `path` for reading and appending, creating it empty if missing.

        With create=False a missing file is a StorageError: a file reopened after its handle
        was evicted must be the one that was closed, never a new empty one.
        """
        ...

    def exists(self, path: str) -> bool: ...

    def mkdir(self, path: str) -> None:
        """Create a directory and its parents; no error if it exists."""
        ...

    def list_dir(self, path: str) -> list[str]:
        """Names (not paths) of the files in a directory, sorted."""
        ...

    def delete(self, path: str) -> None:
        """Remove a file; no error if it is missing."""
        ...

    def rename(self, source: str, target: str) -> None: ...

    def read_file(self, path: str) -> bytes:
        """The whole content of a small file (checkpoints)."""
        ...

    def write_atomic(self, path: str, data: bytes) -> None:
        """Replace `path` with `data` all-or-nothing: temp file, fsync, rename, directory fsync."""
        ...

    def write_unsynced(self, path: str, data: bytes) -> None:
        """Create (or replace) `path` holding `data`, without fsync: durable after a `sync_all`."""
        ...

    def rename_unsynced(self, source: str, target: str) -> None:
        """Rename `source` over `target` without fsync: durable after the next `sync_all`.

        Only once a `sync_all` made `source`'s content durable: a rename of unsynced data can
        leave an empty `target` after a power cut.
        """
        ...

    def link_unsynced(self, source: str, target: str) -> None:
        """Give `source`'s file a second name `target` (a hard link: no new file), without fsync.

        Durable after the next `sync_all`; only once a `sync_all` made `source` durable. A
        `target` that exists already is left as it is. Both names then share one content:
        only for files that are never written again (checkpoint files are replaced, never
        rewritten in place).
        """
        ...

    def sync_all(self, directory: str) -> None:
        """Make every write, file, rename and delete so far under `directory` durable at once.

        One barrier for many files instead of an fsync per file. Raises StorageError when the
        file system reports that a write may not have reached the disk.
        """
        ...

    def delete_dir(self, path: str) -> None:
        """Remove a directory and everything in it."""
        ...

    def file_location(self, path: str) -> FileLocation | None:
        """Where another process on this host can read `path` itself, or None: it cannot."""
        ...


# ---------------------------------------------------------------------------------------
# The bound on open files, shared by both sides


class OpenFileCache:
    """The open segment files of one storage: pinned ones, plus an LRU of at most `max_open`.

    The active segment's files are pinned: appended to on every produce, they keep their
    handles, outside the bound (one active segment per replica, and replicas per broker
    are bounded by REPLICAS_PER_BROKER_MAX). Other segments' files are unpinned: their
    handles sit in the LRU; past `max_open` the least recently used one is closed, and it
    is reopened (never created) when next used. A consumer reading an old segment from
    start to end keeps that segment's files at the recent end of the LRU, so it reopens
    them once per segment, not once per read.

    Closing is safe because a `CachedFile` fetches its handle at the start of each
    operation and drops it at the end, and eviction happens only while another file is
    being fetched: no operation ever holds a handle that another one closes. That needs
    one thread: one event loop owns every log of a broker (ARCHITECTURE.md section 6),
    and no Log call awaits. Not thread-safe.
    """

    def __init__(self, storage: Storage, max_open: int = OPEN_SEGMENT_FILES_MAX) -> None:
        check(max_open >= 1, "open file cache of %d files: at least one is needed", max_open)
        self._storage = storage
        self.max_open = max_open
        self._pinned: set[CachedFile] = set()
        # Unpinned files that hold a handle, least recently used first.
        self._lru: OrderedDict[CachedFile, None] = OrderedDict()
        # Handles opened again after an eviction: for tests and benchmarks.
        self.reopen_count = 0
        self._crashed = False

    @property
    def open_count(self) -> int:
        """Handles open now (pinned + cached): what the open-files limit sees of the logs."""
        return len(self._pinned) + len(self._lru)

    def open(self, path: str, *, pinned: bool) -> CachedFile:
        """Open (creating if missing) a segment file through the cache."""
        file = CachedFile(self, path, self._storage.open(path))
        if pinned:
            self._pinned.add(file)
        else:
            self._admit(file)
        return file

    def pin(self, file: CachedFile) -> None:
        """Keep the file's handle open until unpinned or closed (it became the active segment's)."""
        if file in self._pinned:
            return
        file.handle()  # reopens it if it was evicted
        del self._lru[file]
        self._pinned.add(file)

    def unpin(self, file: CachedFile) -> None:
        """Let the file's handle be evicted (its segment is no longer the active one)."""
        if file in self._pinned:
            self._pinned.remove(file)
            self._admit(file)

    def reopen(self, file: CachedFile, path: str) -> StorageFile:
        """A new handle for an evicted file, admitted to the LRU as the most recent."""
        check(not self._crashed, "segment file %s used after the process that opened it crashed", path)
        handle = self._storage.open(path, create=False)
        self.reopen_count += 1
        self._admit(file)
        return handle

    def touch(self, file: CachedFile) -> None:
        if file in self._lru:
            self._lru.move_to_end(file)

    def forget(self, file: CachedFile) -> None:
        """The file was closed by its owner."""
        self._pinned.discard(file)
        self._lru.pop(file, None)

    def crash(self) -> None:
        """The process died (MemoryStorage.crash): its handles are gone, and so are their users.

        Open files are closed for good and evicted ones may not be reopened, so a Log kept
        by mistake across a crash fails at its next use instead of reading a disk it no
        longer matches. The next incarnation opens its files through a new cache.
        """
        self._crashed = True
        for file in [*self._pinned, *self._lru]:
            file.close()

    def _admit(self, file: CachedFile) -> None:
        """Add `file` as the most recent; close the least recent beyond the bound (never `file`)."""
        self._lru[file] = None
        while len(self._lru) > self.max_open:
            victim, _ = self._lru.popitem(last=False)
            victim.release()


class CachedFile:
    """A segment file opened through an `OpenFileCache`: a StorageFile whose handle may be
    closed between operations and is reopened on demand.

    The size is kept here, so reading it opens nothing (retention sums every segment's size).
    A file deleted, renamed or resized behind an evicted handle is a StorageError at its
    next use, never recreated empty: a segment closes its files before deleting them, and
    nothing else writes to them. Owned by one segment or index, as any StorageFile.
    """

    __slots__ = ("_cache", "_closed", "_handle", "_path", "_size")

    def __init__(self, cache: OpenFileCache, path: str, handle: StorageFile) -> None:
        self._cache = cache
        self._path = path
        self._handle: StorageFile | None = handle
        self._size = handle.size
        self._closed = False

    @property
    def size(self) -> int:
        return self._size

    @property
    def path(self) -> str:
        return self._path

    @property
    def is_open(self) -> bool:
        """Whether a handle is held now (False once evicted or closed)."""
        return self._handle is not None

    def handle(self) -> StorageFile:
        """The open handle, reopening the file if it was evicted. Use it at once, never keep it."""
        handle = self._handle
        if handle is not None:
            self._cache.touch(self)
            return handle
        check(not self._closed, "segment file %s used after it was closed", self._path)
        handle = self._cache.reopen(self, self._path)
        if handle.size != self._size:
            # Only its segment writes to it: anything else changed the file behind our back.
            self._cache.forget(self)
            handle.close()
            raise StorageError(f"{self._path} has {handle.size} bytes on reopening, {self._size} expected")
        self._handle = handle
        return handle

    def pin(self) -> None:
        self._cache.pin(self)

    def unpin(self) -> None:
        self._cache.unpin(self)

    def append(self, data: Buffer) -> int:
        handle = self.handle()
        try:
            return handle.append(data)
        finally:
            self._size = handle.size  # a failed write may still have written a part

    def read_at(self, position: int, size: int) -> bytes:
        return self.handle().read_at(position, size)

    def truncate(self, size: int) -> None:
        handle = self.handle()
        handle.truncate(size)
        self._size = handle.size

    def fsync(self) -> None:
        # A reopened handle flushes what an evicted one wrote: dirty pages belong to the
        # file, not to a descriptor (and MemoryStorage keeps durability per inode).
        self.handle().fsync()

    def release(self) -> None:
        """Close the handle, keep the file usable (the cache evicted it)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.close()

    def close(self) -> None:
        """Close for good; idempotent."""
        if not self._closed:
            self._closed = True
            self._cache.forget(self)
            self.release()


# ---------------------------------------------------------------------------------------
# Memory, with crashes


class _MemoryInode:
    """File content plus the content as of the last fsync (None: never fsynced)."""

    __slots__ = ("data", "durable")

    def __init__(self) -> None:
        self.data = bytearray()
        self.durable: bytes | None = None


class _MemoryFile:
    __slots__ = ("_inode", "_path", "_storage")

    def __init__(self, storage: MemoryStorage, path: str, inode: _MemoryInode) -> None:
        self._storage = storage
        self._path = path
        self._inode = inode

    @property
    def size(self) -> int:
        return len(self._inode.data)

    def append(self, data: Buffer) -> int:
        self._storage.check_writable(self._path)
        start = len(self._inode.data)
        self._inode.data += data
        return start

    def read_at(self, position: int, size: int) -> bytes:
        return bytes(self._inode.data[position : position + max(0, size)])

    def truncate(self, size: int) -> None:
        self._storage.check_writable(self._path)
        check(
            0 <= size <= len(self._inode.data),
            "truncate %s to %d bytes: file has %d",
            self._path,
            size,
            len(self._inode.data),
        )
        del self._inode.data[size:]

    def fsync(self) -> None:
        self._inode.durable = bytes(self._inode.data)
        self._storage.fsync_count += 1

    def close(self) -> None:
        pass


class MemoryStorage:
    """In-memory storage for tests and the simulation; `crash()` keeps only what was fsynced.

    Files live in a dict keyed by normalised path. Handles stay bound to their inode,
    as on POSIX (a deleted file's open handle still reads its bytes). After `crash()`
    the old Log must be dropped and a new one opened, as after a process restart.
    """

    def __init__(self, *, open_files_max: int = OPEN_SEGMENT_FILES_MAX) -> None:
        self._files: dict[str, _MemoryInode] = {}
        self._dirs: set[str] = set()
        self.fsync_count = 0
        # Set by tests to make writes fail with StorageError (a failed disk).
        self.fail_writes = False
        # The same bound as FileStorage's: evictions and reopens happen in the simulation too.
        self.open_files = OpenFileCache(self, open_files_max)
        # rename_unsynced/link_unsynced names not yet made durable by a sync_all: target ->
        # (source of a rename, None for a link; the inode the name replaced or None); a crash
        # undoes them, newest first.
        self._unsynced_renames: dict[str, tuple[str | None, _MemoryInode | None]] = {}
        self.sync_all_count = 0

    @staticmethod
    def _key(path: str | Path) -> str:
        return os.path.normpath(str(path))

    def check_writable(self, path: str) -> None:
        if self.fail_writes:
            raise StorageError(f"write to {path} failed: simulated disk failure")

    def open(self, path: str, *, create: bool = True) -> StorageFile:
        key = self._key(path)
        check(os.path.dirname(key) in self._dirs, "open %s: directory does not exist", key)
        inode = self._files.get(key)
        if inode is None:
            if not create:
                raise StorageError(f"cannot open {key}: no such file")
            self.check_writable(key)
            inode = self._files[key] = _MemoryInode()
        return _MemoryFile(self, key, inode)

    def exists(self, path: str) -> bool:
        key = self._key(path)
        return key in self._files or key in self._dirs

    def mkdir(self, path: str) -> None:
        key = self._key(path)
        while key not in self._dirs and key not in ("/", "."):
            self._dirs.add(key)
            key = os.path.dirname(key) or "."

    def list_dir(self, path: str) -> list[str]:
        key = self._key(path)
        return sorted(os.path.basename(name) for name in self._files if os.path.dirname(name) == key)

    def delete(self, path: str) -> None:
        key = self._key(path)
        self._files.pop(key, None)
        self._unsynced_renames.pop(key, None)

    def rename(self, source: str, target: str) -> None:
        self._files[self._key(target)] = self._files.pop(self._key(source))
        # Durable at once (FileStorage fsyncs the directory): nothing left to undo there.
        self._unsynced_renames.pop(self._key(source), None)
        self._unsynced_renames.pop(self._key(target), None)

    def read_file(self, path: str) -> bytes:
        key = self._key(path)
        inode = self._files.get(key)
        if inode is None:
            raise StorageError(f"read of {key} failed: no such file")
        return bytes(inode.data)

    def write_atomic(self, path: str, data: bytes) -> None:
        self.check_writable(path)
        inode = _MemoryInode()
        inode.data = bytearray(data)
        inode.durable = bytes(data)
        key = self._key(path)
        self._files[key] = inode
        self._unsynced_renames.pop(key, None)
        self.fsync_count += 1

    def write_unsynced(self, path: str, data: bytes) -> None:
        key = self._key(path)
        check(os.path.dirname(key) in self._dirs, "write %s: directory does not exist", key)
        self.check_writable(key)
        inode = _MemoryInode()  # durable: None, so a crash before a sync_all loses it
        inode.data = bytearray(data)
        self._files[key] = inode
        self._unsynced_renames.pop(key, None)

    def _synced_source(self, verb: str, source_key: str, target_key: str) -> _MemoryInode:
        """The inode a rename or link takes: it must exist and its content be durable already."""
        inode = self._files.get(source_key)
        if inode is None:
            raise StorageError(f"{verb} of {source_key} failed: no such file")
        check(
            inode.durable is not None and inode.durable == inode.data,
            "%s of %s to %s before a sync_all made its content durable",
            verb,
            source_key,
            target_key,
        )
        self.check_writable(target_key)
        return inode

    def rename_unsynced(self, source: str, target: str) -> None:
        source_key, target_key = self._key(source), self._key(target)
        self._synced_source("rename", source_key, target_key)
        check(source_key not in self._unsynced_renames, "rename of %s: renamed twice unsynced", source_key)
        if target_key not in self._unsynced_renames:
            self._unsynced_renames[target_key] = (source_key, self._files.get(target_key))
        self._files[target_key] = self._files.pop(source_key)

    def link_unsynced(self, source: str, target: str) -> None:
        source_key, target_key = self._key(source), self._key(target)
        inode = self._synced_source("link", source_key, target_key)
        if target_key in self._files:
            return  # as link(2) refuses it: the name stays as it is
        self._unsynced_renames[target_key] = (None, None)
        self._files[target_key] = inode

    def sync_all(self, directory: str) -> None:
        self.check_writable(directory)
        prefix = self._key(directory) + os.sep
        for key, inode in self._files.items():
            if key.startswith(prefix):
                inode.durable = bytes(inode.data)
        for target, (source, _) in list(self._unsynced_renames.items()):
            if target.startswith(prefix) and (source is None or source.startswith(prefix)):
                del self._unsynced_renames[target]
        self.sync_all_count += 1

    def delete_dir(self, path: str) -> None:
        key = self._key(path)
        prefix = key + os.sep
        for name in [name for name in self._files if name.startswith(prefix)]:
            del self._files[name]
            self._unsynced_renames.pop(name, None)
        self._dirs = {name for name in self._dirs if name != key and not name.startswith(prefix)}

    def file_location(self, path: str) -> FileLocation | None:
        return None  # memory is no other process's to read: readers get the bytes

    # --- test helpers -------------------------------------------------------------------

    def crash(self, rng: random.Random | None = None) -> None:
        """Lose everything not fsynced, per file, as a power cut would.

        With `rng`, a file whose unsynced bytes extend its durable content keeps a random
        prefix of them (a torn write: the page cache had written back part of the tail), and
        each unsynced rename or link may have become durable or not.
        The process's open files die with it: logs open before the crash must not be used.
        """
        self.open_files.crash()
        self.open_files = OpenFileCache(self, self.open_files.max_open)
        # Renames and links no sync_all made durable are lost, or with `rng` each one may
        # have reached the disk anyway, in any combination (no order among them is promised).
        for target, (source, replaced) in reversed(list(self._unsynced_renames.items())):
            if rng is not None and rng.random() < 0.5:
                continue
            moved = self._files.pop(target, None)
            if moved is not None and source is not None:
                self._files[source] = moved
            if replaced is not None:
                self._files[target] = replaced
        self._unsynced_renames.clear()
        for key in list(self._files):
            inode = self._files[key]
            if inode.durable is None:
                del self._files[key]
                continue
            durable = inode.durable
            kept = bytearray(durable)
            data = inode.data
            if rng is not None and len(data) > len(durable) and data[: len(durable)] == durable:
                kept += data[len(durable) : len(durable) + rng.randint(0, len(data) - len(durable))]
            inode.data = kept
            # What reached the platter before the cut is durable from now on.
            inode.durable = bytes(kept)
