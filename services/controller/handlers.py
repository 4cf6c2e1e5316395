"""Controller event handlers: decide, then apply (Kafka's *ControlManager pattern).

This module holds the handlers of partition leadership and topic creation; topic
deletion lives in deletion.py, partition reassignment in reassignment.py, requests
written by hand under /admin in admin_requests.py, and the write and result types
they all return, with their replay (`apply_write`), in results.py.

Each handler reads the ControllerContext and returns a `ControllerResult`:
the etcd writes it wants (all fenced by the controller epoch when applied),
the control RPCs to send once they are committed, and the answer for the
caller. Handlers never change the context for writes: the event loop replays
committed writes into it (`apply_write`, from the event loop's `apply`), so a controller that crashes
between deciding and committing leaves nothing half-known, and a new one
rebuilds the same context from etcd.

Bookkeeping that is not kept in etcd (replicas being deleted, brokers shutting
down) is decided the same way, as writes that commit nothing and are replayed
with the rest. The only context changes made here directly are membership
facts learned from etcd watches (live brokers and gateways), which are not
decisions.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from typing import Any

from clients.common.errors import (
    HighwaterError,
    InvalidConfig,
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidReplicationFactor,
    InvalidRequest,
    InvalidTopic,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from clients.common.topics import altered_topic_configs, topic_name_problem, validate_topic_configs
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2, controller_pb2
from services.common import limits
from services.controller import elections
from services.controller.assignment import assign_replicas
from services.controller.context import (
    NO_LEADER,
    BrokerInfo,
    ControllerContext,
    LeaderAndIsr,
    TopicInfo,
)
from services.controller.deletion import ReplicaMoves, resume_deletions
from services.controller.results import (
    ConfigWrite,
    ControllerResult,
    ShuttingDownWrite,
    StateWrite,
    TopicWrite,
    require_topic,
)
from services.controller.state_machines import ReplicaState

log = logging.getLogger("highwater.controller")

# ---- helpers ---------------------------------------------------------------------------------


def _change_state(
    ctx: ControllerContext,
    result: ControllerResult,
    tp: TopicPartitionKey,
    *,
    leader: int,
    isr: tuple[int, ...],
    send_to_replicas: bool = True,
) -> LeaderAndIsr:
    old = ctx.states[tp]
    new = old.next(leader=leader, isr=isr, controller_epoch=ctx.epoch)
    result.writes.append(StateWrite(tp, new, old.partition_epoch))
    if send_to_replicas:
        # Every registered replica is told, including one shutting down: it must learn that it
        # no longer leads, or produce requests waiting on it would hang until it stops.
        result.rpcs.add_leader_and_isr(
            [r for r in ctx.replicas(tp) if r in ctx.live_brokers or r == leader], tp
        )
    else:
        result.rpcs.update_metadata.add(tp)
    return new


# ---- events ----------------------------------------------------------------------------------


def on_startup(ctx: ControllerContext) -> ControllerResult:
    """Controller failover: initialise missing states, elect offline partitions, tell everyone."""
    result = ControllerResult()
    live = {b for b in ctx.live_brokers if ctx.is_live(b)}
    # A state written after the newest registration has no restarted broker (the common case:
    # checked once rather than per broker for each of 100,000 partitions).
    newest_registration = max((info.broker_epoch for info in ctx.live_brokers.values()), default=0)
    registered = ctx.live_brokers
    states, revisions, no_one = ctx.states, ctx.state_revisions, frozenset[int]()
    for name in sorted(ctx.topics):
        if name in ctx.topics_to_delete:
            continue
        assignment = ctx.topics[name].assignment
        for p in sorted(assignment):
            tp = (name, p)
            state = states.get(tp)
            if state is None:
                _initial_state(ctx, result, tp)
                continue
            # Brokers registered after this state was written restarted since (perhaps with
            # less than they had): they count as failed and started, as in on_broker_change.
            written_at = revisions.get(tp, 0)
            restarted = (
                frozenset(b for b, info in registered.items() if info.broker_epoch > written_at)
                if written_at and written_at < newest_registration
                else no_one
            )
            # With no restarted broker, a live leader and every ISR member registered, _fail_over
            # changes nothing (nothing it counts dead is the leader or in the ISR): skipped, as for
            # nearly every partition of a takeover.
            if restarted or state.leader not in live or not all(r in registered for r in state.isr):
                gone = {r for r in (*assignment[p], state.leader) if r >= 0 and r not in registered}
                _fail_over(ctx, result, tp, dead=gone | restarted, restarted=set(restarted), live=live)
    # Every replica is told its partition's state: built when sent (results.ControlRpcs).
    result.rpcs.leader_and_isr_everywhere = True
    moves = ReplicaMoves(ctx)
    resume_deletions(ctx, result, moves)
    moves.commit(result)
    result.rpcs.full_metadata = True
    return result


def _initial_state(ctx: ControllerContext, result: ControllerResult, tp: TopicPartitionKey) -> None:
    """NewPartition -> OnlinePartition: leader = first live replica, ISR = live AR."""
    replicas = ctx.replicas(tp)
    live_replicas = tuple(r for r in replicas if ctx.is_live(r))
    leader = live_replicas[0] if live_replicas else NO_LEADER
    state = LeaderAndIsr(leader, 0, live_replicas or replicas, ctx.epoch, 1)
    result.writes.append(StateWrite(tp, state, 0))
    result.rpcs.add_leader_and_isr(live_replicas, tp, is_new=True)


def on_broker_change(ctx: ControllerContext, registered: dict[int, BrokerInfo]) -> ControllerResult:
    """Brokers came or went (leases): fail over dead ones, bring new ones online.

    A broker whose epoch changed re-registered: it is treated as dead and new
    at once, so its old incarnation is fenced and it is told its state again.
    """
    result = ControllerResult()
    old = ctx.live_brokers
    dead = {b for b in old if b not in registered or registered[b].broker_epoch != old[b].broker_epoch}
    new = {b for b in registered if b not in old or registered[b].broker_epoch != old[b].broker_epoch}
    ctx.live_brokers = dict(registered)
    if not dead and not new:
        return result
    if dead:
        log.info("brokers %s left (lease expired or revoked, or re-registered)", sorted(dead))
    if new:
        lost = sorted(b for b in new if registered[b].unclean_shutdown)
        log.info("brokers %s joined%s", sorted(new), f" ({lost} after an unclean shutdown)" if lost else "")
    if ctx.shutting_down & dead:
        result.writes.append(ShuttingDownWrite(remove=frozenset(ctx.shutting_down & dead)))
    shutting_down = ctx.shutting_down - dead
    live = {b for b in registered if b not in shutting_down}
    # Kafka's processBrokerChange: a bounced broker (new epoch) first fails, then starts.
    # Every new incarnation, bounced or back after its lease ran out, is a restart: an ISR
    # membership it holds was written for an earlier incarnation, which may have had
    # records this one lost. It leaves the ISR and leads only when no other in-sync replica
    # is left (restarted_isr_leader); it rejoins the ISR by catching up, like any follower.
    for tp in ctx.partitions():
        if tp[0] in ctx.topics_to_delete or tp not in ctx.states:
            continue
        _fail_over(ctx, result, tp, dead=dead | new, restarted=new, live=live)
    for tp in ctx.partitions():
        if tp[0] in ctx.topics_to_delete:
            continue
        replicas = ctx.replicas(tp)
        started = [b for b in new if b in replicas]
        if started and tp in ctx.states:
            result.rpcs.add_leader_and_isr(started, tp)
    moves = ReplicaMoves(ctx)
    for key, state in sorted(ctx.replica_deletion.items()):
        if key[1] in dead and state is ReplicaState.DELETION_STARTED:
            moves.move(key, ReplicaState.DELETION_INELIGIBLE)
    resume_deletions(ctx, result, moves, new)
    moves.commit(result)
    result.rpcs.full_metadata = True
    return result


def _fail_over(
    ctx: ControllerContext,
    result: ControllerResult,
    tp: TopicPartitionKey,
    *,
    dead: set[int],
    restarted: set[int],
    live: set[int],
) -> None:
    """One partition after brokers failed (dead) or restarted (restarted, a subset of dead).

    Dead brokers leave the ISR; a new leader comes from the surviving ISR members in AR
    order; when none is left, a restarted member of the last ISR may lead (never one that
    lost data while another may still come back: elections.restarted_isr_leader); then
    an unclean election if the topic allows it; else the partition goes offline, keeping
    its last ISR less the members that lost data.
    """
    state = ctx.states[tp]
    if not (state.leader in dead or state.leader not in live or any(r in dead for r in state.isr)):
        return
    survivors = live - dead
    isr = tuple(r for r in state.isr if r not in dead)
    if state.leader in survivors and state.leader in isr:
        _change_state(ctx, result, tp, leader=state.leader, isr=isr)
        return
    topic = ctx.topics[tp[0]]
    replicas = ctx.replicas(tp)
    lost_data = {b for b in restarted if b in ctx.live_brokers and ctx.live_brokers[b].unclean_shutdown}
    choice, unclean = elections.offline_partition_leader(replicas, isr, survivors, False)
    if choice is None:
        choice = elections.restarted_isr_leader(replicas, state.isr, live, restarted, lost_data)
        if choice is not None and choice[0] in lost_data:
            log.error(
                "every member of %s-%d's last ISR %s restarted after an unclean shutdown; broker %d leads "
                "and records they acknowledged but had not flushed may be lost",
                *tp,
                list(state.isr),
                choice[0],
            )
    if choice is None and topic.unclean_leader_election:
        choice, unclean = elections.offline_partition_leader(replicas, (), live, True)
    if choice is None:
        kept_isr = tuple(r for r in state.isr if r not in lost_data) or state.isr
        if state.leader != NO_LEADER or kept_isr != state.isr:
            waiting = (
                f"; {sorted(lost_data & set(state.isr))} lost data in an unclean shutdown"
                if kept_isr != state.isr
                else ""
            )
            # Every member of the last ISR asked for a controlled shutdown (ctx.shutting_down is
            # replayed after this decision): the operator stopped them, as at a whole-cluster stop,
            # and nothing failed. A warning is for replicas that crashed or lost their lease.
            stopped = kept_isr == state.isr and all(r in ctx.shutting_down for r in state.isr)
            log.log(
                logging.INFO if stopped else logging.WARNING,
                "%s-%d has no live in-sync replica (last ISR %s%s)%s; partition is offline until one returns",
                *tp,
                list(kept_isr),
                ", stopped cleanly" if stopped else "",
                waiting,
            )
            _change_state(ctx, result, tp, leader=NO_LEADER, isr=kept_isr)
        return
    if unclean:
        result.unclean_elections += 1
        log.error(
            "UNCLEAN leader election for %s-%d: broker %d was not in the ISR %s; "
            "records acknowledged by the old ISR may be lost",
            *tp,
            choice[0],
            list(state.isr),
        )
    _change_state(ctx, result, tp, leader=choice[0], isr=choice[1])


def on_gateway_change(ctx: ControllerContext, gateways: dict[int, Any]) -> ControllerResult:
    result = ControllerResult()
    joined = set(gateways) - set(ctx.live_gateways)
    ctx.live_gateways = dict(gateways)
    result.rpcs.full_metadata = bool(joined)
    return result


def validate_topic_name(name: str) -> None:
    problem = topic_name_problem(name)
    if problem is not None:
        raise InvalidTopic(problem)


def on_create_topics(ctx: ControllerContext, req: common_pb2.CreateTopicsRequest) -> ControllerResult:
    result = ControllerResult()
    answers = []
    live_racks = {b: info.rack for b, info in ctx.live_brokers.items() if ctx.is_live(b)}
    seen: set[str] = set()
    granted: Counter[int] = Counter()
    for ct in req.topics:
        answer = common_pb2.TopicResult(name=ct.name)
        try:
            validate_topic_name(ct.name)
            if ct.name in ctx.topics or ct.name in seen:
                raise TopicAlreadyExists(f"topic {ct.name!r} already exists")
            configs = validate_topic_configs(dict(ct.configs))
            if ct.assignments:
                if ct.num_partitions not in (0, -1) or ct.replication_factor not in (0, -1):
                    raise InvalidRequest(
                        "give either explicit assignments or num_partitions/replication_factor"
                    )
                assignment = {p: tuple(rl.replicas) for p, rl in ct.assignments.items()}
                _check_assignment(assignment, set(ctx.live_brokers))
            else:
                partitions = ct.num_partitions if ct.num_partitions > 0 else limits.DEFAULT_NUM_PARTITIONS
                if ct.num_partitions < -1 or ct.num_partitions == 0:
                    raise InvalidPartitions(f"number of partitions must be >= 1, got {ct.num_partitions}")
                if partitions > limits.PARTITIONS_PER_TOPIC_MAX:
                    raise InvalidPartitions(
                        f"{partitions} partitions is above the limit {limits.PARTITIONS_PER_TOPIC_MAX}"
                    )
                rf = ct.replication_factor
                if rf in (0, -1):
                    rf = min(limits.DEFAULT_REPLICATION_FACTOR, max(len(live_racks), 1))
                elif rf < -1:
                    raise InvalidReplicationFactor(f"replication factor must be >= 1, got {rf}")
                assignment = assign_replicas(live_racks, partitions, rf, start_index=len(ctx.topics))
            rf_actual = len(next(iter(assignment.values())))
            min_isr = int(configs.get("min.insync.replicas", "1"))
            if min_isr > rf_actual:
                raise InvalidReplicationFactor(
                    f"min.insync.replicas={min_isr} is larger than the replication factor {rf_actual}: "
                    "acks=all writes could never succeed"
                )
            granted = _check_replicas_per_broker(ctx, assignment, granted)
            answer.num_partitions = len(assignment)
            answer.replication_factor = rf_actual
            if not req.validate_only:
                topic = TopicInfo(ct.name, str(uuid.uuid4()), assignment, configs)
                answer.topic_id = topic.topic_id
                if configs:
                    result.writes.append(ConfigWrite(ct.name, configs))
                result.writes.append(TopicWrite(topic, create=True))
                for p, replicas in sorted(assignment.items()):
                    live_replicas = tuple(r for r in replicas if ctx.is_live(r))
                    leader = live_replicas[0] if live_replicas else NO_LEADER
                    state = LeaderAndIsr(leader, 0, live_replicas or replicas, ctx.epoch, 1)
                    result.writes.append(StateWrite((ct.name, p), state, 0))
                    result.rpcs.add_leader_and_isr(live_replicas, (ct.name, p), is_new=True)
            seen.add(ct.name)
        except HighwaterError as exc:
            answer.error_code, answer.error_message = exc.code, exc.message
        answers.append(answer)
    result.response = common_pb2.CreateTopicsResponse(topics=answers)
    return result


def _check_replicas_per_broker(
    ctx: ControllerContext, added: dict[int, tuple[int, ...]], pending: Counter[int]
) -> Counter[int]:
    """Refuse new replicas that would take a broker past the replicas it holds at most: what it
    registered (`--replicas-max`), else REPLICAS_PER_BROKER_MAX.

    `pending` counts replicas granted earlier in the same request; returns it with these added.
    """
    new = Counter(b for replicas in added.values() for b in replicas)
    held = Counter(
        b for topic in ctx.topics.values() for replicas in topic.assignment.values() for b in replicas
    )
    for broker, count in sorted(new.items()):
        total = held[broker] + pending[broker] + count
        info = ctx.live_brokers.get(broker)
        most = (info.replicas_max if info is not None else 0) or limits.REPLICAS_PER_BROKER_MAX
        if total > most:
            raise InvalidPartitions(
                f"broker {broker} would hold {total} replicas; the limit is {most} per broker (each "
                "replica holds open files and memory): add brokers, or use fewer partitions or a lower "
                "replication factor, or start brokers prepared for more (--replicas-max)"
            )
    return pending + new


def _check_assignment(assignment: dict[int, tuple[int, ...]], known: set[int]) -> None:
    if not assignment:
        raise InvalidReplicaAssignment("the assignment is empty")
    if sorted(assignment) != list(range(len(assignment))):
        raise InvalidReplicaAssignment(
            f"partitions must be numbered 0..{len(assignment) - 1}, got {sorted(assignment)}"
        )
    sizes = {len(r) for r in assignment.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise InvalidReplicaAssignment("every partition needs the same, non-zero number of replicas")
    for p, replicas in assignment.items():
        if len(set(replicas)) != len(replicas):
            raise InvalidReplicaAssignment(f"partition {p} lists a broker twice: {list(replicas)}")
        unknown = [r for r in replicas if r not in known]
        if unknown:
            raise InvalidReplicaAssignment(
                f"partition {p} names unknown brokers {unknown}; live: {sorted(known)}"
            )


def on_alter_partition(ctx: ControllerContext, req: controller_pb2.AlterPartitionRequest) -> ControllerResult:
    """A leader asks to change its ISR, guarded by leader_epoch and partition_epoch."""
    result = ControllerResult()
    answers = []
    broker = ctx.live_brokers.get(req.broker_id)
    if broker is None or broker.broker_epoch != req.broker_epoch:
        result.response = controller_pb2.AlterPartitionResponse(
            error_code=common_pb2.STALE_BROKER_EPOCH,
            error_message=f"broker {req.broker_id} epoch {req.broker_epoch} is not the live incarnation",
        )
        return result
    for item in req.partitions:
        tp = (item.topic, item.partition)
        answer = controller_pb2.AlterPartitionResult(topic=item.topic, partition=item.partition)
        state = ctx.states.get(tp)
        if state is None or item.topic in ctx.topics_to_delete:
            answer.error_code = common_pb2.UNKNOWN_TOPIC_OR_PARTITION
            answer.error_message = f"{item.topic}-{item.partition} does not exist"
        elif state.leader != req.broker_id:
            answer.error_code = common_pb2.NOT_LEADER_OR_FOLLOWER
            answer.error_message = f"broker {req.broker_id} is not the leader (leader is {state.leader})"
            answer.state.CopyFrom(ctx.partition_state_proto(tp))
        elif item.leader_epoch != state.leader_epoch:
            answer.error_code = common_pb2.FENCED_LEADER_EPOCH
            answer.error_message = f"leader epoch {item.leader_epoch} is not the current {state.leader_epoch}"
            answer.state.CopyFrom(ctx.partition_state_proto(tp))
        elif item.partition_epoch != state.partition_epoch:
            answer.error_code = common_pb2.INVALID_UPDATE_VERSION
            answer.error_message = (
                f"partition epoch {item.partition_epoch} is stale; current is "
                f"{state.partition_epoch}: re-read the state and retry"
            )
            answer.state.CopyFrom(ctx.partition_state_proto(tp))
        else:
            new_isr = tuple(item.new_isr)
            replicas = ctx.replicas(tp)
            added = [r for r in new_isr if r not in state.isr]
            if (
                req.broker_id not in new_isr
                or any(r not in replicas for r in new_isr)
                or len(set(new_isr)) != len(new_isr)
            ):
                answer.error_code = common_pb2.INVALID_REQUEST
                answer.error_message = (
                    f"ISR {list(new_isr)} must contain the leader and only replicas {replicas}"
                )
            elif any(not ctx.is_live(r) for r in added):
                answer.error_code = common_pb2.INVALID_REQUEST
                answer.error_message = f"replicas {added} are not live and cannot join the ISR"
            else:
                new = state.next(
                    leader=state.leader, isr=new_isr, controller_epoch=ctx.epoch, bump_epoch=False
                )
                result.writes.append(StateWrite(tp, new, state.partition_epoch))
                result.rpcs.update_metadata.add(tp)
                answer.state.CopyFrom(ctx.partition_state_proto(tp))
                answer.state.isr[:] = list(new_isr)
                answer.state.partition_epoch = new.partition_epoch
                answer.state.controller_epoch = ctx.epoch
        answers.append(answer)
    result.response = controller_pb2.AlterPartitionResponse(partitions=answers)
    return result


def on_controlled_shutdown(ctx: ControllerContext, broker_id: int, broker_epoch: int) -> ControllerResult:
    """Move every leadership off the broker and take it out of the ISRs before it stops."""
    result = ControllerResult()
    broker = ctx.live_brokers.get(broker_id)
    if broker is None or broker.broker_epoch != broker_epoch:
        result.response = controller_pb2.ControlledShutdownResponse(
            error_code=common_pb2.STALE_BROKER_EPOCH,
            error_message=f"broker {broker_id} epoch {broker_epoch} is not a live incarnation",
        )
        return result
    result.writes.append(ShuttingDownWrite(add=frozenset({broker_id})))
    shutting_down = ctx.shutting_down | {broker_id}
    live = {b for b in ctx.live_brokers if b not in shutting_down}
    remaining = []
    for tp in ctx.partitions():
        state = ctx.states.get(tp)
        # A topic being deleted is left alone, as Kafka's controller does: a LeaderAndIsr for it
        # would bring back replicas already deleted.
        if state is None or broker_id not in ctx.replicas(tp) or tp[0] in ctx.topics_to_delete:
            continue
        if state.leader == broker_id:
            choice = elections.controlled_shutdown_leader(ctx.replicas(tp), state.isr, live, shutting_down)
            if choice is None:
                remaining.append(common_pb2.TopicPartition(topic=tp[0], partition=tp[1]))
                continue
            _change_state(ctx, result, tp, leader=choice[0], isr=choice[1])
        elif broker_id in state.isr and len(state.isr) > 1:
            _change_state(
                ctx, result, tp, leader=state.leader, isr=tuple(r for r in state.isr if r != broker_id)
            )
            result.rpcs.stop_replica.setdefault(broker_id, {})[tp] = False
    result.response = controller_pb2.ControlledShutdownResponse(remaining_partitions=remaining)
    return result


def on_elect_leaders(ctx: ControllerContext, req: common_pb2.ElectLeadersRequest) -> ControllerResult:
    result = ControllerResult()
    wanted = [(p.topic, p.partition) for p in req.partitions] or [
        tp for tp in ctx.partitions() if tp[0] not in ctx.topics_to_delete
    ]
    live = {b for b in ctx.live_brokers if ctx.is_live(b)}
    answers = []
    for tp in wanted:
        answer = common_pb2.PartitionResult(topic=tp[0], partition=tp[1])
        state = ctx.states.get(tp)
        if state is None or tp[0] not in ctx.topics:
            answer.error_code = common_pb2.UNKNOWN_TOPIC_OR_PARTITION
            answer.error_message = f"{tp[0]}-{tp[1]} does not exist"
        elif tp[0] in ctx.topics_to_delete:
            answer.error_code = common_pb2.UNKNOWN_TOPIC_OR_PARTITION
            answer.error_message = f"topic {tp[0]!r} is being deleted"
        elif req.election_type == common_pb2.PREFERRED:
            replicas = ctx.replicas(tp)
            if state.leader == replicas[0]:
                answer.error_code = common_pb2.ELECTION_NOT_NEEDED
                answer.error_message = f"the preferred replica {replicas[0]} already leads"
            else:
                choice = elections.preferred_replica_leader(replicas, state.isr, live)
                if choice is None:
                    answer.error_code = common_pb2.PREFERRED_LEADER_NOT_AVAILABLE
                    answer.error_message = f"preferred replica {replicas[0]} is not live or not in the ISR"
                else:
                    _change_state(ctx, result, tp, leader=choice[0], isr=choice[1])
        else:
            if state.leader in live:
                answer.error_code = common_pb2.ELECTION_NOT_NEEDED
                answer.error_message = f"broker {state.leader} leads; an unclean election is not needed"
            else:
                choice, _unclean = elections.offline_partition_leader(ctx.replicas(tp), state.isr, live, True)
                if choice is None:
                    answer.error_code = common_pb2.ELIGIBLE_LEADERS_NOT_AVAILABLE
                    answer.error_message = "no replica of the partition is live"
                else:
                    if choice[0] not in state.isr:
                        result.unclean_elections += 1
                    _change_state(ctx, result, tp, leader=choice[0], isr=choice[1])
        answers.append(answer)
    result.response = common_pb2.ElectLeadersResponse(partitions=answers)
    return result


def on_create_partitions(ctx: ControllerContext, req: common_pb2.CreatePartitionsRequest) -> ControllerResult:
    result = ControllerResult()
    answers = []
    live_racks = {b: info.rack for b, info in ctx.live_brokers.items() if ctx.is_live(b)}
    granted: Counter[int] = Counter()
    for ct in req.topics:
        answer = common_pb2.TopicResult(name=ct.name)
        try:
            topic = require_topic(ctx, ct.name)
            if ct.name in ctx.topics_to_delete:
                raise UnknownTopicOrPartition(f"topic {ct.name!r} is being deleted")
            current = len(topic.assignment)
            if ct.count <= current:
                raise InvalidPartitions(
                    f"topic {ct.name!r} has {current} partitions; the new count must be "
                    f"larger, got {ct.count}"
                )
            if ct.count > limits.PARTITIONS_PER_TOPIC_MAX:
                raise InvalidPartitions(
                    f"{ct.count} partitions is above the limit {limits.PARTITIONS_PER_TOPIC_MAX}"
                )
            rf = len(topic.assignment[0])
            if ct.assignments:
                added = {current + i: tuple(rl.replicas) for i, rl in enumerate(ct.assignments)}
                if len(added) != ct.count - current:
                    raise InvalidReplicaAssignment(f"give {ct.count - current} assignments, got {len(added)}")
                _check_assignment({**topic.assignment, **added}, set(ctx.live_brokers))
            else:
                added = assign_replicas(
                    live_racks, ct.count - current, rf, start_index=len(ctx.topics), first_partition=current
                )
            granted = _check_replicas_per_broker(ctx, added, granted)
            answer.num_partitions = ct.count
            answer.replication_factor = rf
            if not req.validate_only:
                new_topic = TopicInfo(
                    topic.name,
                    topic.topic_id,
                    {**topic.assignment, **added},
                    topic.configs,
                    topic.adding_replicas,
                    topic.removing_replicas,
                )
                result.writes.append(TopicWrite(new_topic, create=False))
                for p, replicas in sorted(added.items()):
                    live_replicas = tuple(r for r in replicas if ctx.is_live(r))
                    leader = live_replicas[0] if live_replicas else NO_LEADER
                    result.writes.append(
                        StateWrite(
                            (ct.name, p), LeaderAndIsr(leader, 0, live_replicas or replicas, ctx.epoch, 1), 0
                        )
                    )
                    result.rpcs.add_leader_and_isr(live_replicas, (ct.name, p), is_new=True)
        except HighwaterError as exc:
            answer.error_code, answer.error_message = exc.code, exc.message
        answers.append(answer)
    result.response = common_pb2.CreatePartitionsResponse(topics=answers)
    return result


def on_alter_topic_configs(
    ctx: ControllerContext, req: common_pb2.AlterTopicConfigsRequest
) -> ControllerResult:
    """Change existing topics' configs (Kafka's AlterConfigs / IncrementalAlterConfigs for topics).

    Each topic is decided on its own: the new configs go through the one schema
    (clients/common/topics.py) and replace the topic's config key in etcd; every broker and
    gateway then gets an UpdateMetadata with them, and each replica's log takes the new values
    (BrokerCore.update_metadata). A change to nothing writes nothing.
    """
    result = ControllerResult()
    answers = []
    seen: set[str] = set()
    for change in req.topics:
        answer = common_pb2.TopicResult(name=change.name)
        try:
            if change.name in seen:
                raise InvalidRequest(f"topic {change.name!r} is named twice; name each topic once")
            seen.add(change.name)
            topic = require_topic(ctx, change.name)
            if change.name in ctx.topics_to_delete:
                raise UnknownTopicOrPartition(f"topic {change.name!r} is being deleted")
            configs = altered_topic_configs(
                topic.configs, dict(change.set_configs), list(change.delete_configs), replace=change.replace
            )
            rf = len(next(iter(topic.assignment.values()), ()))
            min_isr = int(configs.get("min.insync.replicas", limits.DEFAULT_MIN_INSYNC_REPLICAS))
            if min_isr > rf:
                raise InvalidConfig(
                    f"min.insync.replicas={min_isr} is larger than the replication factor {rf} of "
                    f"{change.name!r}: acks=all writes could never succeed"
                )
            answer.num_partitions = len(topic.assignment)
            answer.replication_factor = rf
            if not req.validate_only and configs != topic.configs:
                result.writes.append(ConfigWrite(change.name, configs))
                result.rpcs.update_metadata.update(ctx.partitions_of(change.name))
        except HighwaterError as exc:
            answer.error_code, answer.error_message = exc.code, exc.message
        answers.append(answer)
    result.response = common_pb2.AlterTopicConfigsResponse(topics=answers)
    return result


# ---- automatic leader rebalance ------------------------------------------------------------------


def on_auto_leader_rebalance(ctx: ControllerContext, imbalance_percentage_max: int) -> ControllerResult:
    """Preferred elections for brokers whose share of non-preferred leadership passes the threshold."""
    result = ControllerResult()
    live = {b for b in ctx.live_brokers if ctx.is_live(b)}
    by_preferred: dict[int, list[TopicPartitionKey]] = {}
    for tp in ctx.partitions():
        if tp[0] in ctx.topics_to_delete or tp not in ctx.states:
            continue
        by_preferred.setdefault(ctx.replicas(tp)[0], []).append(tp)
    for broker_id, tps in sorted(by_preferred.items()):
        if broker_id not in live:
            continue
        not_led = [tp for tp in tps if ctx.states[tp].leader != broker_id]
        if not tps or len(not_led) * 100 <= imbalance_percentage_max * len(tps):
            continue
        log.info(
            "broker %d leads %d of its %d preferred partitions; rebalancing",
            broker_id,
            len(tps) - len(not_led),
            len(tps),
        )
        for tp in not_led:
            state = ctx.states[tp]
            choice = elections.preferred_replica_leader(ctx.replicas(tp), state.isr, live)
            if choice is not None:
                _change_state(ctx, result, tp, leader=choice[0], isr=choice[1])
    return result
