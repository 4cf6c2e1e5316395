"""Controller event handlers: inputs, and the exact writes and RPCs they ask for."""

from __future__ import annotations

import dataclasses

import pytest

from protos.highwater.v1 import common_pb2, controller_pb2
from services.common import limits
from services.controller import admin_requests, deletion, handlers, reassignment, results
from services.controller.assignment import assign_replicas, rack_alternating_order
from services.controller.context import BrokerInfo, ControllerContext, LeaderAndIsr, TopicInfo
from services.controller.elections import offline_partition_leader
from services.controller.results import AdminKeyDelete, ControllerResult, StateWrite, TopicWrite, apply_write


def broker(i: int, epoch: int = 100, rack: str = "") -> BrokerInfo:
    return BrokerInfo(i, "127.0.0.1", 9000 + i, rack, 0, epoch + i)


def context(brokers: list[int], *, epoch: int = 5) -> ControllerContext:
    ctx = ControllerContext(controller_id=1, epoch=epoch)
    ctx.live_brokers = {b: broker(b) for b in brokers}
    return ctx


def commit(ctx: ControllerContext, result: ControllerResult) -> None:
    for w in result.writes:
        apply_write(ctx, w)


def with_topic(
    ctx: ControllerContext,
    name: str,
    assignment: dict[int, tuple[int, ...]],
    configs: dict[str, str] | None = None,
) -> None:
    req = common_pb2.CreateTopicsRequest(
        topics=[
            common_pb2.CreatableTopic(
                name=name,
                num_partitions=-1,
                replication_factor=-1,
                configs=configs or {},
                assignments={p: common_pb2.ReplicaList(replicas=list(r)) for p, r in assignment.items()},
            )
        ]
    )
    result = handlers.on_create_topics(ctx, req)
    assert result.response.topics[0].error_code == 0, result.response.topics[0].error_message
    commit(ctx, result)


def test_create_topic_writes_assignment_then_initial_states_and_tells_replicas():
    ctx = context([1, 2, 3])
    req = common_pb2.CreateTopicsRequest(
        topics=[
            common_pb2.CreatableTopic(
                name="orders", num_partitions=3, replication_factor=3, configs={"min.insync.replicas": "2"}
            )
        ]
    )
    result = handlers.on_create_topics(ctx, req)
    answer = result.response.topics[0]
    assert (answer.error_code, answer.num_partitions, answer.replication_factor) == (0, 3, 3)
    topic_writes = [w for w in result.writes if isinstance(w, TopicWrite)]
    state_writes = [w for w in result.writes if isinstance(w, StateWrite)]
    assert len(topic_writes) == 1 and topic_writes[0].create
    assert [w.tp for w in state_writes] == [("orders", 0), ("orders", 1), ("orders", 2)]
    for w in state_writes:
        replicas = topic_writes[0].topic.assignment[w.tp[1]]
        assert w.expected_version == 0
        assert w.state.leader == replicas[0]
        assert w.state.isr == replicas
        assert (w.state.leader_epoch, w.state.partition_epoch, w.state.controller_epoch) == (0, 1, 5)
    leaders = sorted(w.state.leader for w in state_writes)
    assert leaders == [1, 2, 3], "leaders are balanced over brokers"
    assert set(result.rpcs.leader_and_isr) == {1, 2, 3}
    assert all(len(tps) == 3 for tps in result.rpcs.leader_and_isr.values())
    assert ctx.topics == {}, "deciding changes nothing: only apply_write does"


@pytest.mark.parametrize(
    "name,rf,configs,code",
    [
        ("", 1, {}, common_pb2.INVALID_TOPIC),
        ("a/b", 1, {}, common_pb2.INVALID_TOPIC),
        ("x" * 250, 1, {}, common_pb2.INVALID_TOPIC),
        ("ok", 4, {}, common_pb2.INVALID_REPLICATION_FACTOR),
        ("ok", 2, {"min.insync.replicas": "3"}, common_pb2.INVALID_REPLICATION_FACTOR),
        ("ok", 1, {"no.such.config": "1"}, common_pb2.INVALID_CONFIG),
        ("ok", 1, {"retention.ms": "soon"}, common_pb2.INVALID_CONFIG),
        # Found by the adversarial review: above int32 it stopped every controller start; below one
        # batch header every broker refused the replica while the topic looked healthy.
        ("ok", 1, {"max.message.bytes": "3000000000"}, common_pb2.INVALID_CONFIG),
        ("ok", 1, {"max.message.bytes": "1"}, common_pb2.INVALID_CONFIG),
        ("ok", 1, {"min.insync.replicas": str(2**31)}, common_pb2.INVALID_CONFIG),
        ("orders\n", 1, {}, common_pb2.INVALID_TOPIC),
        ("orders\r\n", 1, {}, common_pb2.INVALID_TOPIC),
    ],
)
def test_create_topic_rejects_bad_input_with_named_errors_and_writes_nothing(name, rf, configs, code):
    ctx = context([1, 2, 3])
    req = common_pb2.CreateTopicsRequest(
        topics=[
            common_pb2.CreatableTopic(name=name, num_partitions=1, replication_factor=rf, configs=configs)
        ]
    )
    result = handlers.on_create_topics(ctx, req)
    assert result.response.topics[0].error_code == code
    assert result.response.topics[0].error_message
    assert result.writes == []


def test_explicit_assignment_with_unknown_broker_or_duplicate_is_refused():
    ctx = context([1, 2, 3])
    for replicas in ([1, 9], [2, 2]):
        req = common_pb2.CreateTopicsRequest(
            topics=[
                common_pb2.CreatableTopic(
                    name="t",
                    num_partitions=-1,
                    replication_factor=-1,
                    assignments={0: common_pb2.ReplicaList(replicas=replicas)},
                )
            ]
        )
        result = handlers.on_create_topics(ctx, req)
        assert result.response.topics[0].error_code == common_pb2.INVALID_REPLICA_ASSIGNMENT
        assert result.writes == []


def test_broker_failure_elects_first_live_isr_replica_in_ar_order_and_bumps_epoch():
    ctx = context([1, 2, 3])
    with_topic(ctx, "t", {0: (1, 2, 3), 1: (2, 3, 1), 2: (3, 1, 2)})
    registered = {b: ctx.live_brokers[b] for b in (2, 3)}
    result = handlers.on_broker_change(ctx, registered)
    writes = {w.tp: w for w in result.writes if isinstance(w, StateWrite)}
    # Partition 0 was led by 1: the next replica in AR order that is in the ISR leads.
    assert writes[("t", 0)].state.leader == 2
    assert writes[("t", 0)].state.isr == (2, 3)
    assert writes[("t", 0)].state.leader_epoch == 1
    assert writes[("t", 0)].expected_version == 1
    # Partitions led elsewhere only lose broker 1 from their ISR.
    assert writes[("t", 1)].state.leader == 2 and writes[("t", 1)].state.isr == (2, 3)
    assert writes[("t", 2)].state.leader == 3 and writes[("t", 2)].state.isr == (3, 2)
    assert result.rpcs.full_metadata
    assert set(result.rpcs.leader_and_isr) == {2, 3}


def test_no_live_isr_member_takes_the_partition_offline_unless_unclean_is_enabled():
    for unclean, leader in (("false", -1), ("true", 3)):
        ctx = context([1, 2, 3])
        with_topic(ctx, "t", {0: (1, 2, 3)}, {"unclean.leader.election.enable": unclean})
        commit(ctx, ControllerResult(writes=[StateWrite(("t", 0), LeaderAndIsr(1, 0, (1, 2), 5, 2), 1)]))
        result = handlers.on_broker_change(ctx, {3: ctx.live_brokers[3]})
        state = next(w.state for w in result.writes if isinstance(w, StateWrite))
        assert state.leader == leader
        assert result.unclean_elections == (1 if unclean == "true" else 0)
        if leader == -1:
            assert state.isr == (1, 2), "an offline partition keeps its last ISR"


def test_returning_broker_is_told_its_partitions_and_offline_partitions_get_a_leader():
    ctx = context([2, 3])
    with_topic(ctx, "t", {0: (2, 3)})
    commit(ctx, ControllerResult(writes=[StateWrite(("t", 0), LeaderAndIsr(-1, 3, (2,), 5, 2), 1)]))
    ctx.live_brokers = {3: broker(3)}
    result = handlers.on_broker_change(ctx, {2: broker(2), 3: broker(3)})
    state = next(w.state for w in result.writes if isinstance(w, StateWrite))
    assert (state.leader, state.isr, state.leader_epoch) == (2, (2,), 4)
    assert ("t", 0) in result.rpcs.leader_and_isr[2]


def test_alter_partition_is_guarded_by_leader_epoch_and_partition_epoch():
    ctx = context([1, 2, 3])
    with_topic(ctx, "t", {0: (1, 2, 3)})

    def alter(
        broker_id: int, leader_epoch: int, partition_epoch: int, isr: list[int]
    ) -> controller_pb2.AlterPartitionResult:
        req = controller_pb2.AlterPartitionRequest(
            broker_id=broker_id,
            broker_epoch=ctx.live_brokers[broker_id].broker_epoch,
            partitions=[
                controller_pb2.AlterPartitionItem(
                    topic="t",
                    partition=0,
                    leader_epoch=leader_epoch,
                    partition_epoch=partition_epoch,
                    new_isr=isr,
                )
            ],
        )
        result = handlers.on_alter_partition(ctx, req)
        commit(ctx, result)
        return result.response.partitions[0]

    assert alter(2, 0, 1, [2]).error_code == common_pb2.NOT_LEADER_OR_FOLLOWER
    assert alter(1, 7, 1, [1, 2]).error_code == common_pb2.FENCED_LEADER_EPOCH
    stale = alter(1, 0, 9, [1, 2])
    assert stale.error_code == common_pb2.INVALID_UPDATE_VERSION
    assert stale.state.partition_epoch == 1, "a conflict answers the current state so the leader can retry"
    assert alter(1, 0, 1, [2, 3]).error_code == common_pb2.INVALID_REQUEST, "the leader must stay in its ISR"
    ok = alter(1, 0, 1, [1, 2])
    assert ok.error_code == 0 and list(ok.state.isr) == [1, 2] and ok.state.partition_epoch == 2
    assert ctx.states[("t", 0)].isr == (1, 2)
    assert ctx.states[("t", 0)].leader_epoch == 0, "an ISR change keeps the leader epoch"


def test_alter_partition_from_a_previous_broker_incarnation_is_fenced():
    ctx = context([1, 2, 3])
    with_topic(ctx, "t", {0: (1, 2, 3)})
    req = controller_pb2.AlterPartitionRequest(broker_id=1, broker_epoch=1, partitions=[])
    assert handlers.on_alter_partition(ctx, req).response.error_code == common_pb2.STALE_BROKER_EPOCH


def test_controlled_shutdown_moves_leadership_to_another_isr_member():
    ctx = context([1, 2, 3])
    with_topic(ctx, "t", {0: (1, 2, 3), 1: (2, 1, 3)})
    result = handlers.on_controlled_shutdown(ctx, 1, ctx.live_brokers[1].broker_epoch)
    writes = {w.tp: w.state for w in result.writes if isinstance(w, StateWrite)}
    assert writes[("t", 0)].leader == 2 and 1 not in writes[("t", 0)].isr
    assert writes[("t", 1)].leader == 2 and 1 not in writes[("t", 1)].isr
    assert list(result.response.remaining_partitions) == []
    assert 1 not in ctx.shutting_down, "deciding changes nothing; replaying the writes does"
    commit(ctx, result)
    assert 1 in ctx.shutting_down


def test_controlled_shutdown_of_sole_isr_member_reports_the_partition_as_remaining():
    ctx = context([1, 2])
    with_topic(ctx, "t", {0: (1, 2)})
    commit(ctx, ControllerResult(writes=[StateWrite(("t", 0), LeaderAndIsr(1, 0, (1,), 5, 2), 1)]))
    result = handlers.on_controlled_shutdown(ctx, 1, ctx.live_brokers[1].broker_epoch)
    assert [(p.topic, p.partition) for p in result.response.remaining_partitions] == [("t", 0)]


def test_preferred_election_moves_leadership_back_to_the_first_replica():
    ctx = context([1, 2, 3])
    with_topic(ctx, "t", {0: (1, 2, 3)})
    commit(ctx, ControllerResult(writes=[StateWrite(("t", 0), LeaderAndIsr(2, 1, (2, 3, 1), 5, 2), 1)]))
    req = common_pb2.ElectLeadersRequest(
        election_type=common_pb2.PREFERRED,
        partitions=[
            common_pb2.TopicPartition(topic="t", partition=0),
            common_pb2.TopicPartition(topic="nope", partition=0),
        ],
    )
    result = handlers.on_elect_leaders(ctx, req)
    assert [p.error_code for p in result.response.partitions] == [0, common_pb2.UNKNOWN_TOPIC_OR_PARTITION]
    state = next(w.state for w in result.writes if isinstance(w, StateWrite))
    assert (state.leader, state.leader_epoch) == (1, 2)


def test_delete_topic_removes_keys_only_after_every_replica_confirmed_deletion():
    ctx = context([1, 2, 3])
    with_topic(ctx, "t", {0: (1, 2), 1: (2, 3)})
    del ctx.live_brokers[3]
    result = deletion.on_delete_topics(ctx, ["t", "missing"], deletion_enabled=True)
    assert [t.error_code for t in result.response.topics] == [0, common_pb2.UNKNOWN_TOPIC_OR_PARTITION]
    assert result.rpcs.stop_replica == {1: {("t", 0): True}, 2: {("t", 0): True, ("t", 1): True}}
    commit(ctx, result)
    assert ctx.topics_to_delete == {"t"} and "t" in ctx.topics
    commit(ctx, deletion.on_replica_deletion_result(ctx, 1, ctx.with_broker_epoch(1), [("t", 0)], True))
    commit(
        ctx, deletion.on_replica_deletion_result(ctx, 2, ctx.with_broker_epoch(2), [("t", 0), ("t", 1)], True)
    )
    assert "t" in ctx.topics, "broker 3 (down) has not deleted its replica yet"
    returned = handlers.on_broker_change(ctx, {**ctx.live_brokers, 3: broker(3)})
    assert returned.rpcs.stop_replica[3] == {("t", 1): True}
    commit(ctx, returned)
    done = deletion.on_replica_deletion_result(ctx, 3, ctx.with_broker_epoch(3), [("t", 1)], True)
    assert any(isinstance(w, results.TopicDelete) for w in done.writes)
    commit(ctx, done)
    assert "t" not in ctx.topics and not ctx.states and not ctx.topics_to_delete
    disabled = deletion.on_delete_topics(ctx, ["x"], deletion_enabled=False)
    assert disabled.response.topics[0].error_code == common_pb2.TOPIC_DELETION_DISABLED


def _reassign(ctx: ControllerContext, topic: str, partition: int, replicas: list[int], cancel: bool = False):
    req = common_pb2.AlterPartitionReassignmentsRequest(
        topics=[
            common_pb2.ReassignableTopic(
                name=topic,
                partitions=[
                    common_pb2.ReassignablePartition(partition=partition, replicas=replicas, cancel=cancel)
                ],
            )
        ]
    )
    return reassignment.on_alter_reassignments(ctx, req)


def _isr(ctx: ControllerContext, tp, isr: tuple[int, ...]) -> None:
    s = ctx.states[tp]
    commit(
        ctx,
        ControllerResult(
            writes=[
                StateWrite(
                    tp,
                    s.next(leader=s.leader, isr=isr, controller_epoch=ctx.epoch, bump_epoch=False),
                    s.partition_epoch,
                )
            ]
        ),
    )


def test_reassignment_walk_from_oar_123_to_rar_456_step_by_step():
    ctx = context([1, 2, 3, 4, 5, 6])
    with_topic(ctx, "t", {0: (1, 2, 3)})
    tp = ("t", 0)
    start = _reassign(ctx, "t", 0, [4, 5, 6])
    assert start.response.partitions[0].error_code == 0
    # Step 1: AR := RAR + OAR, adding/removing recorded, leader epoch bumped, new replicas started.
    topic_write = next(w for w in start.writes if isinstance(w, TopicWrite))
    assert topic_write.topic.assignment[0] == (4, 5, 6, 1, 2, 3)
    assert topic_write.topic.adding_replicas[0] == (4, 5, 6)
    assert topic_write.topic.removing_replicas[0] == (1, 2, 3)
    state_write = next(w for w in start.writes if isinstance(w, StateWrite))
    assert state_write.state.leader_epoch == 1 and state_write.state.leader == 1
    assert {(b, tp) for b in (4, 5, 6)} <= start.rpcs.new_replicas
    commit(ctx, start)
    assert reassignment.list_reassignments(ctx, common_pb2.ListPartitionReassignmentsRequest()).reassignments[
        0
    ].adding_replicas == [4, 5, 6]
    # Step 2: nothing happens until every target replica is in the ISR.
    _isr(ctx, tp, (1, 2, 3, 4, 5))
    assert reassignment.on_reassignment_progress(ctx).writes == []
    _isr(ctx, tp, (1, 2, 3, 4, 5, 6))
    done = reassignment.on_reassignment_progress(ctx)
    # Step 3: leader moved into RAR, OAR-RAR out of the ISR and deleted, AR := RAR (written last).
    state = next(w.state for w in done.writes if isinstance(w, StateWrite))
    assert state.leader == 4 and state.isr == (4, 5, 6) and state.leader_epoch == 2
    assert isinstance(done.writes[-1], TopicWrite) and done.writes[-1].topic.assignment[0] == (4, 5, 6)
    assert done.rpcs.stop_replica == {1: {tp: True}, 2: {tp: True}, 3: {tp: True}}
    commit(ctx, done)
    assert reassignment.ongoing_reassignments(ctx) == []


@pytest.mark.parametrize("crash_after_write", range(3))
def test_reassignment_resumes_after_a_controller_crash_at_every_step(crash_after_write):
    """A new controller rebuilt from what was committed finishes the same walk."""
    ctx = context([1, 2, 3, 4, 5, 6])
    with_topic(ctx, "t", {0: (1, 2, 3)})
    tp = ("t", 0)
    commit(ctx, _reassign(ctx, "t", 0, [4, 5, 6]))
    _isr(ctx, tp, (1, 2, 3, 4, 5, 6))
    finishing = reassignment.on_reassignment_progress(ctx)
    # The crash: only the first writes of the finishing step reached etcd.
    for w in finishing.writes[:crash_after_write]:
        apply_write(ctx, w)
    fresh = ControllerContext(
        controller_id=2,
        epoch=ctx.epoch + 1,
        live_brokers=dict(ctx.live_brokers),
        topics=ctx.topics,
        states=ctx.states,
    )
    commit(fresh, handlers.on_startup(fresh))
    for _ in range(3):
        commit(fresh, reassignment.on_reassignment_progress(fresh))
    assert reassignment.ongoing_reassignments(fresh) == []
    assert fresh.topics["t"].assignment[0] == (4, 5, 6)
    assert fresh.states[tp].leader in (4, 5, 6)
    assert set(fresh.states[tp].isr) <= {4, 5, 6}


def test_reassignment_bad_input_is_refused_with_named_errors():
    ctx = context([1, 2, 3])
    with_topic(ctx, "t", {0: (1, 2)})
    cases = [
        ("t", 0, [1, 9], common_pb2.INVALID_REPLICA_ASSIGNMENT),
        ("t", 0, [3, 3], common_pb2.INVALID_REPLICA_ASSIGNMENT),
        ("t", 5, [1, 2], common_pb2.UNKNOWN_TOPIC_OR_PARTITION),
        ("nope", 0, [1, 2], common_pb2.UNKNOWN_TOPIC_OR_PARTITION),
        ("t", 0, [], common_pb2.NO_REASSIGNMENT_IN_PROGRESS),
    ]
    for topic, p, replicas, code in cases:
        result = _reassign(ctx, topic, p, replicas)
        assert result.response.partitions[0].error_code == code, (topic, p, replicas)
        assert result.writes == [] or all(
            isinstance(w, TopicWrite) and w.topic.assignment == ctx.topics["t"].assignment
            for w in result.writes
        )


def test_cancelled_reassignment_returns_to_the_original_replicas():
    ctx = context([1, 2, 3, 4])
    with_topic(ctx, "t", {0: (1, 2)})
    commit(ctx, _reassign(ctx, "t", 0, [3, 4]))
    cancel = _reassign(ctx, "t", 0, [], cancel=True)
    assert cancel.response.partitions[0].error_code == 0
    commit(ctx, cancel)
    assert ctx.topics["t"].assignment[0] == (1, 2) and reassignment.ongoing_reassignments(ctx) == []
    assert cancel.rpcs.stop_replica == {3: {("t", 0): True}, 4: {("t", 0): True}}


def test_malformed_admin_json_is_refused_logged_and_removed():
    ctx = context([1, 2])
    result = admin_requests.on_admin_request(
        ctx, "reassign", "/highwater/admin/reassign_partitions", b"{not json"
    )
    assert [type(w) for w in result.writes] == [AdminKeyDelete]


def test_auto_rebalance_moves_leadership_back_when_imbalance_passes_the_threshold():
    ctx = context([1, 2])
    with_topic(ctx, "t", {0: (1, 2), 1: (1, 2), 2: (2, 1)})
    for p in (0, 1):
        s = ctx.states[("t", p)]
        commit(
            ctx,
            ControllerResult(
                writes=[
                    StateWrite(("t", p), s.next(leader=2, isr=(2, 1), controller_epoch=5), s.partition_epoch)
                ]
            ),
        )
    result = handlers.on_auto_leader_rebalance(ctx, imbalance_percentage_max=10)
    assert sorted(w.tp for w in result.writes) == [("t", 0), ("t", 1)]
    assert all(w.state.leader == 1 for w in result.writes)


def test_leader_epoch_never_decreases_when_replaying():
    ctx = context([1])
    with_topic(ctx, "t", {0: (1,)})
    commit(ctx, ControllerResult(writes=[StateWrite(("t", 0), LeaderAndIsr(1, 3, (1,), 5, 2), 1)]))
    from clients.common.errors import InvariantViolation

    with pytest.raises(InvariantViolation, match="would go back"):
        apply_write(ctx, StateWrite(("t", 0), LeaderAndIsr(1, 2, (1,), 5, 3), 2))


def test_assignment_spreads_replicas_over_racks_and_balances_leaders():
    racks = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}
    assert rack_alternating_order(racks) == [1, 3, 5, 2, 4, 6]
    assignment = assign_replicas(racks, 12, 3)
    for replicas in assignment.values():
        assert len({racks[r] for r in replicas}) == 3, replicas
    leaders = [r[0] for r in assignment.values()]
    assert all(leaders.count(b) == 2 for b in racks)


def test_offline_election_prefers_ar_order_not_isr_order():
    assert offline_partition_leader((3, 1, 2), (1, 2, 3), {1, 2, 3}, False) == ((3, (1, 2, 3)), False)
    assert offline_partition_leader((3, 1, 2), (1, 2), {2}, False) == ((2, (2,)), False)
    assert offline_partition_leader((3, 1, 2), (1,), {2, 3}, False) == (None, False)


def test_startup_initialises_partitions_whose_state_was_never_written():
    ctx = context([1, 2])
    ctx.topics["half"] = TopicInfo("half", "id", {0: (1, 2), 1: (2, 1)})
    result = handlers.on_startup(ctx)
    writes = [w for w in result.writes if isinstance(w, StateWrite)]
    assert [(w.tp, w.state.leader, w.expected_version) for w in writes] == [
        (("half", 0), 1, 0),
        (("half", 1), 2, 0),
    ]
    assert result.rpcs.full_metadata


def test_hand_written_deletion_of_an_unknown_topic_is_logged_and_its_key_removed():
    ctx = context([1])
    result = admin_requests.on_admin_delete_marker(
        ctx, "ghost", "/highwater/admin/delete_topics/ghost", deletion_enabled=True
    )
    assert [type(w) for w in result.writes] == [AdminKeyDelete]


def test_a_bounced_broker_leaves_the_isr_and_another_in_sync_replica_leads():
    """Kafka's processBrokerChange: a new incarnation may have lost unflushed records (sim seed KI-1)."""
    ctx = context([1, 2, 3])
    with_topic(ctx, "t", {0: (1, 2, 3), 1: (2, 1, 3)})
    bounced = BrokerInfo(1, "127.0.0.1", 9101, "", 0, 999)
    result = handlers.on_broker_change(ctx, {1: bounced, 2: ctx.live_brokers[2], 3: ctx.live_brokers[3]})
    states = {w.tp: w.state for w in result.writes if isinstance(w, StateWrite)}
    assert states[("t", 0)].leader == 2 and states[("t", 0)].isr == (2, 3)
    assert states[("t", 1)].leader == 2 and states[("t", 1)].isr == (2, 3)
    assert ("t", 0) in result.rpcs.leader_and_isr[1], "the new incarnation is told to follow"


def test_a_bounced_broker_that_is_the_only_isr_member_leads_again():
    ctx = context([1, 2])
    with_topic(ctx, "t", {0: (1, 2)})
    commit(ctx, ControllerResult(writes=[StateWrite(("t", 0), LeaderAndIsr(1, 0, (1,), 5, 2), 1)]))
    result = handlers.on_broker_change(
        ctx, {1: BrokerInfo(1, "127.0.0.1", 9101, "", 0, 999), 2: ctx.live_brokers[2]}
    )
    state = next(w.state for w in result.writes if isinstance(w, StateWrite))
    assert (state.leader, state.isr, state.leader_epoch) == (1, (1,), 1)


def test_a_second_reassignment_keeps_the_replicas_the_first_one_added_until_the_walk_ends():
    """Sim seed KI-3: a new target must not drop a replica that already leads."""
    ctx = context([1, 2, 3, 4, 5])
    with_topic(ctx, "t", {0: (1, 2)})
    tp = ("t", 0)
    commit(ctx, _reassign(ctx, "t", 0, [3, 4]))
    _isr(ctx, tp, (1, 2, 3, 4))
    s = ctx.states[tp]
    commit(
        ctx,
        ControllerResult(
            writes=[StateWrite(tp, s.next(leader=3, isr=s.isr, controller_epoch=5), s.partition_epoch)]
        ),
    )
    second = _reassign(ctx, "t", 0, [5, 4])
    commit(ctx, second)
    assert 3 in ctx.topics["t"].assignment[0], "the current leader stays a replica while the walk goes on"
    assert ctx.states[tp].leader == 3
    _isr(ctx, tp, (1, 2, 3, 4, 5))
    commit(ctx, reassignment.on_reassignment_progress(ctx))
    assert ctx.topics["t"].assignment[0] == (5, 4)
    assert ctx.states[tp].leader in (5, 4) and set(ctx.states[tp].isr) <= {4, 5}


def test_topics_that_would_take_a_broker_past_its_replica_limit_are_refused(monkeypatch):
    monkeypatch.setattr(handlers.limits, "REPLICAS_PER_BROKER_MAX", 10)
    ctx = context([1, 2, 3])
    with_topic(ctx, "held", {p: (1, 2, 3) for p in range(4)})  # 4 replicas on each broker already
    req = common_pb2.CreateTopicsRequest(
        topics=[
            common_pb2.CreatableTopic(name="fits", num_partitions=6, replication_factor=3),
            common_pb2.CreatableTopic(name="over", num_partitions=1, replication_factor=3),
        ]
    )
    result = handlers.on_create_topics(ctx, req)
    fits, over = result.response.topics
    assert fits.error_code == common_pb2.NONE
    assert over.error_code == common_pb2.INVALID_PARTITIONS
    assert "would hold 11 replicas; the limit is 10 per broker" in over.error_message
    assert {w.topic.name for w in result.writes if isinstance(w, TopicWrite)} == {"fits"}
    grow = handlers.on_create_partitions(
        ctx,
        common_pb2.CreatePartitionsRequest(topics=[common_pb2.CreatePartitionsTopic(name="held", count=11)]),
    )
    assert grow.response.topics[0].error_code == common_pb2.INVALID_PARTITIONS
    assert grow.writes == []


def test_a_broker_registered_for_more_replicas_is_given_more_and_no_more():
    ctx = context([1, 2])
    ctx.live_brokers[1] = dataclasses.replace(
        ctx.live_brokers[1], replicas_max=limits.REPLICAS_PER_BROKER_MAX + 2
    )
    over_default = limits.REPLICAS_PER_BROKER_MAX + 1
    on_1 = handlers.on_create_topics(
        ctx,
        common_pb2.CreateTopicsRequest(
            topics=[
                common_pb2.CreatableTopic(
                    name="big",
                    num_partitions=-1,
                    replication_factor=-1,
                    assignments={p: common_pb2.ReplicaList(replicas=[1]) for p in range(over_default)},
                )
            ]
        ),
    )
    assert on_1.response.topics[0].error_code == common_pb2.NONE
    commit(ctx, on_1)
    on_2 = handlers.on_create_topics(
        ctx,
        common_pb2.CreateTopicsRequest(
            topics=[
                common_pb2.CreatableTopic(
                    name="default-bound",
                    num_partitions=-1,
                    replication_factor=-1,
                    assignments={p: common_pb2.ReplicaList(replicas=[2]) for p in range(over_default)},
                ),
                common_pb2.CreatableTopic(
                    name="past-its-own",
                    num_partitions=-1,
                    replication_factor=-1,
                    assignments={p: common_pb2.ReplicaList(replicas=[1]) for p in range(2)},
                ),
            ]
        ),
    )
    default_bound, past_its_own = on_2.response.topics
    assert default_bound.error_code == common_pb2.INVALID_PARTITIONS
    assert f"the limit is {limits.REPLICAS_PER_BROKER_MAX} per broker" in default_bound.error_message
    assert past_its_own.error_code == common_pb2.INVALID_PARTITIONS
    assert f"the limit is {limits.REPLICAS_PER_BROKER_MAX + 2} per broker" in past_its_own.error_message


def test_a_brokers_leader_and_isr_goes_in_requests_it_can_apply_within_the_call_deadline():
    """A 10,000-partition topic in one LeaderAndIsr took a broker past CONTROL_RPC_TIMEOUT_S and
    two thirds of its replicas were never created: a broker's share goes in requests of at most
    LEADER_AND_ISR_PARTITIONS_PER_REQUEST_MAX partitions, in order, every partition once."""
    from services.controller.control_requests import control_requests
    from services.controller.proto_cache import ProtoCache

    ctx = context([1, 2, 3])
    step = limits.LEADER_AND_ISR_PARTITIONS_PER_REQUEST_MAX
    count = 2 * step + 17
    req = common_pb2.CreateTopicsRequest(
        topics=[common_pb2.CreatableTopic(name="wide", num_partitions=count, replication_factor=3)]
    )
    result = handlers.on_create_topics(ctx, req)
    commit(ctx, result)
    targets = {("b", 1), ("b", 2), ("b", 3)}
    requests = [
        r for r in control_requests(ctx, result.rpcs, ProtoCache(), ctx.epoch, targets) if r is not None
    ]
    for broker_id in (1, 2, 3):
        sent = [
            r.request.parse() for r in requests if r.rpc == "LeaderAndIsr" and r.target == ("b", broker_id)
        ]
        assert [len(s.partitions) for s in sent] == [step, step, 17]
        named = [(p.state.topic, p.state.partition) for s in sent for p in s.partitions]
        assert named == sorted(("wide", p) for p in range(count)), "every partition once, in order"
        assert all(p.is_new for s in sent for p in s.partitions)
        for s in sent:
            leaders = {p.state.leader for p in s.partitions}
            assert {b.broker_id for b in s.live_leaders} == leaders, "each request names its own leaders"
