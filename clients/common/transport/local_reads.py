"""Short-circuit local reads: a consumer on the leader's host reads the records from its files.

HDFS's short-circuit local reads, for Highwater's leaders. A bulk reader (a Spark task)
on the same host as a partition's leader asks the leader where the records it would
send lie (a Fetch with `locate_records`): the leader answers a `RecordsLocation` (segment
file path, byte range, the file's device and inode, the host's boot id) after the same
checks as any consumer Fetch (leadership, leader epoch, the high watermark, ACLs). The
reader then preads those bytes itself. The records skip gRPC both ways: the leader no
longer copies and frames ~110 bytes per 100-byte record, the reader no longer receives
them (bench/RESULTS.md, "Spark connector": together ~0.2 µs of CPU per record).

The reader checks before it trusts a location: the same host (the boot id), the same file
(device and inode of what it opened, since another mount namespace may show other files at
the path), and every byte there (a shorter file means the log was truncated or the segment
deleted since). Anything else raises `NotReadableHere`; the caller then fetches the bytes
as usual. `permanent` tells a reader that will never work (another host, no permission:
stop asking that leader) from a race that the next Fetch may not meet (a deleted segment).

The bytes are checked again downstream as any fetched bytes are (CRC of every batch).
"""

from __future__ import annotations

import errno
import os

from clients.common.transport.host import host_id
from protos.highwater.v1 import common_pb2


class NotReadableHere(Exception):
    """A location this process cannot read the records from; fetch the bytes instead."""

    def __init__(self, reason: str, *, permanent: bool) -> None:
        super().__init__(reason)
        self.permanent = permanent


def read_located(location: common_pb2.RecordsLocation) -> bytes:
    """The `size` bytes at `position` of the file the location names, or NotReadableHere."""
    here = host_id()
    if not here or location.host_id != here:
        raise NotReadableHere("the leader runs on another host", permanent=True)
    try:
        fd = os.open(location.path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotReadableHere(f"{location.path} is gone (segment deleted)", permanent=False) from None
    except OSError as error:
        permanent = error.errno in (errno.EACCES, errno.EPERM)
        raise NotReadableHere(f"cannot open {location.path}: {error.strerror}", permanent=permanent) from None
    try:
        stat = os.fstat(fd)
        if (stat.st_dev, stat.st_ino) != (location.device, location.inode):
            # Another file at that path: a different mount namespace (a container) sees other
            # files. (Or, rarely, the segment was deleted and a new one made under its name:
            # taking that as permanent too costs only this reader's later local reads.)
            raise NotReadableHere(f"{location.path} here is another file than the leader's", permanent=True)
        data = os.pread(fd, location.size, location.position)
    finally:
        os.close(fd)
    if len(data) != location.size:
        raise NotReadableHere(
            f"{location.path} holds {len(data)} of the {location.size} bytes named (truncated since)",
            permanent=False,
        )
    return data
