"""Which host this process runs on: the kernel's boot id.

A broker stamps it on the file locations it hands out (local reads) and on its start record
(a changed boot id since the last start is a power loss or reboot: an unclean shutdown);
a reader compares it with its own before it opens a leader's segment file.
"""

from __future__ import annotations

import functools

# Linux's id of the running kernel, new at every boot: two processes that read the same
# value run on the same host (or in containers of it, which the device and inode check tells).
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


@functools.cache
def host_id() -> str:
    """This host's boot id, or "" where the kernel has none (then no local reads either way)."""
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as file:
            return file.read().strip()
    except OSError:
        return ""
