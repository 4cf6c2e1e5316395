"""LeaseKeeper: one etcd lease kept alive by a background task, and told when it is lost.

A broker's registration, a gateway's and the active controller's `/controller` key
all live as long as a lease (DESIGN.md section 2: an etcd lease stands in for every
ephemeral znode). etcd3aio's LeaseKeepalive refreshes only every max(1, ttl // 3)
whole seconds and does not say when it gives up, so we keep our own loop.

The keeper's task owns the lease. It declares the lease lost, sets `lost` and calls
`on_lost` once, when either
- etcd answers a keep-alive with TTL <= 0 (the lease expired or was revoked), or
- no keep-alive has succeeded for ttl_s since the last successful one was *sent*:
  etcd refreshed the lease no earlier than that, so it may have expired since.
A process that sees `lost` must stop acting on what the lease stood for.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable

from coordinator.limits import (
    LEASE_KEEPALIVE_INTERVAL_TTL_RATIO_MAX,
    LEASE_KEEPALIVES_PER_TTL,
    LEASE_TTL_S_MIN,
)
from coordinator.store import CoordinatorError, MetadataStore

log = logging.getLogger("highwater.coordinator")

OnLost = Callable[[], object]


def check_keepalive_interval(ttl_s: int, keepalive_interval_s: float) -> None:
    """Raise ValueError unless LEASE_TTL_S_MIN <= ttl_s and 0 < interval < ttl_s * ratio max.

    An interval of half the TTL or more lets one lost or slow keep-alive expire the lease.
    """
    if not isinstance(ttl_s, int) or ttl_s < LEASE_TTL_S_MIN:
        raise ValueError(f"lease TTL must be an int of at least {LEASE_TTL_S_MIN} s, got {ttl_s!r}")
    if not 0 < keepalive_interval_s < ttl_s * LEASE_KEEPALIVE_INTERVAL_TTL_RATIO_MAX:
        raise ValueError(
            f"lease keep-alive interval {keepalive_interval_s} s must be positive and below "
            f"{LEASE_KEEPALIVE_INTERVAL_TTL_RATIO_MAX} x the lease TTL ({ttl_s} s), "
            "or a single lost keep-alive expires the lease"
        )


class LeaseKeeper:
    """Grants a lease and keeps it alive until stop() or until it is lost.

    `sleep` and `clock` are seams for the simulation (defaults: asyncio.sleep and
    time.monotonic). Counters for metrics: keepalives_total, keepalive_failures_total.
    """

    def __init__(
        self,
        *,
        on_lost: OnLost | None = None,
        name: str = "lease",
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.on_lost = on_lost
        self.name = name
        self.lost = asyncio.Event()
        self.lease_id = 0
        self.ttl_s = 0
        self.keepalive_interval_s = 0.0
        self.keepalives_total = 0
        self.keepalive_failures_total = 0
        self._sleep = sleep
        self._clock = clock
        self._store: MetadataStore | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_ok_sent_at = 0.0
        self._stopped = False

    @property
    def alive(self) -> bool:
        """Started, not stopped and not lost."""
        return self._task is not None and not self._stopped and not self.lost.is_set()

    async def start(self, store: MetadataStore, ttl_s: int, *, keepalive_interval_s: float | None = None) -> int:
        """Grant a lease of ttl_s and start keeping it alive; returns the lease id.

        The interval defaults to ttl_s / LEASE_KEEPALIVES_PER_TTL. Raises ValueError
        for a TTL/interval pair that cannot keep a lease (checked before any call),
        RuntimeError when started twice, CoordinatorUnavailable when the grant fails.
        """
        interval_s = keepalive_interval_s if keepalive_interval_s is not None else ttl_s / LEASE_KEEPALIVES_PER_TTL
        check_keepalive_interval(ttl_s, interval_s)
        if self._task is not None or self._stopped:
            raise RuntimeError(f"{self.name}: a LeaseKeeper keeps one lease; create another")
        self._store = store
        self.ttl_s = ttl_s
        self.keepalive_interval_s = interval_s
        sent_at = self._clock()
        self.lease_id = await store.grant_lease(ttl_s)
        self._last_ok_sent_at = sent_at
        self._task = asyncio.create_task(self._run(store), name=f"lease-keeper {self.name} {self.lease_id:x}")
        self._task.add_done_callback(self._on_task_done)
        log.info("%s: lease %x granted (TTL %d s, keep-alive every %.2f s)", self.name, self.lease_id, ttl_s, interval_s)
        return self.lease_id

    async def _run(self, store: MetadataStore) -> None:
        while True:
            deadline = self._last_ok_sent_at + self.ttl_s
            now = self._clock()
            await self._sleep(max(0.0, min(self.keepalive_interval_s, deadline - now)))
            sent_at = self._clock()
            remaining_s = deadline - sent_at
            if remaining_s <= 0:
                self._declare_lost(f"no keep-alive succeeded for {self.ttl_s} s")
                return
            try:
                # Never wait past the moment the lease may have expired.
                async with asyncio.timeout(remaining_s):
                    ttl_left = await store.keep_alive_once(self.lease_id)
            except (CoordinatorError, TimeoutError) as exc:
                self.keepalive_failures_total += 1
                log.warning("%s: keep-alive of lease %x failed (%s)", self.name, self.lease_id, str(exc) or type(exc).__name__)
                continue
            if ttl_left <= 0:
                self._declare_lost("etcd says the lease has expired")
                return
            self.keepalives_total += 1
            self._last_ok_sent_at = sent_at

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        # A bug in the loop must not leave the lease to expire unnoticed: fail safe.
        if not task.cancelled() and task.exception() is not None and not self.lost.is_set():
            log.error("%s: keep-alive task died", self.name, exc_info=task.exception())
            self._declare_lost("the keep-alive task died")

    def _declare_lost(self, why: str) -> None:
        log.error("%s: lease %x lost: %s", self.name, self.lease_id, why)
        self.lost.set()
        if self.on_lost is None:
            return
        try:
            result = self.on_lost()
        except Exception:
            log.exception("%s: on_lost callback failed", self.name)
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            task.add_done_callback(self._log_callback_failure)

    def _log_callback_failure(self, task: asyncio.Future[object]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: on_lost callback failed", self.name, exc_info=task.exception())

    async def stop(self, revoke: bool = True) -> None:
        """Stop the keep-alives and, with revoke, revoke the lease (deleting its keys now).

        Does not raise for an unreachable etcd: the lease then ends by itself within
        its TTL, and a warning says so. Safe to call more than once.
        """
        if self._stopped:
            return
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
        if revoke and self._store is not None and self.lease_id and not self.lost.is_set():
            try:
                await self._store.revoke_lease(self.lease_id)
            except CoordinatorError as exc:
                log.warning("%s: could not revoke lease %x (%s); it ends within %d s", self.name, self.lease_id, exc, self.ttl_s)
            else:
                log.info("%s: lease %x revoked", self.name, self.lease_id)

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else "stopped" if self._stopped else "alive" if self._task else "new"
        return f"LeaseKeeper({self.name!r}, lease={self.lease_id:x}, {state})"
