"""A Storage that hands every call to another and reports each one that changes the disk first.

The crash tests inject a process's death through it (tests/unit/test_log_swap.py,
tests/sim/test_cleaner_sim.py): `step(what)` runs before every mutating call (creating,
appending, truncating, fsyncing, renaming, deleting, writing a file) and may raise; reads only
report their size to `read_bytes`. Subclasses decide what a step does and keep their own
OpenFileCache in `open_files` (the Log reads through it).
"""

from __future__ import annotations

from clients.common.record_batch import Buffer
from services.broker.log.storage import FileLocation, OpenFileCache, Storage, StorageFile


class StepFile:
    """A file of a StepStorage: appends, truncations and fsyncs are steps."""

    def __init__(self, storage: StepStorage, inner: StorageFile, path: str) -> None:
        self._storage = storage
        self._inner = inner
        self._path = path

    @property
    def size(self) -> int:
        return self._inner.size

    def append(self, data: Buffer) -> int:
        self._storage.step(f"append {self._path}")
        return self._inner.append(data)

    def read_at(self, position: int, size: int) -> bytes:
        data = self._inner.read_at(position, size)
        self._storage.read_bytes(len(data))
        return data

    def truncate(self, size: int) -> None:
        self._storage.step(f"truncate {self._path}")
        self._inner.truncate(size)

    def fsync(self) -> None:
        self._storage.step(f"fsync {self._path}")
        self._inner.fsync()

    def close(self) -> None:
        self._inner.close()


class StepStorage:
    """Every Storage call of `inner`, each mutating one after `step`."""

    open_files: OpenFileCache

    def __init__(self, inner: Storage) -> None:
        self.inner = inner

    def step(self, what: str) -> None:
        """Called before each mutating call, naming it; raise to make the call never happen."""

    def read_bytes(self, count: int) -> None:
        """Called after each read of a file with the bytes read."""

    def open(self, path: str, *, create: bool = True) -> StorageFile:
        if create and not self.inner.exists(path):
            self.step(f"create {path}")
        return StepFile(self, self.inner.open(path, create=create), path)

    def exists(self, path: str) -> bool:
        return self.inner.exists(path)

    def mkdir(self, path: str) -> None:
        self.step(f"mkdir {path}")
        self.inner.mkdir(path)

    def list_dir(self, path: str) -> list[str]:
        return self.inner.list_dir(path)

    def delete(self, path: str) -> None:
        self.step(f"delete {path}")
        self.inner.delete(path)

    def rename(self, source: str, target: str) -> None:
        self.step(f"rename {source} -> {target}")
        self.inner.rename(source, target)

    def read_file(self, path: str) -> bytes:
        return self.inner.read_file(path)

    def write_atomic(self, path: str, data: bytes) -> None:
        self.step(f"write_atomic {path}")
        self.inner.write_atomic(path, data)

    def write_unsynced(self, path: str, data: bytes) -> None:
        self.step(f"write_unsynced {path}")
        self.inner.write_unsynced(path, data)

    def rename_unsynced(self, source: str, target: str) -> None:
        self.step(f"rename_unsynced {source} -> {target}")
        self.inner.rename_unsynced(source, target)

    def link_unsynced(self, source: str, target: str) -> None:
        self.step(f"link_unsynced {source} -> {target}")
        self.inner.link_unsynced(source, target)

    def sync_all(self, directory: str) -> None:
        self.step(f"sync_all {directory}")
        self.inner.sync_all(directory)

    def delete_dir(self, path: str) -> None:
        self.step(f"delete_dir {path}")
        self.inner.delete_dir(path)

    def file_location(self, path: str) -> FileLocation | None:
        return self.inner.file_location(path)
