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

Over etcd the keep-alives run on a thread of their own, over a synchronous connection of
their own (`EtcdStore.open_keepalive_client`). A process's event loop can be busy for
hundreds of milliseconds (a broker opening a thousand logs, a controller loading ten
thousand partitions, two cores shared by every process of a local cluster); the lease
must not pay for it, or a 2 s TTL turns every busy moment into a failover. The thread
needs the GIL only for a few microseconds per keep-alive, and Python hands it over every
5 ms (sys.getswitchinterval) even to a busy main thread.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable

from coordinator.limits import (
    LEASE_KEEPALIVE_INTERVAL_TTL_RATIO_MAX,
    LEASE_KEEPALIVES_PER_TTL,
    LEASE_TTL_S_MIN,
)
from coordinator.store import CoordinatorError, MetadataStore, SyncLeaseClient

log = logging.getLogger("highwater.coordinator")

OnLost = Callable[[], object]

# How long stop() waits for the keep-alive thread to end (a keep-alive in flight is
# bounded by the store's request timeout).
KEEPALIVE_THREAD_JOIN_TIMEOUT_S = 5.0


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
    time.monotonic). With `own_thread` (the default) and a store that can open a second
    connection (EtcdStore), the keep-alives run on their own thread; otherwise (the
    in-memory store, the simulation, own_thread=False) as a task of the caller's loop.
    Counters for metrics: keepalives_total, keepalive_failures_total.
    """

    def __init__(
        self,
        *,
        on_lost: OnLost | None = None,
        name: str = "lease",
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        own_thread: bool = True,
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
        self._own_thread = own_thread
        self._thread: _KeepAliveThread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the owner's loop: `lost` and on_lost live there
        self._last_ok_sent_at = 0.0
        self._stopped = False

    @property
    def alive(self) -> bool:
        """Started, not stopped and not lost."""
        started = self._task is not None or self._thread is not None
        return started and not self._stopped and not self.lost.is_set()

    @property
    def on_own_thread(self) -> bool:
        return self._thread is not None

    async def start(
        self, store: MetadataStore, ttl_s: int, *, keepalive_interval_s: float | None = None
    ) -> int:
        """Grant a lease of ttl_s and start keeping it alive; returns the lease id.

        The interval defaults to ttl_s / LEASE_KEEPALIVES_PER_TTL. Raises ValueError
        for a TTL/interval pair that cannot keep a lease (checked before any call),
        RuntimeError when started twice, CoordinatorUnavailable when the grant fails.
        """
        interval_s = (
            keepalive_interval_s if keepalive_interval_s is not None else ttl_s / LEASE_KEEPALIVES_PER_TTL
        )
        check_keepalive_interval(ttl_s, interval_s)
        if self._task is not None or self._thread is not None or self._stopped:
            raise RuntimeError(f"{self.name}: a LeaseKeeper keeps one lease; create another")
        self._store = store
        self._loop = asyncio.get_running_loop()
        self.ttl_s = ttl_s
        self.keepalive_interval_s = interval_s
        sent_at = self._clock()
        self.lease_id = await store.grant_lease(ttl_s)
        self._last_ok_sent_at = sent_at
        open_client = getattr(store, "open_keepalive_client", None) if self._own_thread else None
        if open_client is not None:
            self._thread = _KeepAliveThread(self, open_client())
            self._thread.start()
        else:
            self._task = asyncio.create_task(
                self._run(store), name=f"lease-keeper {self.name} {self.lease_id:x}"
            )
            self._task.add_done_callback(self._on_task_done)
        log.info(
            "%s: lease %x granted (TTL %d s, keep-alive every %.2f s%s)",
            self.name,
            self.lease_id,
            ttl_s,
            interval_s,
            " on its own thread" if self._thread is not None else "",
        )
        return self.lease_id

    async def _run(self, store: MetadataStore) -> None:
        while True:
            await self._sleep(self._wait_s())
            sent_at = self._clock()
            remaining_s = self._remaining_s(sent_at)
            if remaining_s is None:
                return
            try:
                # Never wait past the moment the lease may have expired.
                async with asyncio.timeout(remaining_s):
                    ttl_left = await store.keep_alive_once(self.lease_id)
            except (CoordinatorError, TimeoutError) as exc:
                self._failed(exc)
                continue
            if not self._answered(sent_at, ttl_left):
                return

    def _run_in_thread(self, client: SyncLeaseClient, stop: threading.Event) -> None:
        """_run, for the keep-alive thread: the same steps over a synchronous client."""
        while not stop.wait(self._wait_s()):
            sent_at = self._clock()
            remaining_s = self._remaining_s(sent_at)
            if remaining_s is None:
                return
            try:
                ttl_left = client.keep_alive_once(self.lease_id, timeout_s=remaining_s)
            except CoordinatorError as exc:
                self._failed(exc)
                continue
            if not self._answered(sent_at, ttl_left):
                return

    # The steps both loops share.

    def _wait_s(self) -> float:
        """Until the next keep-alive: the interval, or less if the lease may expire sooner."""
        return max(0.0, min(self.keepalive_interval_s, self._last_ok_sent_at + self.ttl_s - self._clock()))

    def _remaining_s(self, sent_at: float) -> float | None:
        """How long the lease surely lives from sent_at; None (and lost reported) if it may be gone."""
        remaining_s = self._last_ok_sent_at + self.ttl_s - sent_at
        if remaining_s <= 0:
            self._report_lost(f"no keep-alive succeeded for {self.ttl_s} s")
            return None
        return remaining_s

    def _failed(self, exc: BaseException) -> None:
        self.keepalive_failures_total += 1
        log.warning(
            "%s: keep-alive of lease %x failed (%s)", self.name, self.lease_id, str(exc) or type(exc).__name__
        )

    def _answered(self, sent_at: float, ttl_left: int) -> bool:
        """Record etcd's answer; False (and lost reported) when it says the lease is gone."""
        if ttl_left <= 0:
            self._report_lost("etcd says the lease has expired")
            return False
        self.keepalives_total += 1
        self._last_ok_sent_at = sent_at
        return True

    def _report_lost(self, why: str) -> None:
        """_declare_lost on the owner's loop, from whichever thread runs the keep-alives."""
        if self._thread is None or self._loop is None:
            self._declare_lost(why)
            return
        try:
            self._loop.call_soon_threadsafe(self._declare_lost_once, why)
        except RuntimeError:
            pass  # the owner's loop is closed: the process is exiting

    def _declare_lost_once(self, why: str) -> None:
        if not self.lost.is_set() and not self._stopped:
            self._declare_lost(why)

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
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.stop()
            await asyncio.to_thread(thread.join, KEEPALIVE_THREAD_JOIN_TIMEOUT_S)
            if thread.is_alive():
                log.warning(
                    "%s: keep-alive thread did not end within %.0f s",
                    self.name,
                    KEEPALIVE_THREAD_JOIN_TIMEOUT_S,
                )
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
                log.warning(
                    "%s: could not revoke lease %x (%s); it ends within %d s",
                    self.name,
                    self.lease_id,
                    exc,
                    self.ttl_s,
                )
            else:
                log.info("%s: lease %x revoked", self.name, self.lease_id)

    def __repr__(self) -> str:
        started = self._task is not None or self._thread is not None
        state = (
            "lost" if self.lost.is_set() else "stopped" if self._stopped else "alive" if started else "new"
        )
        return f"LeaseKeeper({self.name!r}, lease={self.lease_id:x}, {state})"


class _KeepAliveThread(threading.Thread):
    """Runs LeaseKeeper._run_in_thread over a synchronous etcd client of its own."""

    def __init__(self, keeper: LeaseKeeper, client: SyncLeaseClient) -> None:
        super().__init__(name=f"lease-keeper {keeper.name} {keeper.lease_id:x}", daemon=True)
        self._keeper = keeper
        self._client = client
        self._stop_requested = threading.Event()

    def run(self) -> None:
        keeper = self._keeper
        try:
            keeper._run_in_thread(self._client, self._stop_requested)
        except Exception as exc:  # fail safe: a keeper that cannot keep the lease says so
            log.error("%s: keep-alive thread failed", keeper.name, exc_info=exc)
            keeper._report_lost(f"the keep-alive thread failed ({exc})")
        finally:
            self._client.close()

    def stop(self) -> None:
        self._stop_requested.set()
