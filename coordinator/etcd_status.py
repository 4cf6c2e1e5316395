"""etcd's database size, quota and NOSPACE alarm, read for the controller's metrics and
`highwater cluster describe` (EtcdStore.status: etcd's Status and Alarm RPCs).

The MemoryStore of the simulation has no database file: it reports no status."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from coordinator.limits import ETCD_QUOTA_BACKEND_BYTES, ETCD_STATUS_POLL_INTERVAL_S
from coordinator.store import CoordinatorError, EtcdStatus, EtcdStore, MetadataStore

log = logging.getLogger("highwater.coordinator")


async def read_status(store: MetadataStore) -> EtcdStatus | None:
    """etcd's status; None for a store that is not etcd. An etcd that does not report its
    quota (before 3.6) is taken to run with the one `cluster up` and deploy/ give it."""
    if not isinstance(store, EtcdStore):
        return None
    status = await store.status()
    if status.quota_bytes == 0:
        status = EtcdStatus(
            db_size_bytes=status.db_size_bytes,
            db_size_in_use_bytes=status.db_size_in_use_bytes,
            quota_bytes=ETCD_QUOTA_BACKEND_BYTES,
            nospace_alarm=status.nospace_alarm,
            revision=status.revision,
        )
    return status


async def poll_status(
    store: MetadataStore,
    on_status: Callable[[EtcdStatus], None],
    interval_s: float = ETCD_STATUS_POLL_INTERVAL_S,
) -> None:
    """Read etcd's status every interval_s and hand it to on_status, until cancelled. Logs
    an error while the NOSPACE alarm is raised (once when raised, once when cleared), a
    warning when a read fails (the last status stays)."""
    alarmed = False
    while True:
        try:
            status = await read_status(store)
        except CoordinatorError as exc:
            log.warning("reading etcd's status failed (%s); trying again in %.0f s", exc, interval_s)
        else:
            if status is None:
                return
            on_status(status)
            if status.nospace_alarm and not alarmed:
                log.error(
                    "etcd's NOSPACE alarm is raised: its database is %d of %d bytes (quota) and every "
                    "write fails; compact and defragment etcd, then `etcdctl alarm disarm` "
                    "(deploy/README.md, etcd's space)",
                    status.db_size_bytes,
                    status.quota_bytes,
                )
            elif alarmed and not status.nospace_alarm:
                log.info("etcd's NOSPACE alarm is cleared (database %d bytes)", status.db_size_bytes)
            alarmed = status.nospace_alarm
        await asyncio.sleep(interval_s)
