"""A small synchronous gRPC client of GatewayService for the connector's driver and tasks.

Why not clients.Consumer / clients.Producer: a Spark task reads a fixed offset range
and writes batches it numbers itself (a derived producer id, see writer.py), which the
asyncio clients with their own loop thread, buffers and sequence bookkeeping are not
shaped for; raw Fetch / Produce / ListOffsets / Metadata (the protos are the contract)
cost one RPC per call and nothing else. Nothing here is pickled: readers and writers
create a `GatewayClient` inside read() / write() and close it there.

The gRPC channels themselves outlive the clients: one process keeps one channel per
address and credentials (`_SharedChannels`), and closing a client leaves them open.
Spark reuses its Python workers (spark.python.worker.reuse) for the tasks and the
planning of many queries, and a fresh channel cost each of them a TCP (or TLS) connect
and, at close, up to 200 ms of waiting: grpc's channel_ready_future leaves a thread
polling the channel's state in 200 ms steps, and Channel.close() waits for that poll to
end. The driver's planning closed its client after ~20 ms of calls, so every batch query
paid ~190 ms of wall time before its first task (bench/RESULTS.md, "Spark connector").

Failover follows the client library's rules (clients/common/failover.py, the same walk the
asyncio clients drive): the bootstrap addresses are tried in turn until one connects, within
the connect timeout; after that, a call that ends UNAVAILABLE moves on to the next gateway.
Channels, their options, TLS and which status codes mean "gone" are the transport package's
(clients/common/transport/), and the leaders come out of Metadata by clients/common/leader_map.py.
What stays here is the connector's own: blocking calls from Spark's worker threads, channels
shared across the tasks a reused worker runs, the direct and local reads of a planned range,
and `HighwaterSparkError` messages that name the option that set the addresses, so an
unreachable gateway fails the query with a sentence, not a stack of gRPC internals.

Channels are plaintext, or TLS with the CA, client certificate and bearer token of the
highwater.ssl.* / highwater.auth.token options (ClientSettings carries the bytes, read on
the driver). A client with a token and no certificate never fetches from leaders: brokers'
registered ports are mutual TLS. Authentication and ACL refusals become sentences that
name the option to set or the ACL to grant.

Reading tasks fetch from partition leaders directly (`fetch_future`, option
highwater.fetch.from.leaders, default true), as Kafka's consumers do: the gateway's
Metadata names each partition's leader and its address. The answer is the same
message the gateway would forward (the broker serves consumer fetches, replica id -1,
below the high watermark only, or the last stable offset read_committed); what changes is
that the bytes skip a hop that costs the gateway ~0.4 µs of CPU per 100-byte record.
Anything that goes wrong falls back to the gateway path: a leader that does not accept a connection within
LEADER_CONNECT_TIMEOUT_MS is not tried again by this client, a failed direct call is
repeated through the gateway, and a partition whose leader answers a retriable error
(leadership moved) has its leader looked up again before the next Fetch.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

import grpc

from clients.common import errors
from clients.common.failover import BootstrapError, FailoverWalk, GatewayRotation, bootstrap_addresses
from clients.common.fetch_request import READ_COMMITTED, READ_UNCOMMITTED, consumer_fetch_request
from clients.common.leader_map import LeaderMap
from clients.common.transport.channels import (
    UNREACHABLE_CODES,
    blocking_channel,
    unreachable_reason,
    wait_ready_blocking,
)
from clients.common.transport.local_reads import NotReadableHere, read_located
from clients.common.transport.tls import ClientTls
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import broker_pb2, common_pb2, gateway_pb2_grpc
from spark_connector import limits
from spark_connector.fetch_response import FetchedPartition, MalformedFetchResponse, parse_fetch_response
from spark_connector.options import ClientSettings

# The broker's Fetch, called with the answer left as bytes (see _leader_address).
_FETCH = broker_pb2.DESCRIPTOR.services_by_name["BrokerService"].methods_by_name["Fetch"]
BROKER_FETCH_METHOD = f"/{_FETCH.containing_service.full_name}/{_FETCH.name}"

log = logging.getLogger("highwater.spark")

T = TypeVar("T")

# Per-partition codes that a retry after a short back-off may fix (leadership moving, a leader
# restarting, the ISR briefly too small): the error flags' policy, except
# UNKNOWN_TOPIC_OR_PARTITION, which for a planned read means the topic was deleted under it.
RETRIABLE_CODES = errors.RETRIABLE_CODES - {common_pb2.UNKNOWN_TOPIC_OR_PARTITION}
# The generated *_pb2_grpc stubs are untyped (pyproject's mypy overrides): typed here, once.
_new_stub = cast(
    "Callable[[grpc.Channel], gateway_pb2_grpc.GatewayServiceStub]", gateway_pb2_grpc.GatewayServiceStub
)


class HighwaterSparkError(RuntimeError):
    """An operating error the query cannot recover from; the message says what and which option."""


def code_name(code: int) -> str:
    return common_pb2.ErrorCode.Name(code) if code in common_pb2.ErrorCode.values() else str(code)


def not_authorized(topic: str, operation: str, detail: str = "") -> HighwaterSparkError:
    """TOPIC_AUTHORIZATION_FAILED as a sentence: which topic, which operation, how to grant it."""
    return HighwaterSparkError(
        f"not authorized to {operation} topic {topic!r} "
        f"(TOPIC_AUTHORIZATION_FAILED{': ' + detail if detail else ''})"
        f": the ACL authorizer refused the principal of this query's credentials (highwater.ssl.certfile or "
        f"highwater.auth.token); an operator grants it with `highwater acl add --principal User:<name> "
        f"--operation {operation} --topic {topic}` (docs/SECURITY.md)"
    )


# What a channel is made of: its address and the credentials on it (TLS material, token).
_ChannelKey = tuple[str, bytes | None, bytes | None, bytes | None, str | None]


class _SharedChannels:
    """The process's gRPC channels, one per address and credentials, shared by its clients.

    Channels are thread-safe and reconnect by themselves, so a client may use one another
    client made; only an address that never connected is dropped (and closed). Bounded by
    limits.SHARED_CHANNELS_MAX: the least recently used channel beyond it is closed.
    """

    def __init__(self, max_channels: int) -> None:
        self._max_channels = max_channels
        self._lock = threading.Lock()
        self._channels: OrderedDict[_ChannelKey, grpc.Channel] = OrderedDict()

    def get(self, key: _ChannelKey, make: Callable[[], grpc.Channel]) -> grpc.Channel:
        evicted: list[grpc.Channel] = []
        with self._lock:
            channel = self._channels.get(key)
            if channel is None:
                channel = self._channels[key] = make()
                while len(self._channels) > self._max_channels:
                    evicted.append(self._channels.popitem(last=False)[1])
            else:
                self._channels.move_to_end(key)
        for old in evicted:  # outside the lock: a close may wait for grpc's state poll
            old.close()
        return channel

    def discard(self, key: _ChannelKey, channel: grpc.Channel) -> None:
        """Drop and close `channel` (it never connected), unless another has replaced it."""
        with self._lock:
            if self._channels.get(key) is channel:
                del self._channels[key]
        channel.close()


_SHARED_CHANNELS = _SharedChannels(limits.SHARED_CHANNELS_MAX)


class GatewayClient:
    """Blocking calls to the gateways of `bootstrap`; one per task or per driver-side reader.

    Its channels come from, and stay in, the process's `_SharedChannels`. With `read_committed`
    (kafka.isolation.level=read_committed) its Fetches and ListOffsets ask for isolation level
    read_committed: Fetches read below the last stable offset and name the aborted transactions
    of what they return, and "latest" (-1) is the last stable offset.
    """

    def __init__(self, bootstrap: str, settings: ClientSettings, *, read_committed: bool = False) -> None:
        try:
            self.rotation = GatewayRotation(bootstrap_addresses(bootstrap))
        except BootstrapError as error:
            raise HighwaterSparkError(f"option 'bootstrap': {error}") from None
        self.settings = settings
        self.read_committed = read_committed
        self._isolation_level = READ_COMMITTED if read_committed else READ_UNCOMMITTED
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, gateway_pb2_grpc.GatewayServiceStub] = {}
        self._connected: set[str] = set()
        # Direct fetches: partition -> its leader's address, and one channel per leader.
        self._leaders = LeaderMap()
        self._leader_channels: dict[str, grpc.Channel] = {}
        # Per leader, its Fetch method answering the raw bytes (parse_fetch_response reads them).
        self._leader_fetch: dict[str, grpc.UnaryUnaryMultiCallable] = {}
        self._unreachable_leaders: set[str] = set()
        # Leaders whose files this process cannot read (another host, no permission).
        self._remote_leaders: set[str] = set()
        # Brokers' registered ports are mutual TLS on a secure cluster: a client without a
        # certificate (a token only) cannot connect there, so it reads through the gateway.
        self._direct_fetch = settings.fetch_from_leaders and (
            not settings.secure or settings.cert_chain is not None
        )

    def close(self) -> None:
        """Forget this client's state; its channels stay open for the next client (_SharedChannels)."""
        self._channels.clear()
        self._stubs.clear()
        self._connected.clear()
        self._leader_channels.clear()
        self._leader_fetch.clear()
        self._leaders.clear()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- connection and failover ------------------------------------------------------

    @property
    def addresses(self) -> list[str]:
        return self.rotation.addresses

    def _walk(self, deadline: float) -> FailoverWalk:
        # No pause between rounds: a task's failover is bounded by connect.timeout.ms alone,
        # and each address's wait for a connection (a slice of it) already spaces the rounds.
        return self.rotation.walk(deadline, pause_s=0.0)

    def _stub(self, walk: FailoverWalk) -> tuple[str, gateway_pb2_grpc.GatewayServiceStub]:
        """The current gateway's stub once its channel is ready, trying each address in turn."""
        while True:
            address = self.rotation.current
            if address not in self._channels:
                self._channels[address] = self._channel(address)
                self._stubs[address] = _new_stub(self._channels[address])
            if address in self._connected:
                return address, self._stubs[address]
            # Each address gets its share of the connect timeout, so one dead gateway first in
            # the list cannot use it all.
            share_s = self.settings.connect_timeout_ms / 1000 / len(self.addresses)
            remaining_s = walk.connect_deadline - time.monotonic()
            why = wait_ready_blocking(self._channels[address], max(min(remaining_s, share_s), 0.05))
            if not why:
                self._connected.add(address)
                return address, self._stubs[address]
            if walk.failed(address, why, time.monotonic()) is None:
                raise self._unreachable(walk)

    def _unreachable(self, walk: FailoverWalk) -> HighwaterSparkError:
        hint = (
            "; if the cluster uses TLS, set highwater.ssl.cafile (and a client certificate or "
            "highwater.auth.token)"
            if not self.settings.secure
            else "; with TLS, check that highwater.ssl.cafile is the cluster's CA, and that a client "
            "without a certificate (token only) names the gateways' client ports"
        )
        return HighwaterSparkError(
            f"option 'bootstrap': no Highwater gateway answered within "
            f"{self.settings.connect_timeout_ms} ms (highwater.connect.timeout.ms): {walk.tried()}{hint}"
        )

    def _channel_key(self, address: str) -> _ChannelKey:
        s = self.settings
        return (address, s.ca_cert, s.private_key, s.cert_chain, s.token)

    def _channel(self, address: str) -> grpc.Channel:
        """The process's channel to `address` with this client's credentials (_SharedChannels)."""
        return _SHARED_CHANNELS.get(self._channel_key(address), functools.partial(self._new_channel, address))

    def _new_channel(self, address: str) -> grpc.Channel:
        """A plaintext channel, or TLS with the CA, client certificate and token the options gave
        (the transport's ClientTls: gRPC sends the token only over TLS)."""
        s = self.settings
        tls = ClientTls(s.ca_cert, s.cert_chain, s.private_key, s.token) if s.secure else None
        return blocking_channel(address, tls)

    def _rpc_error(self, method: str, address: str, error: grpc.RpcError) -> HighwaterSparkError:
        """A sentence for a failed call; authentication and authorization failures say what to set."""
        status = error.code()
        details = error.details()
        if status == grpc.StatusCode.UNAUTHENTICATED:
            return HighwaterSparkError(
                f"{method} to gateway {address}: the cluster did not accept this query's credentials "
                f"(UNAUTHENTICATED: {details}); set highwater.auth.token to a valid token, or "
                "highwater.ssl.certfile / highwater.ssl.keyfile to a certificate of the cluster's CA"
            )
        if status == grpc.StatusCode.PERMISSION_DENIED:
            return HighwaterSparkError(
                f"{method} to gateway {address}: not authorized (PERMISSION_DENIED: {details}); the "
                "principal "
                "of this query's credentials needs an ACL for it (`highwater acl add`, docs/SECURITY.md)"
            )
        return HighwaterSparkError(f"{method} to gateway {address} failed: {status.name} {details}")

    def call(self, method: str, request: Any, *, timeout_ms: int | None = None) -> Any:
        """Send `request` to GatewayService.`method`, failing over between gateways."""
        walk = self._walk(time.monotonic() + self.settings.connect_timeout_ms / 1000)
        timeout_s = (timeout_ms or self.settings.request_timeout_ms) / 1000
        while True:
            address, stub = self._stub(walk)
            try:
                return getattr(stub, method)(request, timeout=timeout_s)
            except grpc.RpcError as error:
                if error.code() not in UNREACHABLE_CODES:
                    raise self._rpc_error(method, address, error) from None
                self._connected.discard(address)
                if walk.failed(address, unreachable_reason(error), time.monotonic()) is None:
                    raise self._rpc_error(method, address, error) from None
                log.info("gateway %s: %s %s; trying the next one", address, method, error.code().name)

    def call_future(self, method: str, request: Any) -> Callable[[], Any]:
        """Start `method` now and return a function that waits for its answer.

        Used to keep one Fetch in flight while the previous answer is decoded. A failed
        future falls back to a plain (failing-over) call.
        """
        _, stub = self._stub(self._walk(time.monotonic() + self.settings.connect_timeout_ms / 1000))
        future = getattr(stub, method).future(request, timeout=self.settings.request_timeout_ms / 1000)

        def result() -> Any:
            try:
                return future.result()
            except grpc.RpcError:
                return self.call(method, request)

        return result

    def fetch_future(
        self, tp: TopicPartitionKey, offset: int, max_bytes: int, max_wait_ms: int = 0, *, locate: bool = True
    ) -> Callable[[], FetchedPartition]:
        """Start a Fetch of one partition at its leader (or through a gateway); return a waiter.

        The waiter returns the partition's answer whichever way it came; from a leader its
        records are a view of the bytes gRPC received (spark_connector/fetch_response.py).
        A direct call that fails, or answers bytes that are not a FetchResponse, is repeated
        through the gateway (with its failover); a retriable per-partition error from a
        leader (it no longer leads) makes the next Fetch of that partition look the leader
        up again. The caller handles per-partition errors as for any Fetch.

        With highwater.local.reads (and `locate`), the leader is asked where the records lie
        and they are read from its file when it is on this host (clients/local_reads.py); a
        leader on another host is asked for bytes from then on.
        """
        request = self.fetch_request(tp, offset, max_bytes, max_wait_ms)
        address = self._leader_address(tp) if self._direct_fetch else None
        if address is None:
            waiter = self.call_future("Fetch", request)
            return lambda: FetchedPartition.from_proto(waiter())
        request.locate_records = locate and self.settings.local_reads and address not in self._remote_leaders
        call, timeout_s = self._leader_fetch[address], self.settings.request_timeout_ms / 1000
        answer: Callable[[], tuple[FetchedPartition, NotReadableHere | None]]
        if request.locate_records:
            # No gRPC message carries the records: locate more per call (limits.LOCAL_READ_BYTES).
            located_bytes = max(max_bytes, limits.LOCAL_READ_BYTES)
            request.max_bytes = request.topics[0].partitions[0].partition_max_bytes = located_bytes
            # Located and read when the answer is wanted, on the caller's thread. Not a gRPC
            # future: on a blocking channel each starts a thread of its own, which cost ~1.8 ms
            # of CPU per Fetch; a reading thread of our own to read ahead cost more CPU than the
            # overlap won (bench/RESULTS.md, "Spark connector").
            answer = functools.partial(_locate_and_read, call, request, timeout_s)
        else:
            fetched = call.future(request, timeout=timeout_s).result

            def answer() -> tuple[FetchedPartition, NotReadableHere | None]:
                return parse_fetch_response(fetched()), None

        def through_gateway() -> FetchedPartition:  # bytes, as much as a fetched answer holds
            return FetchedPartition.from_proto(
                self.call("Fetch", self.fetch_request(tp, offset, max_bytes, max_wait_ms))
            )

        def result() -> FetchedPartition:
            try:
                part, not_here = answer()
            except grpc.RpcError as error:
                log.info(
                    "leader %s of %s-%d: Fetch %s; reading through the gateway",
                    address,
                    tp[0],
                    tp[1],
                    error.code().name,
                )
                self._leaders.forget(tp)
                return through_gateway()
            except MalformedFetchResponse as error:
                log.warning(
                    "leader %s of %s-%d: unreadable Fetch answer (%s); reading through the gateway",
                    address,
                    tp[0],
                    tp[1],
                    error,
                )
                self._leaders.forget(tp)
                return through_gateway()
            if part.error_code != common_pb2.NONE:
                self._leaders.forget(tp)  # leadership moved, or the topic went: look again next time
            if part.error_code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION:
                # The reader takes this code for a deleted topic (data loss); a broker's metadata
                # may lag the gateway's, so the gateway, whose answer that path was built on, decides.
                return through_gateway()
            if not_here is not None:
                if not_here.permanent:
                    log.info(
                        "leader %s: no short-circuit local reads from here (%s); fetching the bytes",
                        address,
                        not_here,
                    )
                    self._remote_leaders.add(address)
                else:
                    log.debug("leader %s of %s-%d: %s; fetching the bytes", address, tp[0], tp[1], not_here)
                return self.fetch_future(tp, offset, max_bytes, max_wait_ms, locate=False)()
            return part

        return result

    def _leader_address(self, tp: TopicPartitionKey) -> str | None:
        """The address of `tp`'s leader if it is known and reachable, else None (use a gateway)."""
        address = self._leaders.get(tp)
        if address is None:
            self._remember_leaders(self.metadata([tp[0]]))
            address = self._leaders.get(tp)
            if address is None:
                return None
        if address in self._unreachable_leaders:
            return None
        if address not in self._leader_channels:
            channel = self._channel(address)
            if wait_ready_blocking(channel, limits.LEADER_CONNECT_TIMEOUT_MS / 1000):
                _SHARED_CHANNELS.discard(self._channel_key(address), channel)
                log.info(
                    "leader %s does not accept connections within %d ms: reading through the gateway",
                    address,
                    limits.LEADER_CONNECT_TIMEOUT_MS,
                )
                self._unreachable_leaders.add(address)
                return None
            self._leader_channels[address] = channel
            # The generated stub would parse the answer into a message (copying the records
            # twice); None as deserializer hands over gRPC's bytes as they are.
            self._leader_fetch[address] = channel.unary_unary(
                BROKER_FETCH_METHOD,
                request_serializer=common_pb2.FetchRequest.SerializeToString,
                response_deserializer=None,
            )
        return address

    def _remember_leaders(self, response: common_pb2.MetadataResponse) -> None:
        self._leaders.remember(response)

    def known_leaders(self) -> dict[TopicPartitionKey, str]:
        """Partition -> leader address, as this client's last Metadata answers named them."""
        return self._leaders.known()

    def hint_leader(self, tp: TopicPartitionKey, address: str) -> None:
        """Fetch `tp` from `address` until it answers otherwise (a leader the driver planned with)."""
        self._leaders.hint(tp, address)

    def retry(self, what: str, attempt: Callable[[], T | None]) -> T:
        """Run `attempt` until it returns non-None, backing off, within the retry timeout."""
        deadline = time.monotonic() + self.settings.retry_timeout_ms / 1000
        while True:
            result = attempt()
            if result is not None:
                return result
            if time.monotonic() >= deadline:
                raise HighwaterSparkError(
                    f"{what}: still failing after highwater.retry.timeout.ms="
                    f"{self.settings.retry_timeout_ms} ms"
                )
            time.sleep(limits.RETRY_BACKOFF_MS / 1000)

    # --- the calls ---------------------------------------------------------------------

    def metadata(self, topics: Iterable[str] = ()) -> common_pb2.MetadataResponse:
        response: common_pb2.MetadataResponse = self.call(
            "Metadata", common_pb2.MetadataRequest(topics=list(topics))
        )
        return response

    def partitions(self, topics: Iterable[str] = ()) -> dict[str, list[int] | None]:
        """topic -> its partition ids (None: the topic does not exist). Empty `topics`: all topics.

        Remembers the leaders the answer names (known_leaders)."""
        response = self.metadata(topics)
        self._remember_leaders(response)
        out: dict[str, list[int] | None] = {}
        for t in response.topics:
            if t.error_code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION:
                out[t.name] = None
            elif t.error_code == common_pb2.TOPIC_AUTHORIZATION_FAILED:
                raise not_authorized(t.name, "Describe", t.error_message)
            elif t.error_code != common_pb2.NONE:
                raise HighwaterSparkError(
                    f"metadata of topic {t.name!r}: {code_name(t.error_code)} {t.error_message}"
                )
            else:
                out[t.name] = sorted(p.partition for p in t.partitions)
        for topic in topics:
            out.setdefault(topic, None)
        return out

    def list_offsets(
        self, timestamps: Mapping[TopicPartitionKey, int]
    ) -> dict[TopicPartitionKey, tuple[int, int]]:
        """(topic, partition) -> (offset, error code) for ListOffsets timestamps (-2, -1 or ms).
        Latest (-1) is the high watermark, or the last stable offset for a read_committed client.

        Retriable per-partition errors are retried; others are returned for the caller
        to explain (UNKNOWN_TOPIC_OR_PARTITION above all). Offset is -1 when no record has
        a timestamp at or after the one asked.
        """
        pending = dict(timestamps)
        out: dict[TopicPartitionKey, tuple[int, int]] = {}

        def attempt() -> bool | None:
            by_topic: dict[str, list[common_pb2.ListOffsetsPartition]] = {}
            for (topic, partition), ts in pending.items():
                by_topic.setdefault(topic, []).append(
                    common_pb2.ListOffsetsPartition(
                        partition=partition, timestamp=ts, current_leader_epoch=-1
                    )
                )
            response = self.call(
                "ListOffsets",
                common_pb2.ListOffsetsRequest(
                    replica_id=-1,
                    topics=[
                        common_pb2.ListOffsetsTopic(topic=t, partitions=ps) for t, ps in by_topic.items()
                    ],
                    isolation_level=self._isolation_level,
                ),
            )
            for t in response.topics:
                for p in t.partitions:
                    tp = (t.topic, p.partition)
                    if p.error_code in RETRIABLE_CODES:
                        continue
                    out[tp] = (p.offset, p.error_code)
                    pending.pop(tp, None)
            return True if not pending else None

        if pending:
            self.retry(f"ListOffsets of {', '.join(f'{t}-{p}' for t, p in sorted(pending))}", attempt)
        return out

    def fetch_request(
        self, tp: TopicPartitionKey, offset: int, max_bytes: int, max_wait_ms: int = 0
    ) -> common_pb2.FetchRequest:
        return consumer_fetch_request(
            {tp: offset},
            max_wait_ms=max_wait_ms,
            min_bytes=1,
            max_bytes=max_bytes,
            partition_max_bytes=max_bytes,
            read_committed=self.read_committed,
        )


def _locate_and_read(
    call: grpc.UnaryUnaryMultiCallable, request: common_pb2.FetchRequest, timeout_s: float
) -> tuple[FetchedPartition, NotReadableHere | None]:
    """A located Fetch and the read of its records.

    Returns the partition's answer with the records in place, or as the leader gave it with
    why they could not be read here; RpcError and MalformedFetchResponse pass to the caller.
    """
    part = parse_fetch_response(call(request, timeout=timeout_s))
    if part.location is None or part.error_code != common_pb2.NONE:
        return part, None
    try:
        return dataclasses.replace(part, records=read_located(part.location), location=None), None
    except NotReadableHere as why:
        return part, why
