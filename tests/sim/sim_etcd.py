"""The simulated etcd: the project's MemoryStore on the simulation clock, one client per process.

MemoryStore's async methods never suspend before their effect is applied (its
docstring promises it), so `run_sync` drives them, and anything built only on
them (`fenced_txn`, `ControllerEventLoop.load/apply`), to completion without an
asyncio loop. Leases expire when the event loop moves the store's clock.

`EtcdClient` is what one process holds: every call first checks that the process
can reach etcd through the simulated network (else CoordinatorUnavailable, as the
real client raises after its timeout). Its one test switch: with
`Safety.controller_epoch_fence` off, it silently drops the `/controller_epoch`
value compare that `fenced_txn` adds to every controller write, so a deposed
controller's writes commit. That is the mechanism-off experiment of
test_simulation.py; the checker must notice.

`SimLease` mirrors coordinator/lease.py's LeaseKeeper rules on the simulation
clock: a keep-alive every TTL/4, and the lease counts as lost when etcd says it
expired or when no keep-alive succeeded for a whole TTL since the last good one
was sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from coordinator.limits import LEASE_KEEPALIVES_PER_TTL
from coordinator.memory_store import MemoryStore, MemoryWatch
from coordinator.store import Compare, CoordinatorError, CoordinatorUnavailable, KeyValue, Op, TxnResult
from tests.sim.clock import EventLoop, Node
from tests.sim.network import ETCD, Network

T = TypeVar("T")

# A watch notification reaches a watcher this long after the write (etcd's watch stream latency).
WATCH_DELAY_MS_MIN = 1
WATCH_DELAY_MS_MAX = 10
# etcd's lessor checks for expired leases about this often (it runs a periodic revoke loop).
LEASE_CHECK_INTERVAL_MS = 10


def run_sync(awaitable: Awaitable[T]) -> T:
    """Run a coroutine that never really waits (MemoryStore calls and code built on them).

    Raises RuntimeError if it does try to wait: that would be a simulation bug, a
    call that needs a real event loop.
    """
    coro: Coroutine[Any, Any, T] = awaitable  # type: ignore[assignment]
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a coroutine suspended inside the simulation; only non-waiting calls can run here")


class SimEtcd:
    """The run's one etcd server."""

    def __init__(self, loop: EventLoop, network: Network, *, fence_controller_epoch: bool = True) -> None:
        self.loop = loop
        self.network = network
        self.store = MemoryStore(now_ms=0)
        self.keys = self.store.keys
        self.fence_controller_epoch = fence_controller_epoch
        self.lease_owner: dict[int, str] = {}
        # The SimLease of every lease granted and not yet stopped or lost, for prompt expiry notices.
        self.leases: dict[int, SimLease] = {}
        self._watchers: list[tuple[Node, Callable[[], None]]] = []
        self._notified_revision = self.store.revision
        self._next_lease_check_ms = 0

    def client(self, node: Node) -> EtcdClient:
        return EtcdClient(self, node)

    def advance(self, now_ms: int) -> None:
        """Move etcd's clock; leases whose TTL ran out expire and delete their keys.

        Checked every LEASE_CHECK_INTERVAL_MS of simulated time, not every event: real etcd
        expires leases a little late too, and the check is the costliest per-event call.
        """
        if now_ms < self._next_lease_check_ms:
            return
        self._next_lease_check_ms = now_ms + LEASE_CHECK_INTERVAL_MS
        for lease_id in self.store.advance(now_ms):
            self.leases.pop(lease_id, None)
            self.loop.trace(ETCD, "lease of %s expired", (self.lease_owner.get(lease_id, "?"),))

    def expire_lease(self, lease_id: int, *, noticed_after_ms: int | None = None) -> None:
        """Fault: etcd ends a session now (as a TTL running out under a slow keep-alive path).

        With `noticed_after_ms`, its holder's next keep-alive comes that soon (its keep-alive
        was due anyway), so the holder learns of it, and re-registers, at a chosen moment.
        """
        if self.store.expire_lease(lease_id):
            self.loop.trace(ETCD, "lease of %s expired (injected)", (self.lease_owner.get(lease_id, "?"),))
            lease = self.leases.pop(lease_id, None)
            if lease is not None and noticed_after_ms is not None and lease.held_by_live_process():
                lease.node.after(noticed_after_ms, lease.keep_alive_now)

    def watch(self, node: Node, on_change: Callable[[], None]) -> None:
        """Call node's on_change (as a timer of the node) shortly after every new revision."""
        self._watchers.append((node, on_change))

    def subscribe(self, prefix: str, start_revision: int = 0) -> MemoryWatch:
        return self.store.subscribe(prefix, start_revision=start_revision)

    def notify_watchers(self) -> None:
        """Called after every event: schedule watch wake-ups when the store moved."""
        if self.store.revision == self._notified_revision:
            return
        self._notified_revision = self.store.revision
        rng = self.network.rng
        for node, on_change in self._watchers:
            if node.up:
                node.after(rng.randint(WATCH_DELAY_MS_MIN, WATCH_DELAY_MS_MAX), on_change)


class EtcdClient:
    """One process's connection to etcd: the MetadataStore protocol, with reachability."""

    def __init__(self, etcd: SimEtcd, node: Node) -> None:
        self.etcd = etcd
        self.node = node
        self.keys = etcd.keys
        self._store = etcd.store

    def reachable(self) -> bool:
        return self.etcd.network.reachable(self.node.name, ETCD)

    def _check(self, operation: str) -> None:
        if not self.reachable():
            raise CoordinatorUnavailable(f"{self.node.name}: etcd {operation} failed: partitioned from etcd")

    async def get(self, key: str) -> KeyValue | None:
        self._check("get")
        return await self._store.get(key)

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        self._check("get_prefix")
        return await self._store.get_prefix(prefix)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        self._check("put")
        return await self._store.put(key, value, lease=lease)

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        self._check("delete")
        return await self._store.delete(key, prefix=prefix)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        self._check("txn")
        if not self.etcd.fence_controller_epoch:
            # Test switch: forget the fence fenced_txn adds (a value compare on /controller_epoch).
            epoch_key = self.keys.controller_epoch
            compares = [c for c in compares if not (c.key == epoch_key and c.target == "value")]
        return await self._store.txn(compares, success, failure)

    async def grant_lease(self, ttl_s: int) -> int:
        self._check("lease grant")
        lease_id = await self._store.grant_lease(ttl_s)
        self.etcd.lease_owner[lease_id] = self.node.name
        return lease_id

    async def revoke_lease(self, lease_id: int) -> None:
        self._check("lease revoke")
        await self._store.revoke_lease(lease_id)

    async def keep_alive_once(self, lease_id: int) -> int:
        self._check("lease keep-alive")
        return await self._store.keep_alive_once(lease_id)


class SimLease:
    """LeaseKeeper's rules, driven by the node's timers. One lease; lost or stopped is final."""

    def __init__(self, node: Node, client: EtcdClient, ttl_s: int, on_lost: Callable[[], None]) -> None:
        self.node = node
        self.client = client
        self.ttl_ms = ttl_s * 1000
        self.interval_ms = self.ttl_ms // LEASE_KEEPALIVES_PER_TTL
        self.on_lost = on_lost
        self.lease_id = run_sync(client.grant_lease(ttl_s))  # raises CoordinatorError if unreachable
        client.etcd.leases[self.lease_id] = self
        self.incarnation = node.incarnation
        self._last_ok_sent_at_ms = node.loop.now_ms
        self.lost = False
        self.stopped = False
        self._schedule()

    @property
    def alive(self) -> bool:
        return not self.lost and not self.stopped

    def _schedule(self) -> None:
        deadline = self._last_ok_sent_at_ms + self.ttl_ms
        self.node.after(max(0, min(self.interval_ms, deadline - self.node.loop.now_ms)), self._tick)

    def _tick(self) -> None:
        if not self.alive:
            return
        now = self.node.loop.now_ms
        if now >= self._last_ok_sent_at_ms + self.ttl_ms:
            self._declare_lost(f"no keep-alive succeeded for {self.ttl_ms} ms")
            return
        try:
            ttl_left = run_sync(self.client.keep_alive_once(self.lease_id))
        except CoordinatorError:
            self._schedule()
            return
        if ttl_left <= 0:
            self._declare_lost("etcd says the lease has expired")
            return
        self._last_ok_sent_at_ms = now
        self._schedule()

    def held_by_live_process(self) -> bool:
        """The process that took the lease still runs (a crashed one's lease just times out)."""
        return self.node.up and self.node.incarnation == self.incarnation

    def keep_alive_now(self) -> None:
        """One keep-alive out of turn (the regular ones go on): notices an expired lease at once."""
        if not self.alive:
            return
        try:
            ttl_left = run_sync(self.client.keep_alive_once(self.lease_id))
        except CoordinatorError:
            return
        if ttl_left <= 0:
            self._declare_lost("etcd says the lease has expired")

    def _declare_lost(self, why: str) -> None:
        self.client.etcd.leases.pop(self.lease_id, None)
        self.lost = True
        self.node.trace("lease lost: %s", why)
        self.on_lost()

    def stop(self, *, revoke: bool) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.client.etcd.leases.pop(self.lease_id, None)
        if revoke and not self.lost:
            try:
                run_sync(self.client.revoke_lease(self.lease_id))
            except CoordinatorError:
                pass  # it ends by itself within its TTL
