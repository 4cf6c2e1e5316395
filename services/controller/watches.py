"""The active controller's watches on etcd: what changes under a prefix becomes an event for
the event loop (event_loop.py), through a callback that queues it.

A broken watch is started again and never misses a change: a membership watch reads the
whole prefix again (its event always carries the whole set), the /admin watch resumes from
the last revision it saw, or reads /admin again when etcd has compacted that history.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from coordinator.store import EtcdStore, WatchCompacted

log = logging.getLogger("highwater.controller")

# After a watch on etcd breaks, wait this long before reading and watching again.
WATCH_RETRY_BACKOFF_S = 0.5


async def watch_membership(
    store: EtcdStore, prefix: str, revision: int, on_change: Callable[[list[Any]], None]
) -> None:
    """On any change under prefix after revision, read the whole prefix and pass its keys on.

    A broken watch (etcd restarted, history compacted) is started again from a
    fresh read, so no change is missed. Runs until cancelled.
    """
    while True:
        try:
            async for _events in store.watch_prefix(prefix, start_revision=revision + 1):
                kvs, revision = await store.get_prefix(prefix)
                on_change(kvs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("watch on %s failed (%s); reading it again", prefix, exc)
            await asyncio.sleep(WATCH_RETRY_BACKOFF_S)
            try:
                kvs, revision = await store.get_prefix(prefix)
                on_change(kvs)
            except Exception as again:
                log.warning("reading %s failed too (%s); will retry", prefix, again)


async def watch_admin(store: EtcdStore, revision: int, on_write: Callable[[str, bytes], None]) -> None:
    """Pass on each key written under /admin after revision (requests written by hand, as
    Kafka's znode-based admin tools do).

    When etcd has compacted the history this watch would resume from, every request
    under /admin is read again and passed on, and the watch starts after that read.
    Runs until cancelled.
    """
    prefix = store.keys.prefix + "/admin/"
    reread = False
    while True:
        try:
            if reread:
                kvs, revision = await store.get_prefix(prefix)
                for kv in kvs:
                    on_write(kv.key, kv.value)
                reread = False
            async for events in store.watch_prefix(prefix, start_revision=revision + 1):
                for ev in events:
                    revision = max(revision, ev.mod_revision)
                    if ev.kind == "put":
                        on_write(ev.key, ev.value)
        except asyncio.CancelledError:
            raise
        except WatchCompacted as exc:
            log.warning("watch on /admin: %s; reading /admin again", exc)
            reread = True
        except Exception as exc:
            log.warning("watch on /admin failed (%s); watching again", exc)
            await asyncio.sleep(WATCH_RETRY_BACKOFF_S)
