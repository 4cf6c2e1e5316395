"""Short-circuit local reads: the transport package's (clients/common/transport/local_reads.py),
under the name the client library has always exported them by."""

from clients.common.transport.local_reads import NotReadableHere, read_located

__all__ = ["NotReadableHere", "read_located"]
