"""The control requests a committed result leads to, built from the committed context:
LeaderAndIsr and StopReplica to brokers first, UpdateMetadata to every broker and gateway after
(Kafka's ControllerChannelManager batch). Pure: no I/O, no clock; the event loop hands each
request to its target's sender (event_loop.py, senders.py).

The large requests are assembled from kept encodings (proto_cache.py, wire.py): at 100,000
partitions a copy of a composed request per target cost 66 ms each, its serialization 17 ms.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import broker_pb2, common_pb2
from services.common import limits
from services.controller import wire
from services.controller.context import NO_LEADER, ControllerContext
from services.controller.proto_cache import ProtoCache
from services.controller.results import ControlRpcs

# A sender's key: ("b", broker id) or ("g", gateway id).
Target = tuple[str, int]


@dataclass(frozen=True)
class ControlRequest:
    """One request for one target. deleted: the partitions of a StopReplica whose topic is being
    deleted (their outcome is queued back as ReplicaDeletionResult for broker_epoch)."""

    target: Target
    rpc: str
    request: Any  # a wire.Serialized or a request proto
    deleted: list[TopicPartitionKey] = field(default_factory=list)
    broker_epoch: int = -1


def header(ctx: ControllerContext, epoch: int, broker_id: int) -> common_pb2.ControllerHeader:
    return common_pb2.ControllerHeader(
        controller_id=ctx.controller_id, controller_epoch=epoch, broker_epoch=ctx.with_broker_epoch(broker_id)
    )


def control_requests(
    ctx: ControllerContext, rpcs: ControlRpcs, protos: ProtoCache, epoch: int, targets: Collection[Target]
) -> Iterator[ControlRequest | None]:
    """The requests of rpcs for the targets that have a sender, in the order they are to be sent.

    A generator, so the caller may let other tasks run between requests (the failover's take
    seconds to build at 100,000 partitions); None is a step of work that built no request.
    """
    leader_and_isr = rpcs.leader_and_isr
    if rpcs.leader_and_isr_everywhere:
        leader_and_isr = {b: set(tps) for b, tps in leader_and_isr.items()}  # the result stays as decided
        yield from _fan_out_everywhere(ctx, leader_and_isr)
    for broker_id, tps in sorted(leader_and_isr.items()):
        if ("b", broker_id) not in targets:
            continue
        # In requests of at most LEADER_AND_ISR_PARTITIONS_PER_REQUEST_MAX partitions, in order
        # (one sender per broker delivers them in turn): a broker applies each within the
        # call's deadline.
        ordered = sorted(tps)
        step = limits.LEADER_AND_ISR_PARTITIONS_PER_REQUEST_MAX
        for start in range(0, len(ordered), step):
            body = _leader_and_isr_body(
                ctx, protos, broker_id, ordered[start : start + step], rpcs.new_replicas
            )
            if body is not None:
                yield ControlRequest(
                    ("b", broker_id), "LeaderAndIsr", wire.with_header(body, header(ctx, epoch, broker_id))
                )
    for broker_id, deletes in sorted(rpcs.stop_replica.items()):
        if ("b", broker_id) not in targets:
            continue
        request = broker_pb2.StopReplicaRequest(
            header=header(ctx, epoch, broker_id),
            partitions=[
                broker_pb2.StopReplicaPartition(
                    topic=tp[0], partition=tp[1], leader_epoch=-2, delete_partition=delete
                )
                for tp, delete in sorted(deletes.items())
            ],
        )
        deleted = [tp for tp, delete in sorted(deletes.items()) if delete and tp[0] in ctx.topics_to_delete]
        yield ControlRequest(
            ("b", broker_id), "StopReplica", request, deleted, broker_epoch=ctx.with_broker_epoch(broker_id)
        )
    if (rpcs.full_metadata or rpcs.update_metadata or rpcs.deleted_topics) and targets:
        # One body encoded, each target's header appended (wire.py).
        body = update_metadata_body(
            ctx, protos, full=rpcs.full_metadata, tps=rpcs.update_metadata, deleted=rpcs.deleted_topics
        )
        for kind, target_id in sorted(targets):
            target_header = common_pb2.ControllerHeader(
                controller_id=ctx.controller_id,
                controller_epoch=epoch,
                broker_epoch=ctx.with_broker_epoch(target_id) if kind == "b" else -1,
            )
            yield ControlRequest((kind, target_id), "UpdateMetadata", wire.with_header(body, target_header))


def _leader_and_isr_body(
    ctx: ControllerContext,
    protos: ProtoCache,
    broker_id: int,
    tps: Collection[TopicPartitionKey],
    new_replicas: set[tuple[int, TopicPartitionKey]],
) -> wire.Serialized | None:
    """A LeaderAndIsrRequest for one broker without its header; None when none of tps still exists."""
    parts = []
    leaders: dict[int, common_pb2.BrokerNode] = {}
    named = [tp for tp in sorted(tps) if tp[0] in ctx.topics]
    states = ctx.states
    # The encodings of those with a state in bulk, in order; one without is encoded alone.
    encoded = iter(protos.states.wires(named, states, ctx.topics))
    for tp in named:
        parts.append(
            wire.leader_and_isr_partition(
                next(encoded) if tp in states else protos.state_wire(ctx, tp),
                protos.config_wire(ctx, tp[0]),
                is_new=(broker_id, tp) in new_replicas,
            )
        )
        leader_id = states[tp].leader if tp in states else NO_LEADER
        if leader_id not in leaders and (leader := ctx.live_brokers.get(leader_id)):
            leaders[leader.broker_id] = leader.to_proto()
    if not parts:
        return None
    return wire.leader_and_isr_body(parts, list(leaders.values()))


def _fan_out_everywhere(
    ctx: ControllerContext, leader_and_isr: dict[int, set[TopicPartitionKey]]
) -> Iterator[None]:
    """Add every partition not being deleted to the set of each of its live replicas, yielding
    after each topic (a failover's fan-out: results.ControlRpcs.leader_and_isr_everywhere)."""
    live = {b for b in ctx.live_brokers if ctx.is_live(b)}
    per_broker = {b: leader_and_isr.setdefault(b, set()) for b in live}
    for name in sorted(ctx.topics):
        if name in ctx.topics_to_delete:
            continue
        for p, replicas in ctx.topics[name].assignment.items():
            for r in replicas:
                targets = per_broker.get(r)
                if targets is not None:
                    targets.add((name, p))
        yield
    for b in [b for b, tps in leader_and_isr.items() if not tps]:
        del leader_and_isr[b]


def update_metadata_body(
    ctx: ControllerContext, protos: ProtoCache, *, full: bool, tps: set[TopicPartitionKey], deleted: set[str]
) -> wire.Serialized:
    """An UpdateMetadataRequest without its header (wire.with_header adds each target's)."""
    chosen = ctx.partitions() if full else sorted(tp for tp in tps if tp[0] in ctx.topics)
    topics = {tp[0] for tp in chosen}
    rest = broker_pb2.UpdateMetadataRequest(
        live_brokers=[b.to_proto() for b in ctx.live_brokers.values()],
        live_gateways=[
            common_pb2.GatewayNode(gateway_id=g.gateway_id, host=g.host, port=g.port)
            for g in ctx.live_gateways.values()
        ],
        full=full,
        deleted_topics=sorted(deleted),
        topic_configs={t: protos.config_proto(ctx, t) for t in topics},
        topic_ids={t: ctx.topics[t].topic_id for t in topics},
    )
    states = protos.partition_wires(ctx) if full else protos.states.wires(chosen, ctx.states, ctx.topics)
    return wire.update_metadata_body(rest, states)
