"""The metadata store seam: plain data types, the MetadataStore protocol, and EtcdStore.

Every etcd call of the project goes through EtcdStore; the deterministic simulation
and fast unit tests use MemoryStore (memory_store.py) behind the same protocol.

Semantics are etcd's, and MemoryStore copies them:

- One global revision counts committed writes. A put, a delete that deleted
  something, a transaction whose executed branch wrote something, and a lease
  expiry that deleted keys each take exactly one new revision.
- Per key: create_revision (revision of the write that created this incarnation),
  mod_revision (revision of the last write), version (1 on creation, +1 per put;
  0 means "missing", which is what compare_missing compares).
- A compare on a missing key sees version, create_revision and mod_revision 0;
  a *value* compare on a missing key is always false.
- Watches deliver events in revision order; within one revision (one transaction
  or one lease expiry) in the order of the writes.

Operating errors are typed: CoordinatorUnavailable (etcd could not be reached within
the timeout: retriable), LeaseLost (a write named a lease that has expired),
WatchCompacted (a watch start revision is older than the retained history),
EtcdSpaceExceeded (etcd's NOSPACE alarm: its database reached its space quota).
Anything else is a CoordinatorError carrying etcd's own message.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Coroutine, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Protocol, Self, TypeAlias, TypeVar

import grpc
import grpc.aio
from etcd3aio import EtcdConnectionError, EtcdError, EtcdTransientError, prefix_range_end
from etcd3aio._protobuf import Compare as PbCompare
from etcd3aio._protobuf import (
    LeaseKeepAliveRequest,
    LeaseStub,
    RequestOp,
    WatchCreateRequest,
    WatchRequest,
    WatchResponse,
    WatchStub,
)
from etcd3aio.connections import ConnectionManager
from etcd3aio.kv import KVService
from etcd3aio.lease import LeaseService
from etcd3aio.maintenance import AlarmType, MaintenanceService

from coordinator.keys import DEFAULT_PREFIX, Keys
from coordinator.limits import (
    ETCD_CONNECT_RETRY_S,
    ETCD_CONNECT_TIMEOUT_S,
    ETCD_RANGE_PAGE_KEYS,
    ETCD_RECONNECT_BACKOFF_MS_MAX,
    ETCD_RECONNECT_BACKOFF_MS_MIN,
    ETCD_REQUEST_ATTEMPTS_MAX,
    ETCD_REQUEST_TIMEOUT_S,
    ETCD_RESPONSE_BYTES_MAX,
    ETCD_TXN_ATTEMPTS_MAX,
    WATCH_RECONNECT_BACKOFF_S_MAX,
    WATCH_RECONNECT_BACKOFF_S_MIN,
)

log = logging.getLogger("highwater.coordinator")

T = TypeVar("T")


# --- errors -------------------------------------------------------------------


class CoordinatorError(Exception):
    """Base of every error the coordinator package raises on purpose."""

    retriable = False


class CoordinatorUnavailable(CoordinatorError):
    """etcd did not answer within the timeout (down, paused, unreachable, or no leader)."""

    retriable = True


class LeaseLost(CoordinatorError):
    """A lease this process relies on has expired or was revoked: its keys are gone."""


class WatchCompacted(CoordinatorError):
    """A watch asked for history older than the store keeps; re-read, then watch again."""

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


class EtcdSpaceExceeded(CoordinatorError):
    """etcd's database reached its space quota (--quota-backend-bytes) and etcd raised the
    NOSPACE alarm: it refuses every write (offset commits, leader changes, registrations)
    until an operator compacts, defragments and disarms the alarm (deploy/README.md,
    "etcd's space"). Not retriable: waiting does not free space."""


# etcd's message when a write meets the NOSPACE alarm (gRPC RESOURCE_EXHAUSTED).
ETCD_NOSPACE_MESSAGE = "etcdserver: mvcc: database space exceeded"
# How to clear the alarm, quoted in the error and the log line.
ETCD_NOSPACE_REMEDY = (
    "compact and defragment etcd (etcdctl compact <revision>; etcdctl defrag), then "
    "`etcdctl alarm disarm`; or raise --quota-backend-bytes (see deploy/README.md, etcd's space)"
)


# --- data ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change. For a delete, value is b"" and create_revision/version are 0
    (as etcd reports it); mod_revision is the revision of the delete."""

    kind: Literal["put", "delete"]
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int


CompareTarget: TypeAlias = Literal["version", "value", "mod_revision", "create_revision"]
CompareOp: TypeAlias = Literal["==", "!=", "<", ">"]
_COMPARE_TARGETS = ("version", "value", "mod_revision", "create_revision")
_COMPARE_OPS = ("==", "!=", "<", ">")


@dataclass(frozen=True, slots=True)
class Compare:
    """One guard of a transaction: `target(key) op value`. Raises ValueError when malformed."""

    key: str
    target: CompareTarget
    op: CompareOp
    value: int | bytes

    def __post_init__(self) -> None:
        if self.target not in _COMPARE_TARGETS:
            raise ValueError(f"compare target must be one of {_COMPARE_TARGETS}, got {self.target!r}")
        if self.op not in _COMPARE_OPS:
            raise ValueError(f"compare op must be one of {_COMPARE_OPS}, got {self.op!r}")
        want = bytes if self.target == "value" else int
        if not isinstance(self.value, want) or isinstance(self.value, bool):
            raise ValueError(f"compare on {self.target} needs a {want.__name__} value, got {self.value!r}")


def compare_missing(key: str) -> Compare:
    """True when the key does not exist (version 0)."""
    return Compare(key, "version", "==", 0)


def compare_value(key: str, value: bytes) -> Compare:
    """True when the key exists and holds exactly this value."""
    return Compare(key, "value", "==", value)


def compare_version(key: str, version: int) -> Compare:
    return Compare(key, "version", "==", version)


def compare_mod_revision(key: str, mod_revision: int) -> Compare:
    """True when the key was last written at this revision (0: the key is missing)."""
    return Compare(key, "mod_revision", "==", mod_revision)


def compare_create_revision(key: str, create_revision: int) -> Compare:
    return Compare(key, "create_revision", "==", create_revision)


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class Get:
    key: str
    prefix: bool = False


Op: TypeAlias = Put | Delete | Get


@dataclass(frozen=True, slots=True)
class TxnResult:
    """succeeded: the compares held and the success branch ran (else the failure branch).
    revision: the store revision after the transaction.
    gets: the key-values of each Get op of the executed branch, in op order."""

    succeeded: bool
    revision: int
    gets: list[list[KeyValue]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class EtcdStatus:
    """How full etcd's database is, as the member this store talks to reports it.

    db_size_bytes: the backend file's size (what the quota is checked against; only a
    defragmentation shrinks it). db_size_in_use_bytes: the part holding data (compaction
    frees the rest for reuse). quota_bytes: the space quota (0: etcd did not say; before 3.6).
    nospace_alarm: the NOSPACE alarm is raised and every write fails."""

    db_size_bytes: int
    db_size_in_use_bytes: int
    quota_bytes: int
    nospace_alarm: bool
    revision: int


# --- the protocol ---------------------------------------------------------------


class MetadataStore(Protocol):
    """What the services may ask of the metadata store; EtcdStore and MemoryStore implement it.

    Keys are full keys (build them with `keys`). Every method may raise
    CoordinatorUnavailable; writes naming an expired lease raise LeaseLost.
    """

    keys: Keys

    async def get(self, key: str) -> KeyValue | None: ...

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]: ...

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int: ...

    async def delete(self, key: str, *, prefix: bool = False) -> int: ...

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult: ...

    async def grant_lease(self, ttl_s: int) -> int: ...

    async def revoke_lease(self, lease_id: int) -> None: ...

    async def keep_alive_once(self, lease_id: int) -> int: ...

    def watch_prefix(
        self, prefix: str, *, start_revision: int = 0
    ) -> AsyncGenerator[list[WatchEvent], None]: ...

    async def close(self) -> None: ...


# --- etcd ------------------------------------------------------------------------

_PB_TARGET = {
    "version": PbCompare.VERSION,
    "value": PbCompare.VALUE,
    "mod_revision": PbCompare.MOD,
    "create_revision": PbCompare.CREATE,
}
_PB_OP = {"==": PbCompare.EQUAL, "!=": PbCompare.NOT_EQUAL, "<": PbCompare.LESS, ">": PbCompare.GREATER}
# Watch stream failures after which the stream is re-opened (etcd restarted, connection
# reset, leader lost); any other status ends the watch with a CoordinatorError.
_WATCH_RETRY_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)


def parse_endpoints(endpoints: Sequence[str] | str) -> list[str]:
    """ "h1:p1,h2:p2" or ["http://h1:p1", ...] -> ["h1:p1", ...]; ValueError when empty."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    parsed = []
    for item in items:
        item = item.strip()
        for scheme in ("http://", "https://"):
            item = item.removeprefix(scheme)
        item = item.rstrip("/")
        if item:
            parsed.append(item)
    if not parsed:
        raise ValueError(f"no etcd endpoint given in {endpoints!r} (expected host:port[,host:port])")
    return parsed


def resolve_endpoints(endpoints: list[str]) -> list[str]:
    """Host names to IPv4 addresses: etcd3aio joins several endpoints into one `ipv4:` gRPC
    target, which takes addresses only (in compose, etcd members are named `etcd-1:2379`)."""
    out = []
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        try:
            ipaddress.ip_address(host)
            out.append(endpoint)
        except ValueError:
            try:
                info = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)
                out.append(f"{info[0][4][0]}:{port}")
            except (OSError, ValueError):
                out.append(endpoint)  # let the connection attempt report it
    return out


def _kv(pb: Any) -> KeyValue:
    return KeyValue(
        key=pb.key.decode(),
        value=bytes(pb.value),
        create_revision=pb.create_revision,
        mod_revision=pb.mod_revision,
        version=pb.version,
        lease=pb.lease,
    )


def _event(pb: Any) -> WatchEvent:
    # mvccpb.Event.EventType: PUT = 0, DELETE = 1.
    kv = pb.kv
    return WatchEvent(
        kind="delete" if pb.type == 1 else "put",
        key=kv.key.decode(),
        value=bytes(kv.value),
        create_revision=kv.create_revision,
        mod_revision=kv.mod_revision,
        version=kv.version,
    )


def _pb_compare(c: Compare) -> PbCompare:
    pb = PbCompare(key=c.key.encode(), target=_PB_TARGET[c.target], result=_PB_OP[c.op])
    if c.target == "value":
        pb.value = c.value
    elif c.target == "version":
        pb.version = c.value
    elif c.target == "mod_revision":
        pb.mod_revision = c.value
    else:
        pb.create_revision = c.value
    return pb


def _pb_op(op: Op) -> RequestOp:
    if isinstance(op, Put):
        return KVService.txn_op_put(op.key, op.value, lease=op.lease)
    if isinstance(op, Delete):
        return KVService.txn_op_delete(op.key, range_end=prefix_range_end(op.key) if op.prefix else None)
    if isinstance(op, Get):
        return KVService.txn_op_get(op.key, range_end=prefix_range_end(op.key) if op.prefix else None)
    raise TypeError(f"not a transaction op: {op!r}")


@dataclass(frozen=True, slots=True)
class EtcdTls:
    """TLS to etcd: the CA that signed etcd's certificate, and our client certificate
    (etcd's --client-cert-auth). server_name overrides the name checked in etcd's
    certificate (default: the endpoint's address)."""

    ca_cert: bytes
    cert_chain: bytes | None = None
    cert_key: bytes | None = None
    server_name: str | None = None


# Both connections to etcd (the store's and the keep-alive thread's) come back this fast
# after etcd restarts.
_RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", ETCD_RECONNECT_BACKOFF_MS_MIN),
    ("grpc.min_reconnect_backoff_ms", ETCD_RECONNECT_BACKOFF_MS_MIN),
    ("grpc.max_reconnect_backoff_ms", ETCD_RECONNECT_BACKOFF_MS_MAX),
]


class SyncLeaseClient:
    """etcd lease keep-alives over a synchronous gRPC channel (for a plain thread)."""

    def __init__(self, endpoints: list[str], *, tls: EtcdTls | None, request_timeout_s: float) -> None:
        self.endpoints = endpoints
        self.request_timeout_s = request_timeout_s
        manager = ConnectionManager(resolve_endpoints(endpoints))
        options = [*manager.grpc_options, *_RECONNECT_OPTIONS]
        if tls is None:
            self._channel = grpc.insecure_channel(manager.target, options=options)
        else:
            if tls.server_name is not None:
                options.append(("grpc.ssl_target_name_override", tls.server_name))
            credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.ca_cert, private_key=tls.cert_key, certificate_chain=tls.cert_chain
            )
            self._channel = grpc.secure_channel(manager.target, credentials, options=options)
        self._stub = LeaseStub(self._channel)

    def keep_alive_once(self, lease_id: int, timeout_s: float) -> int:
        """Refresh the lease once; its TTL in seconds, 0 when it no longer exists.

        Raises CoordinatorUnavailable when etcd does not answer within timeout_s.
        """
        call = self._stub.LeaseKeepAlive(
            iter([LeaseKeepAliveRequest(ID=lease_id)]), timeout=min(timeout_s, self.request_timeout_s)
        )
        try:
            resp = next(call)
        except StopIteration:
            raise CoordinatorUnavailable(
                f"etcd at {','.join(self.endpoints)} closed the lease keep-alive stream"
            ) from None
        except grpc.RpcError as exc:
            raise CoordinatorUnavailable(
                f"etcd at {','.join(self.endpoints)} unavailable for lease keep-alive: {exc.code().name}"
            ) from exc
        finally:
            call.cancel()
        return int(resp.TTL)

    def close(self) -> None:
        self._channel.close()


class ClosedOnExit:
    """`async with store:` closes the store on the way out; the class defines `close`."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.close()


class EtcdStore(ClosedOnExit):
    """MetadataStore over etcd v3 (etcd3aio on one grpc.aio channel).

    Owned by one process; safe to share between tasks of its event loop. Every unary
    call is bounded by ETCD_REQUEST_TIMEOUT_S (retries included); transactions are sent
    once (ETCD_TXN_ATTEMPTS_MAX), because a retried compare-and-swap could report
    "failed" for a first attempt that in fact applied.
    """

    def __init__(
        self,
        endpoints: list[str],
        keys: Keys,
        channel: grpc.aio.Channel,
        *,
        request_timeout_s: float = ETCD_REQUEST_TIMEOUT_S,
    ) -> None:
        self.endpoints = endpoints
        self.keys = keys
        self.request_timeout_s = request_timeout_s
        self._channel = channel
        self._kv = KVService(channel, max_attempts=ETCD_REQUEST_ATTEMPTS_MAX)
        self._lease = LeaseService(channel, max_attempts=ETCD_REQUEST_ATTEMPTS_MAX)
        self._watch = WatchStub(channel)
        self._maintenance = MaintenanceService(channel, max_attempts=ETCD_REQUEST_ATTEMPTS_MAX)
        self._closed = False
        self._tls: EtcdTls | None = None

    @classmethod
    async def connect(
        cls,
        endpoints: list[str] | str,
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout_s: float = ETCD_CONNECT_TIMEOUT_S,
        request_timeout_s: float = ETCD_REQUEST_TIMEOUT_S,
        tls: EtcdTls | None = None,
    ) -> EtcdStore:
        """Open a channel and check that etcd answers a read within timeout_s.

        With `tls`, the channel is TLS (and mutual TLS when it carries a client certificate).

        Keeps trying until then (etcd may still be starting). Raises
        CoordinatorUnavailable naming the endpoints when it never answers, and
        ValueError for an empty endpoint list or a malformed prefix.
        """
        parsed = parse_endpoints(endpoints)
        keys = Keys(prefix)
        manager = ConnectionManager(resolve_endpoints(parsed))
        manager.grpc_options.extend(
            [
                *_RECONNECT_OPTIONS,
                ("grpc.max_receive_message_length", ETCD_RESPONSE_BYTES_MAX),
            ]
        )
        channel = (
            manager.get_channel(
                ca_cert=tls.ca_cert,
                cert_key=tls.cert_key,
                cert_chain=tls.cert_chain,
                tls_server_name=tls.server_name,
            )
            if tls is not None
            else manager.get_channel()
        )
        store = cls(parsed, keys, channel, request_timeout_s=request_timeout_s)
        store._tls = tls
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last_error: BaseException | None = None
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                await store._kv.get(
                    keys.controller_epoch, timeout=min(remaining, request_timeout_s), max_attempts=1
                )
            except (EtcdError, TimeoutError, grpc.aio.AioRpcError) as exc:
                last_error = exc
                await asyncio.sleep(min(ETCD_CONNECT_RETRY_S, max(0.0, deadline - loop.time())))
                continue
            log.info("connected to etcd at %s (key prefix %s)", ",".join(parsed), keys.prefix)
            return store
        await store.close()
        raise CoordinatorUnavailable(
            f"etcd at {','.join(parsed)} did not answer within {timeout_s:.1f} s ({last_error}); "
            "check that the etcd server is running and that --etcd names it"
        )

    # --- error mapping ------------------------------------------------------------

    def _unavailable(self, operation: str, exc: BaseException) -> CoordinatorUnavailable:
        detail = str(exc) or type(exc).__name__
        return CoordinatorUnavailable(
            f"etcd at {','.join(self.endpoints)} is unreachable ({operation}: {detail}); "
            "check that the etcd server is running and that --etcd names it"
        )

    async def _call(self, operation: str, awaitable: Awaitable[T]) -> T:
        """Await one etcd call, turning etcd3aio/gRPC failures into coordinator errors."""
        if self._closed:
            if isinstance(awaitable, Coroutine):
                awaitable.close()
            raise CoordinatorError(f"etcd {operation}: the store is closed")
        try:
            return await awaitable
        except (EtcdConnectionError, EtcdTransientError, TimeoutError) as exc:
            raise self._unavailable(operation, exc) from exc
        except grpc.aio.AioRpcError as exc:
            raise self._rpc_error(operation, exc) from exc
        except EtcdError as exc:
            raise CoordinatorError(f"etcd {operation} failed: {exc}") from exc

    def _rpc_error(self, operation: str, exc: grpc.aio.AioRpcError) -> CoordinatorError:
        details = exc.details() or ""
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return self._unavailable(operation, exc)
        if ETCD_NOSPACE_MESSAGE in details:
            message = (
                f"etcd at {','.join(self.endpoints)} refused a write ({operation}): its database reached "
                f"its space quota and the NOSPACE alarm is raised ({details}); every write fails until "
                f"an operator clears it: {ETCD_NOSPACE_REMEDY}"
            )
            log.error("%s", message)
            return EtcdSpaceExceeded(message)
        if exc.code() == grpc.StatusCode.NOT_FOUND and "lease not found" in details:
            return LeaseLost(f"etcd {operation}: {details}")
        return CoordinatorError(f"etcd {operation} failed: {exc.code().name}: {details}")

    # --- keys -----------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        """The key's current value, or None when it does not exist."""
        resp = await self._call("get", self._kv.get(key, timeout=self.request_timeout_s))
        return _kv(resp.kvs[0]) if resp.kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key starting with prefix, sorted by key, and the revision they were read at.

        Watch from revision + 1 to see every later change exactly once. Large ranges
        are read in pages at that one revision, so the result is a consistent snapshot.
        """
        range_end = prefix_range_end(prefix)
        start: bytes = prefix.encode()
        revision = 0
        result: list[KeyValue] = []
        while True:
            resp = await self._call(
                "get_prefix",
                self._kv.get(
                    start,
                    range_end=range_end,
                    revision=revision,
                    limit=ETCD_RANGE_PAGE_KEYS,
                    timeout=self.request_timeout_s,
                ),
            )
            if revision == 0:
                revision = resp.header.revision
            result.extend(_kv(pb) for pb in resp.kvs)
            if not resp.more or not resp.kvs:
                return result, revision
            start = resp.kvs[-1].key + b"\x00"

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write the key (attached to lease when non-zero); returns the new revision.
        Raises LeaseLost when the lease has expired."""
        resp = await self._call("put", self._kv.put(key, value, lease=lease, timeout=self.request_timeout_s))
        return int(resp.header.revision)

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        """Delete the key (or every key under it); returns how many were deleted."""
        range_end = prefix_range_end(key) if prefix else None
        resp = await self._call(
            "delete", self._kv.delete(key, range_end=range_end, timeout=self.request_timeout_s)
        )
        return int(resp.deleted)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """Atomically: if every compare holds run success, else failure.

        Raises LeaseLost when a Put of the executed branch names an expired lease (then
        nothing is written), CoordinatorError for a request etcd refuses (more than
        ETCD_TXN_OPS_MAX ops, one key written twice), CoordinatorUnavailable when etcd
        does not answer: the transaction may or may not have been applied.
        """
        resp = await self._call(
            "txn",
            self._kv.txn(
                [_pb_compare(c) for c in compares],
                [_pb_op(op) for op in success],
                [_pb_op(op) for op in failure],
                timeout=self.request_timeout_s,
                max_attempts=ETCD_TXN_ATTEMPTS_MAX,
            ),
        )
        gets = [
            [_kv(pb) for pb in r.response_range.kvs]
            for r in resp.responses
            if r.WhichOneof("response") == "response_range"
        ]
        return TxnResult(succeeded=bool(resp.succeeded), revision=int(resp.header.revision), gets=gets)

    # --- maintenance ----------------------------------------------------------------

    async def status(self) -> EtcdStatus:
        """The database size, quota and NOSPACE alarm of etcd (two reads; no write)."""
        status = await self._call("status", self._maintenance.status(timeout=self.request_timeout_s))
        alarms = await self._call("alarm list", self._maintenance.alarms(timeout=self.request_timeout_s))
        return EtcdStatus(
            db_size_bytes=int(status.dbSize),
            db_size_in_use_bytes=int(status.dbSizeInUse),
            quota_bytes=int(status.dbSizeQuota),
            nospace_alarm=any(a.alarm == AlarmType.NOSPACE for a in alarms.alarms),
            revision=int(status.header.revision),
        )

    # --- leases ---------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> int:
        """A new lease of ttl_s seconds (etcd may round a short TTL up); returns its id."""
        resp = await self._call("lease grant", self._lease.grant(ttl_s, timeout=self.request_timeout_s))
        if resp.error:
            raise CoordinatorError(f"etcd lease grant of {ttl_s} s failed: {resp.error}")
        if ttl_s != resp.TTL:
            log.info("etcd granted lease %x with TTL %d s instead of %d s", resp.ID, resp.TTL, ttl_s)
        return int(resp.ID)

    async def revoke_lease(self, lease_id: int) -> None:
        """Revoke the lease, deleting its keys at once. A lease already gone is not an error."""
        try:
            await self._call("lease revoke", self._lease.revoke(lease_id, timeout=self.request_timeout_s))
        except LeaseLost:
            log.debug("lease %x was already gone when revoked", lease_id)

    def open_keepalive_client(self) -> SyncLeaseClient:
        """A second, synchronous connection to the same etcd, for LeaseKeeper's own thread.

        Synchronous gRPC, not a second asyncio loop: grpc.aio shares one completion queue
        per process between loops, and a loop that ends leaves it calling into a closed one.
        """
        return SyncLeaseClient(self.endpoints, tls=self._tls, request_timeout_s=self.request_timeout_s)

    async def keep_alive_once(self, lease_id: int) -> int:
        """Refresh the lease once; returns its TTL in seconds, 0 when it no longer exists."""

        async def one_keepalive() -> int:
            stream = self._lease.keep_alive(lease_id)
            try:
                async with asyncio.timeout(self.request_timeout_s):
                    resp = await stream.read()
            finally:
                stream.cancel()
            if resp is grpc.aio.EOF:
                raise CoordinatorUnavailable(
                    f"etcd at {','.join(self.endpoints)} closed the lease keep-alive stream"
                )
            return int(resp.TTL)

        return await self._call("lease keep-alive", one_keepalive())

    # --- watches --------------------------------------------------------------------

    async def watch_prefix(
        self, prefix: str, *, start_revision: int = 0
    ) -> AsyncGenerator[list[WatchEvent], None]:
        """Yield the events under prefix, one list per etcd watch response, in revision order.

        start_revision 0 means "changes from now on"; to follow a snapshot from
        get_prefix, pass its revision + 1. When the stream breaks (etcd restarted, the
        connection reset) it is re-opened from the revision after the last delivered
        event, so nothing is lost or repeated; while etcd is down the iterator simply
        waits. Cancelling the consuming task, or aclose() on the iterator, ends the
        stream. Raises WatchCompacted when the history needed was compacted away, and
        CoordinatorError when etcd refuses the watch.

        etcd3aio's own watch loop resumes from the response header revision, which can
        skip events when a stream breaks during catch-up; hence this loop of our own.
        """
        if self._closed:
            raise CoordinatorError(f"etcd watch {prefix}: the store is closed")
        key = prefix.encode()
        range_end = prefix_range_end(key)
        next_revision = start_revision
        backoff_s = WATCH_RECONNECT_BACKOFF_S_MIN
        while not self._closed:
            create = WatchCreateRequest(key=key, range_end=range_end, start_revision=next_revision)

            async def requests(create: WatchCreateRequest = create) -> AsyncIterator[WatchRequest]:
                yield WatchRequest(create_request=create)
                # Keep the request side open: closing it would end the watch.
                await asyncio.Future()

            call = self._watch.Watch(requests())
            try:
                async for resp in call:
                    watch_resp: WatchResponse = resp
                    if watch_resp.compact_revision:
                        raise WatchCompacted(
                            f"watch on {prefix} from revision {next_revision}: etcd compacted history up to "
                            f"revision {watch_resp.compact_revision}; re-read and watch again",
                            watch_resp.compact_revision,
                        )
                    if watch_resp.canceled:
                        raise CoordinatorError(
                            f"etcd cancelled the watch on {prefix}: {watch_resp.cancel_reason}"
                        )
                    if watch_resp.created:
                        backoff_s = WATCH_RECONNECT_BACKOFF_S_MIN
                        if next_revision == 0:
                            # "From now on" becomes a definite revision, so a reconnect
                            # before the first event still misses nothing.
                            next_revision = watch_resp.header.revision + 1
                    if watch_resp.events:
                        events = [_event(pb) for pb in watch_resp.events]
                        next_revision = events[-1].mod_revision + 1
                        yield events
                if self._is_closed():
                    return
                log.warning("etcd ended the watch on %s; re-opening from revision %d", prefix, next_revision)
            except grpc.aio.AioRpcError as exc:
                if self._is_closed():
                    return
                if exc.code() not in _WATCH_RETRY_CODES:
                    raise self._rpc_error(f"watch {prefix}", exc) from exc
                log.warning(
                    "watch on %s broke (%s: %s); re-opening from revision %d in %.2f s",
                    prefix,
                    exc.code().name,
                    exc.details(),
                    next_revision,
                    backoff_s,
                )
            finally:
                call.cancel()
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, WATCH_RECONNECT_BACKOFF_S_MAX)

    # --- lifecycle --------------------------------------------------------------------

    def _is_closed(self) -> bool:
        """Read through a call: close() may run while a watch awaits, which mypy's narrowing of
        `self._closed` after `while not self._closed` cannot see."""
        return self._closed

    async def close(self) -> None:
        """Close the channel; open watches end, later calls raise CoordinatorError."""
        if self._closed:
            return
        self._closed = True
        await self._channel.close()

    def __repr__(self) -> str:
        return f"EtcdStore({','.join(self.endpoints)}, prefix={self.keys.prefix!r})"
