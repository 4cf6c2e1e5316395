"""The simulated network: RPCs as request and response messages with delay, loss, duplication, partitions.

The real services talk gRPC; what a caller sees is "an answer, or an error after a
while". That is what `RpcNode.call` gives: the request travels as one message and
the answer as another, each delayed (so messages overtake each other: reordering),
possibly dropped or duplicated, and cut by partitions. A caller that gets no answer
sees DEADLINE_EXCEEDED at its timeout; one calling a crashed process sees
UNAVAILABLE at once (connection refused). A duplicated request (a retry) is served
twice; the caller takes the first answer and ignores the rest, as an awaited RPC would.
Reordering happens between channels, never within one: every caller here waits for an
answer before it sends the next request on a channel, as the real code does.

The etcd server is the node name `ETCD`: it holds no RpcNode, but partitions can cut
a process off from it (see sim_etcd.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protos.highwater.v1 import broker_pb2, common_pb2, controller_pb2
from tests.sim.clock import EventLoop, Node

ETCD = "etcd"

# One-way latency of a message on a healthy link, in ms: loopback-like, with jitter so
# that concurrent messages reorder.
LATENCY_MS_MIN = 1
LATENCY_MS_MAX = 4
# A "slow" message (a retransmission, a GC pause on the way) takes this much longer.
SLOW_EXTRA_MS_MAX = 1_500


@dataclass(slots=True)
class RpcError:
    """What a gRPC call raises, reduced to its status: the caller's only view of a failure."""

    code: str  # UNAVAILABLE, DEADLINE_EXCEEDED, UNKNOWN
    detail: str = ""


@dataclass(slots=True)
class Envelope:
    src: str
    src_incarnation: int
    dst: str
    rpc: str
    body: Any
    req_id: int
    is_reply: bool = False
    # The address the caller dialled ("host:port"); None: whatever process has the name now.
    dst_address: str | None = None


class Network:
    """Links between nodes; owns the fault settings of the links."""

    def __init__(self, loop: EventLoop, rng: random.Random) -> None:
        self.loop = loop
        self.rng = rng
        self.nodes: dict[str, RpcNode] = {}
        # Partition: nodes in different groups cannot exchange messages. Missing = group 0.
        self.groups: dict[str, int] = {}
        # Single links cut on top of the partition (both directions): {a, b} cannot talk,
        # each still reaches everyone else (a broker cut from the controller only).
        self.cut_links: set[frozenset[str]] = set()
        self.drop_rate = 0.0
        self.dup_rate = 0.0
        self.slow_rate = 0.0
        self._next_req_id = 0
        self.messages_sent = 0
        # Sees every request as it is sent (a fault that times itself to a message); None: off.
        self.on_request_sent: Callable[[Envelope], None] | None = None

    def add(self, node: RpcNode) -> None:
        self.nodes[node.name] = node

    def next_req_id(self) -> int:
        self._next_req_id += 1
        return self._next_req_id

    def reachable(self, a: str, b: str) -> bool:
        groups = self.groups
        if groups and groups.get(a, 0) != groups.get(b, 0):
            return False
        return not self.cut_links or frozenset((a, b)) not in self.cut_links

    def heal(self) -> None:
        """End the partition (single cut links have their own end: `restore_link`)."""
        self.groups = {}

    def cut_link(self, a: str, b: str) -> None:
        self.cut_links.add(frozenset((a, b)))

    def restore_link(self, a: str, b: str) -> None:
        self.cut_links.discard(frozenset((a, b)))

    def _latency_ms(self) -> int:
        delay = self.rng.randint(LATENCY_MS_MIN, LATENCY_MS_MAX)
        if self.slow_rate and self.rng.random() < self.slow_rate:
            delay += self.rng.randint(1, SLOW_EXTRA_MS_MAX)
        return delay

    def send(self, env: Envelope) -> None:
        src = self.nodes[env.src]
        if not src.up:
            return  # a dead process sends nothing (a callback of its last moments)
        self.messages_sent += 1
        if self.on_request_sent is not None and not env.is_reply:
            self.on_request_sent(env)
        dst = self.nodes.get(env.dst)
        if dst is None:
            raise KeyError(f"message to unknown node {env.dst}")
        if not self.reachable(env.src, env.dst):
            src.trace("drop %s (partitioned from %s)", Describe(env), env.dst)
            return
        if not dst.up or (env.dst_address is not None and env.dst_address != dst.address):
            if not env.is_reply:
                # Connection refused: the caller learns at once (one round trip).
                src.after(self._latency_ms() * 2, src.on_refused, env.req_id)
            return
        if self.drop_rate and self.rng.random() < self.drop_rate:
            src.trace("drop %s (lost)", Describe(env))
            return
        delay = self._latency_ms()
        self.loop.schedule(self.loop.now_ms + delay, dst, dst.incarnation, self._deliver, (env,))
        if self.dup_rate and self.rng.random() < self.dup_rate:
            # A duplicate is what a retried RPC looks like to the server: the same request
            # again, right behind the first. It cannot overtake anything the caller sends
            # next, since every channel here waits for an answer before sending more (gRPC
            # streams never reorder or duplicate on their own).
            self.loop.schedule(self.loop.now_ms + delay + 1, dst, dst.incarnation, self._deliver, (env,))

    def _deliver(self, env: Envelope) -> None:
        dst = self.nodes[env.dst]
        if env.dst_address is not None and env.dst_address != dst.address:
            return  # sent to a process that has died since; its successor listens elsewhere
        if not self.reachable(env.src, env.dst):
            dst.trace("drop %s (partitioned in flight)", Describe(env))
            return
        if env.is_reply:
            dst.on_reply(env)
        else:
            dst.trace("<- %s %s", env.src, Describe(env))
            dst.on_request(env)


Reply = Callable[[Any], None]


class RpcNode(Node):
    """A node that calls and serves RPCs through the Network."""

    def __init__(self, name: str, loop: EventLoop, network: Network) -> None:
        super().__init__(name, loop)
        self.network = network
        self._pending: dict[int, Reply] = {}
        # Where this process listens; a restarted process gets a new port, so callers that
        # dialled the old one are refused (as after a real restart).
        self.address = f"{name}:0"
        network.add(self)

    def crash(self) -> None:
        super().crash()
        self._pending = {}

    # ---- client side ------------------------------------------------------------------

    def call(
        self, dst: str, rpc: str, body: Any, timeout_ms: int, on_reply: Reply, *, address: str | None = None
    ) -> int:
        """Send a request (to `address` if given); on_reply gets the response or an RpcError exactly once."""
        req_id = self.network.next_req_id()
        self._pending[req_id] = on_reply
        self.after(timeout_ms, self._on_timeout, req_id)
        self.network.send(Envelope(self.name, self.incarnation, dst, rpc, body, req_id, dst_address=address))
        return req_id

    def on_reply(self, env: Envelope) -> None:
        if env.src_incarnation != self.incarnation:
            return
        callback = self._pending.pop(env.req_id, None)
        if callback is None:
            return  # a duplicate, or an answer after the caller gave up
        self.trace("<- %s reply %s", env.src, Describe(env))
        callback(env.body)

    def on_refused(self, req_id: int) -> None:
        callback = self._pending.pop(req_id, None)
        if callback is not None:
            callback(RpcError("UNAVAILABLE", "connection refused"))

    def _on_timeout(self, req_id: int) -> None:
        callback = self._pending.pop(req_id, None)
        if callback is not None:
            self.trace("rpc #%d timed out", req_id)
            callback(RpcError("DEADLINE_EXCEEDED"))

    # ---- server side ------------------------------------------------------------------

    def on_request(self, env: Envelope) -> None:
        raise NotImplementedError

    def reply(self, request: Envelope, body: Any) -> None:
        # The reply goes back to the incarnation that asked (its connection).
        self.network.send(
            Envelope(
                self.name,
                request.src_incarnation,
                request.src,
                request.rpc,
                body,
                request.req_id,
                is_reply=True,
            )
        )


class Describe:
    """One-line summary of a message, formatted only when the trace is printed."""

    __slots__ = ("env",)

    def __init__(self, env: Envelope) -> None:
        self.env = env

    def __str__(self) -> str:
        env = self.env
        return f"{env.rpc}#{env.req_id}{' reply' if env.is_reply else ''} {describe_body(env.body)}"


def _states(states: Any) -> str:
    return " ".join(f"{s.topic}-{s.partition}:L{s.leader}e{s.leader_epoch}isr{list(s.isr)}" for s in states)


def _per_partition(body: Any, describe: Callable[[Any, Any], str]) -> str:
    """describe(topic, partition) for each partition of each topic of body, space-separated."""
    return " ".join(describe(t, p) for t in body.topics for p in t.partitions)


def describe_body(body: Any) -> str:
    """Short, stable text for the messages that matter when reading a failure."""
    if isinstance(body, RpcError):
        return f"error {body.code}"
    if isinstance(body, broker_pb2.LeaderAndIsrRequest):
        return f"c{body.header.controller_id}/ce{body.header.controller_epoch} " + _states(
            item.state for item in body.partitions
        )
    if isinstance(body, broker_pb2.UpdateMetadataRequest):
        return f"c{body.header.controller_id}/ce{body.header.controller_epoch} full={body.full} " + _states(
            body.partitions
        )
    if isinstance(body, common_pb2.FetchRequest):
        parts = _per_partition(
            body,
            lambda t, p: f"{t.topic}-{p.partition}@{p.fetch_offset}e{p.current_leader_epoch}",
        )
        return f"r{body.replica_id} {parts}"
    if isinstance(body, common_pb2.FetchResponse):
        return _per_partition(
            body,
            lambda t, p: (
                f"{t.topic}-{p.partition}:{common_pb2.ErrorCode.Name(p.error_code) if p.error_code else ''}"
                f"hw{p.high_watermark}/leo{p.log_end_offset}/{len(p.records)}B"
            ),
        )
    if isinstance(body, common_pb2.ProduceRequest):
        return _per_partition(
            body,
            lambda t, p: f"{t.topic}-{p.partition} acks={body.acks} {len(p.records)}B",
        )
    if isinstance(body, common_pb2.ProduceResponse):
        return _per_partition(
            body,
            lambda t, p: f"{t.topic}-{p.partition}:{common_pb2.ErrorCode.Name(p.error_code)}@{p.base_offset}",
        )
    if isinstance(body, broker_pb2.OffsetsForLeaderEpochRequest):
        return _per_partition(
            body,
            lambda t, p: f"{t.topic}-{p.partition}:e{p.leader_epoch}/cur{p.current_leader_epoch}",
        )
    if isinstance(body, broker_pb2.OffsetsForLeaderEpochResponse):
        return _per_partition(
            body,
            lambda t, p: (
                f"{t.topic}-{p.partition}:e{p.leader_epoch}->{p.end_offset}"
                f"{' ' + common_pb2.ErrorCode.Name(p.error_code) if p.error_code else ''}"
            ),
        )
    if isinstance(body, controller_pb2.AlterPartitionRequest):
        return " ".join(
            f"{p.topic}-{p.partition}:e{p.leader_epoch}/pe{p.partition_epoch}->{list(p.new_isr)}"
            for p in body.partitions
        )
    if isinstance(body, controller_pb2.AlterPartitionResponse):
        if body.error_code:
            return common_pb2.ErrorCode.Name(body.error_code)
        return " ".join(
            f"{p.topic}-{p.partition}:{common_pb2.ErrorCode.Name(p.error_code)} "
            f"isr{list(p.state.isr)}/pe{p.state.partition_epoch}"
            for p in body.partitions
        )
    error_code = getattr(body, "error_code", 0)
    return common_pb2.ErrorCode.Name(error_code) if error_code else ""
