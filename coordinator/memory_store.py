"""MemoryStore: the MetadataStore protocol in memory, with etcd's semantics and no real time.

For the deterministic simulation (tests/sim) and fast unit tests of the controller.
It copies what the services depend on (store.py's docstring lists it): one global
revision, create/mod revision and version per key, compare semantics including
"value compare on a missing key is false", one revision per transaction and per
lease expiry, watch events in revision order from any retained revision, and
etcd's refusals (more than ETCD_TXN_OPS_MAX ops, a key written twice in one branch,
requests over ETCD_REQUEST_BYTES_MAX, a Put naming an expired lease).

Time is an explicit clock in milliseconds: `advance(now_ms)` moves it and expires
every lease whose TTL ran out since its last keep-alive, deleting its keys. Nothing
here reads a clock or sleeps. Faults for the simulation: `available = False` makes
every call raise CoordinatorUnavailable (watches stall and resume, as etcd's do),
`expire_lease(id)` ends a session at once, `compact(revision)` drops history.

The store belongs to one event loop and one task at a time: the async methods never
suspend before their effect is applied, so a write is atomic with respect to
other tasks, as in etcd. Watchers wait on futures created in the running loop.
`subscribe()` gives the simulation a synchronous cursor (`drain()`) over the same
event history the async watches read.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, replace

from coordinator.keys import DEFAULT_PREFIX, Keys
from coordinator.limits import ETCD_REQUEST_BYTES_MAX, ETCD_TXN_OPS_MAX, MEMORY_STORE_HISTORY_REVISIONS_MAX
from coordinator.store import (
    ClosedOnExit,
    Compare,
    CoordinatorError,
    CoordinatorUnavailable,
    Delete,
    Get,
    KeyValue,
    LeaseLost,
    Op,
    Put,
    TxnResult,
    WatchCompacted,
    WatchEvent,
)

# etcd lease ids are random 63-bit numbers; ours count up from here so a seeded run
# replays exactly (and an id never looks like a small broker id in a log line).
_FIRST_LEASE_ID = 0x7E57_0000_0001


@dataclass(slots=True)
class _Lease:
    lease_id: int
    ttl_s: int
    expires_at_ms: int
    keys: set[str] = field(default_factory=set)


def _in_range(key: str, start: str, prefix: bool) -> bool:
    return key.startswith(start) if prefix else key == start


def _compare_holds(c: Compare, kv: KeyValue | None) -> bool:
    """etcd's applyCompare for a single key."""
    if kv is None:
        if c.target == "value":
            # etcd: "always fail if comparing a value on a key that doesn't exist".
            return False
        actual: int | bytes = 0
    else:
        by_target: dict[str, int | bytes] = {
            "version": kv.version,
            "value": kv.value,
            "mod_revision": kv.mod_revision,
            "create_revision": kv.create_revision,
        }
        actual = by_target[c.target]
    want = c.value
    if c.op == "==":
        return actual == want
    if c.op == "!=":
        return actual != want
    if c.op == "<":
        # Ordering compares are made on version and revisions only (int against int); mypy sees
        # the int | bytes of every target.
        return actual < want  # type: ignore[operator]
    return actual > want  # type: ignore[operator]


class MemoryWatch:
    """A synchronous cursor over the store's event history for one prefix.

    drain() returns the events since the last drain, one list per revision, and
    raises WatchCompacted when the cursor fell behind the retained history.
    """

    def __init__(self, store: MemoryStore, prefix: str, next_revision: int) -> None:
        self.store = store
        self.prefix = prefix
        self.next_revision = next_revision

    def drain(self) -> list[list[WatchEvent]]:
        store = self.store
        if self.next_revision <= store.compacted_revision:
            raise WatchCompacted(
                f"watch on {self.prefix} from revision {self.next_revision}: history compacted up to "
                f"revision {store.compacted_revision}; re-read and watch again",
                store.compacted_revision,
            )
        out: list[list[WatchEvent]] = []
        start = bisect.bisect_left(store._history, self.next_revision, key=lambda entry: entry[0])
        for revision, events in store._history[start:]:
            matching = [e for e in events if e.key.startswith(self.prefix)]
            if matching:
                out.append(matching)
            self.next_revision = revision + 1
        self.next_revision = max(self.next_revision, store.revision + 1)
        return out


class MemoryStore(ClosedOnExit):
    """In-memory MetadataStore with etcd semantics and an explicit clock."""

    def __init__(
        self,
        *,
        prefix: str = DEFAULT_PREFIX,
        now_ms: int = 0,
        history_revisions_max: int = MEMORY_STORE_HISTORY_REVISIONS_MAX,
    ) -> None:
        self.keys = Keys(prefix)
        # As in a fresh etcd: the first write gets revision 2.
        self.revision = 1
        self.compacted_revision = 0
        self.available = True
        self._now_ms = now_ms
        self._history_revisions_max = history_revisions_max
        self._data: dict[str, KeyValue] = {}
        self._leases: dict[int, _Lease] = {}
        self._next_lease_id = _FIRST_LEASE_ID
        # (revision, events of that revision), revisions increasing; every revision
        # after compacted_revision is here, since every revision has events.
        self._history: list[tuple[int, tuple[WatchEvent, ...]]] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._closed = False

    # --- the clock and faults (synchronous, for the simulation) ----------------------

    @property
    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, now_ms: int) -> list[int]:
        """Move the clock to now_ms and expire every lease due by then, oldest deadline first.

        Each expiry deletes the lease's keys in one revision (as etcd's revoke does).
        Returns the expired lease ids. Raises ValueError if the clock would go back.
        """
        if now_ms < self._now_ms:
            raise ValueError(f"MemoryStore clock cannot go back: now {self._now_ms} ms, asked {now_ms} ms")
        self._now_ms = now_ms
        due = sorted(
            (lease.expires_at_ms, lease.lease_id)
            for lease in self._leases.values()
            if lease.expires_at_ms <= now_ms
        )
        for _, lease_id in due:
            self._revoke(lease_id)
        return [lease_id for _, lease_id in due]

    def expire_lease(self, lease_id: int) -> bool:
        """End a lease now, as if its TTL ran out (a session expiry). False if it was gone."""
        if lease_id not in self._leases:
            return False
        self._revoke(lease_id)
        return True

    def set_available(self, available: bool) -> None:
        """Simulate etcd becoming unreachable (False) or reachable again (True)."""
        self.available = available
        self._notify()

    def compact(self, revision: int) -> None:
        """Drop watch history up to and including revision (as etcd's compaction)."""
        if revision > self.revision:
            raise ValueError(f"cannot compact to revision {revision}: the store is at {self.revision}")
        if revision <= self.compacted_revision:
            return
        self.compacted_revision = revision
        cut = bisect.bisect_right(self._history, revision, key=lambda entry: entry[0])
        del self._history[:cut]

    # --- synchronous inspection (for simulation checks) -------------------------------

    def dump(self, prefix: str = "") -> dict[str, KeyValue]:
        """Every key under prefix, sorted, as of now."""
        return {k: self._data[k] for k in sorted(self._data) if k.startswith(prefix)}

    def lease_ids(self) -> list[int]:
        return sorted(self._leases)

    def lease_deadline_ms(self, lease_id: int) -> int | None:
        """When the lease expires unless kept alive, or None when it does not exist."""
        lease = self._leases.get(lease_id)
        return lease.expires_at_ms if lease is not None else None

    def subscribe(self, prefix: str, *, start_revision: int = 0) -> MemoryWatch:
        """A synchronous watch cursor; start_revision 0 means "changes from now on"."""
        return MemoryWatch(self, prefix, start_revision if start_revision > 0 else self.revision + 1)

    # --- MetadataStore -------------------------------------------------------------------

    def _check_usable(self, operation: str) -> None:
        if self._closed:
            raise CoordinatorError(f"memory store {operation}: the store is closed")
        if not self.available:
            raise CoordinatorUnavailable(f"memory store {operation}: etcd is unavailable (simulated)")

    async def get(self, key: str) -> KeyValue | None:
        self._check_usable("get")
        return self._data.get(key)

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        self._check_usable("get_prefix")
        return self._range(prefix, True), self.revision

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        self._check_usable("put")
        result = self._txn([], [Put(key, value, lease)], ())
        return result.revision

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        self._check_usable("delete")
        before = len(self._data)
        self._txn([], [Delete(key, prefix)], ())
        return before - len(self._data)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        self._check_usable("txn")
        return self._txn(compares, success, failure)

    async def grant_lease(self, ttl_s: int) -> int:
        self._check_usable("lease grant")
        if ttl_s < 1:
            raise CoordinatorError(f"lease TTL must be at least 1 s, got {ttl_s}")
        lease_id = self._next_lease_id
        self._next_lease_id += 1
        self._leases[lease_id] = _Lease(lease_id, ttl_s, self._now_ms + ttl_s * 1000)
        return lease_id

    async def revoke_lease(self, lease_id: int) -> None:
        self._check_usable("lease revoke")
        if lease_id in self._leases:
            self._revoke(lease_id)

    async def keep_alive_once(self, lease_id: int) -> int:
        self._check_usable("lease keep-alive")
        lease = self._leases.get(lease_id)
        if lease is None:
            return 0
        lease.expires_at_ms = self._now_ms + lease.ttl_s * 1000
        return lease.ttl_s

    async def watch_prefix(
        self, prefix: str, *, start_revision: int = 0
    ) -> AsyncGenerator[list[WatchEvent], None]:
        """Events under prefix, one list per revision. While `available` is False the
        watch waits (as etcd3 clients re-connect) and then catches up without gaps."""
        if self._closed:
            raise CoordinatorError("memory store watch: the store is closed")
        watch = self.subscribe(prefix, start_revision=start_revision)
        while not self._closed:
            batches = watch.drain() if self.available else []
            if not batches:
                await self._wait_for_change()
                continue
            for events in batches:
                yield events

    async def close(self) -> None:
        self._closed = True
        self._notify()

    # --- internals -------------------------------------------------------------------------

    def _range(self, key: str, prefix: bool) -> list[KeyValue]:
        if not prefix:
            kv = self._data.get(key)
            return [kv] if kv is not None else []
        return [self._data[k] for k in sorted(self._data) if k.startswith(key)]

    def _check_request(self, compares: Sequence[Compare], branch: Sequence[Op]) -> None:
        """etcd's checks of a transaction branch before anything is applied."""
        if len(compares) > ETCD_TXN_OPS_MAX or len(branch) > ETCD_TXN_OPS_MAX:
            raise CoordinatorError(
                f"etcd txn failed: too many operations in txn request (max {ETCD_TXN_OPS_MAX})"
            )
        put_keys: set[str] = set()
        deletes: list[Delete] = []
        for op in branch:
            if isinstance(op, Put):
                if op.key in put_keys:
                    raise CoordinatorError(f"etcd txn failed: duplicate key given in txn request: {op.key}")
                put_keys.add(op.key)
            elif isinstance(op, Delete):
                deletes.append(op)
            elif not isinstance(op, Get):
                raise TypeError(f"not a transaction op: {op!r}")
        for d in deletes:
            for key in put_keys:
                if _in_range(key, d.key, d.prefix):
                    raise CoordinatorError(f"etcd txn failed: duplicate key given in txn request: {key}")

    def _txn(self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op]) -> TxnResult:
        self._check_request(compares, success)
        self._check_request(compares, failure)
        request_bytes = sum(
            len(op.key) + (len(op.value) if isinstance(op, Put) else 0) for op in (*success, *failure)
        )
        request_bytes += sum(
            len(c.key) + (len(c.value) if isinstance(c.value, bytes) else 8) for c in compares
        )
        if request_bytes > ETCD_REQUEST_BYTES_MAX:
            raise CoordinatorError(
                f"etcd request failed: request is too large ({request_bytes} bytes > "
                f"{ETCD_REQUEST_BYTES_MAX})"
            )
        succeeded = all(_compare_holds(c, self._data.get(c.key)) for c in compares)
        branch = success if succeeded else failure
        for op in branch:
            if isinstance(op, Put) and op.lease and op.lease not in self._leases:
                raise LeaseLost(f"etcd txn: requested lease not found ({op.lease:x})")
        revision = self.revision + 1
        events: list[WatchEvent] = []
        gets: list[list[KeyValue]] = []
        for op in branch:
            if isinstance(op, Get):
                gets.append(self._range(op.key, op.prefix))
            elif isinstance(op, Put):
                events.append(self._apply_put(op, revision))
            else:
                for kv in self._range(op.key, op.prefix):
                    events.append(self._apply_delete(kv.key, revision))
        self._commit(events)
        return TxnResult(succeeded=succeeded, revision=self.revision, gets=gets)

    def _apply_put(self, op: Put, revision: int) -> WatchEvent:
        old = self._data.get(op.key)
        if old is not None and old.lease and old.lease != op.lease:
            self._detach(old.lease, op.key)
        if old is None:
            kv = KeyValue(op.key, op.value, revision, revision, 1, op.lease)
        else:
            kv = replace(old, value=op.value, mod_revision=revision, version=old.version + 1, lease=op.lease)
        self._data[op.key] = kv
        if op.lease:
            self._leases[op.lease].keys.add(op.key)
        return WatchEvent("put", kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version)

    def _apply_delete(self, key: str, revision: int) -> WatchEvent:
        old = self._data.pop(key)
        if old.lease:
            self._detach(old.lease, key)
        return WatchEvent("delete", key, b"", 0, revision, 0)

    def _detach(self, lease_id: int, key: str) -> None:
        lease = self._leases.get(lease_id)
        if lease is not None:
            lease.keys.discard(key)

    def _revoke(self, lease_id: int) -> None:
        lease = self._leases.pop(lease_id)
        revision = self.revision + 1
        events = [self._apply_delete(key, revision) for key in sorted(lease.keys) if key in self._data]
        self._commit(events)

    def _commit(self, events: list[WatchEvent]) -> None:
        """One new revision when anything changed; record it for watchers and wake them."""
        if not events:
            return
        self.revision += 1
        if events[0].mod_revision != self.revision:
            raise RuntimeError(
                f"MemoryStore revision skew: events at {events[0].mod_revision}, store at {self.revision}"
            )
        self._history.append((self.revision, tuple(events)))
        if len(self._history) > self._history_revisions_max:
            self.compact(self._history[len(self._history) - self._history_revisions_max - 1][0])
        self._notify()

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def _wait_for_change(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        await fut

    def __repr__(self) -> str:
        return f"MemoryStore(prefix={self.keys.prefix!r}, revision={self.revision}, now_ms={self._now_ms})"
