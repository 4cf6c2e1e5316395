"""Partition reassignment (OAR -> RAR), as Kafka's controller walks it.

Split from handlers.py because a reassignment is a walk over several events, not
one decision: AR := OAR + RAR and the new replicas start (`on_alter_reassignments`);
once every target replica is in the ISR the leader moves into RAR, OAR - RAR
leave, and AR := RAR last (`on_reassignment_progress`). Each step is a
`ControllerResult` committed on its own, so a controller that dies between steps
leaves a state (adding/removing replicas in the topic key) from which the next one
finishes the same walk.
"""

from __future__ import annotations

import logging

from clients.common.errors import (
    ElectionNotNeeded,
    EligibleLeadersNotAvailable,
    HighwaterError,
    InvalidReplicaAssignment,
    NoReassignmentInProgress,
    UnknownTopicOrPartition,
)
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from services.controller import elections
from services.controller.context import ControllerContext, TopicInfo
from services.controller.results import ControllerResult, StateWrite, TopicWrite, require_topic

log = logging.getLogger("highwater.controller")


def ongoing_reassignments(ctx: ControllerContext) -> list[TopicPartitionKey]:
    return sorted(
        (t.name, p)
        for t in ctx.topics.values()
        for p in set(t.adding_replicas) | set(t.removing_replicas)
        if t.name not in ctx.topics_to_delete
    )


def original_replicas(topic: TopicInfo, p: int) -> tuple[int, ...]:
    """OAR: the assignment before the reassignment (AR minus the replicas being added)."""
    adding = topic.adding_replicas.get(p, ())
    return tuple(r for r in topic.assignment[p] if r not in adding)


def target_replicas(topic: TopicInfo, p: int) -> tuple[int, ...]:
    """RAR: the assignment being moved to (AR minus the replicas being removed)."""
    removing = topic.removing_replicas.get(p, ())
    return tuple(r for r in topic.assignment[p] if r not in removing)


def _with_assignment(
    topic: TopicInfo, p: int, replicas: tuple[int, ...], adding: tuple[int, ...], removing: tuple[int, ...]
) -> TopicInfo:
    new = TopicInfo(
        topic.name,
        topic.topic_id,
        {**topic.assignment, p: replicas},
        topic.configs,
        dict(topic.adding_replicas),
        dict(topic.removing_replicas),
    )
    for field_map, value in ((new.adding_replicas, adding), (new.removing_replicas, removing)):
        if value:
            field_map[p] = value
        else:
            field_map.pop(p, None)
    return new


def on_alter_reassignments(
    ctx: ControllerContext, req: common_pb2.AlterPartitionReassignmentsRequest
) -> ControllerResult:
    """Start (or cancel) reassignments: AR := OAR + RAR, new replicas start, epoch bumped."""
    result = ControllerResult()
    answers = []
    topics: dict[str, TopicInfo] = {}
    for rt in req.topics:
        for rp in rt.partitions:
            tp = (rt.name, rp.partition)
            answer = common_pb2.PartitionResult(topic=rt.name, partition=rp.partition)
            try:
                topic = topics.get(rt.name) or require_topic(ctx, rt.name)
                if rt.name in ctx.topics_to_delete:
                    raise UnknownTopicOrPartition(f"topic {rt.name!r} is being deleted")
                if rp.partition not in topic.assignment or tp not in ctx.states:
                    raise UnknownTopicOrPartition(f"topic {rt.name!r} has no partition {rp.partition}")
                oar = original_replicas(topic, rp.partition)
                ongoing = bool(
                    topic.adding_replicas.get(rp.partition) or topic.removing_replicas.get(rp.partition)
                )
                if rp.cancel or not rp.replicas:
                    if not ongoing:
                        raise NoReassignmentInProgress(
                            f"{rt.name}-{rp.partition} has no reassignment to cancel"
                        )
                    topics[rt.name] = _cancel_reassignment(ctx, result, topic, tp, oar)
                else:
                    rar = tuple(rp.replicas)
                    if len(set(rar)) != len(rar):
                        raise InvalidReplicaAssignment(f"target replicas {list(rar)} list a broker twice")
                    unknown = [r for r in rar if r not in ctx.live_brokers]
                    if unknown:
                        raise InvalidReplicaAssignment(
                            f"target replicas {unknown} are not registered brokers; live: "
                            f"{sorted(ctx.live_brokers)}"
                        )
                    if rar == oar and not ongoing:
                        raise ElectionNotNeeded(f"{rt.name}-{rp.partition} already has replicas {list(rar)}")
                    # A new target for a partition already moving starts from every replica it
                    # has now, so none that leads or is in the ISR is dropped before the walk
                    # moves leadership into the new target (sim seed KI-3).
                    base = topic.assignment[rp.partition] if ongoing else oar
                    ar = rar + tuple(r for r in base if r not in rar)
                    adding = tuple(r for r in rar if r not in base)
                    removing = tuple(r for r in base if r not in rar)
                    new_topic = _with_assignment(topic, rp.partition, ar, adding, removing)
                    topics[rt.name] = new_topic
                    state = ctx.states[tp]
                    new_state = state.next(leader=state.leader, isr=state.isr, controller_epoch=ctx.epoch)
                    result.writes.append(StateWrite(tp, new_state, state.partition_epoch))
                    result.rpcs.add_leader_and_isr([r for r in ar if ctx.is_live(r)], tp)
                    for r in adding:
                        result.rpcs.new_replicas.add((r, tp))
                    log.info(
                        "reassigning %s-%d from %s to %s (adding %s, removing %s)",
                        *tp,
                        list(oar),
                        list(rar),
                        list(adding),
                        list(removing),
                    )
            except HighwaterError as exc:
                answer.error_code, answer.error_message = exc.code, exc.message
            answers.append(answer)
    for topic in topics.values():
        result.writes.insert(0, TopicWrite(topic, create=False))
    result.response = common_pb2.AlterPartitionReassignmentsResponse(partitions=answers)
    return result


def _cancel_reassignment(
    ctx: ControllerContext,
    result: ControllerResult,
    topic: TopicInfo,
    tp: TopicPartitionKey,
    oar: tuple[int, ...],
) -> TopicInfo:
    state = ctx.states[tp]
    adding = topic.adding_replicas.get(tp[1], ())
    isr = tuple(r for r in state.isr if r in oar)
    leader = state.leader
    if leader not in oar or not ctx.is_live(leader):
        live = {b for b in ctx.live_brokers if ctx.is_live(b)}
        choice = elections.reassignment_leader(oar, isr, live)
        if choice is None:
            raise EligibleLeadersNotAvailable(f"cannot cancel: no live in-sync replica among {list(oar)}")
        leader = choice[0]
    new_state = state.next(leader=leader, isr=isr or (leader,), controller_epoch=ctx.epoch)
    result.writes.append(StateWrite(tp, new_state, state.partition_epoch))
    result.rpcs.add_leader_and_isr([r for r in oar if ctx.is_live(r)], tp)
    for r in adding:
        if r in ctx.live_brokers:
            result.rpcs.stop_replica.setdefault(r, {})[tp] = True
    log.info("cancelled the reassignment of %s-%d back to %s", *tp, list(oar))
    return _with_assignment(topic, tp[1], oar, (), ())


def on_reassignment_progress(ctx: ControllerContext) -> ControllerResult:
    """Finish reassignments whose target replicas are all in the ISR.

    Leader moved into RAR if needed, OAR-RAR out of the ISR and deleted,
    AR := RAR last — so a controller that dies between steps leaves a state
    from which the next one finishes the same walk.
    """
    result = ControllerResult()
    live = {b for b in ctx.live_brokers if ctx.is_live(b)}
    topics: dict[str, TopicInfo] = {}
    for tp in ongoing_reassignments(ctx):
        topic = topics.get(tp[0]) or ctx.topics[tp[0]]
        state = ctx.states.get(tp)
        if state is None:
            continue
        rar = target_replicas(topic, tp[1])
        if not all(r in state.isr for r in rar):
            continue
        leader = state.leader
        if leader not in rar or leader not in live:
            choice = elections.reassignment_leader(rar, state.isr, live)
            if choice is None:
                continue
            leader = choice[0]
        removing = topic.removing_replicas.get(tp[1], ())
        new_isr = tuple(r for r in state.isr if r in rar)
        new_state = state.next(leader=leader, isr=new_isr, controller_epoch=ctx.epoch)
        result.writes.append(StateWrite(tp, new_state, state.partition_epoch))
        result.rpcs.add_leader_and_isr([r for r in rar if r in live], tp)
        for r in removing:
            if r in ctx.live_brokers:
                result.rpcs.stop_replica.setdefault(r, {})[tp] = True
        topics[tp[0]] = _with_assignment(topic, tp[1], rar, (), ())
        log.info("reassignment of %s-%d done: replicas %s, leader %d", *tp, list(rar), leader)
    for topic in topics.values():
        result.writes.append(TopicWrite(topic, create=False))
    return result


def list_reassignments(
    ctx: ControllerContext, req: common_pb2.ListPartitionReassignmentsRequest
) -> common_pb2.ListPartitionReassignmentsResponse:
    wanted = {(p.topic, p.partition) for p in req.partitions}
    out = []
    for tp in ongoing_reassignments(ctx):
        if wanted and tp not in wanted:
            continue
        topic = ctx.topics[tp[0]]
        out.append(
            common_pb2.OngoingReassignment(
                topic=tp[0],
                partition=tp[1],
                replicas=list(topic.assignment[tp[1]]),
                adding_replicas=list(topic.adding_replicas.get(tp[1], ())),
                removing_replicas=list(topic.removing_replicas.get(tp[1], ())),
            )
        )
    return common_pb2.ListPartitionReassignmentsResponse(reassignments=out)
