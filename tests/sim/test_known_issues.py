"""Bugs the simulation found in the pure logic, reduced to scripted scenarios (no randomness).

Each test asserts the behaviour DESIGN.md asks for and is xfail(strict=True) while the bug
is there: it starts passing, and so failing, the day the bug is fixed; then drop the mark
and keep the test.
tests/sim/test_simulation.py has a simulation seed for each as well; tests/sim/simulation.py
KNOWN_ISSUES describes them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from clients.common.records import encode_values
from protos.highwater.v1 import common_pb2, controller_pb2
from services.broker.core import BrokerCore
from services.broker.fetch_state import truncation_offset
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.partition import IsrChange, LeaderAndIsrState, Partition
from services.broker.steps import CallController, RpcFailed
from services.controller import deletion, handlers, reassignment, results
from services.controller.context import BrokerInfo, ControllerContext, LeaderAndIsr, TopicInfo

TP = ("t", 0)


# ---- KI-2: an empty leader epoch at the follower's LEO -------------------------------------


def _partition(broker_id: int, storage: MemoryStorage) -> Partition:
    return Partition(
        "t", 0, broker_id, Log.open(f"/ki2/b{broker_id}", LogConfig(), storage=storage, now_ms=0)
    )


def _state(leader: int, epoch: int) -> LeaderAndIsrState:
    return LeaderAndIsrState(leader, epoch, (1, 2), (1, 2), epoch + 1, 1)


def _replicate(follower: Partition, leader: Partition) -> None:
    """What SimFetcher / ReplicaFetcher do for one partition: OffsetsForLeaderEpoch, truncate, fetch."""
    asked = follower.log.leader_epoch_cache.latest_epoch()
    if asked is None:  # an empty log has nothing to truncate: fetch from the LEO
        records = leader.log.read(follower.log.log_end_offset, max_bytes=1 << 20).records
        follower.append_as_follower(records, now_ms=0)
        return
    epoch, end = leader.log.leader_epoch_cache.end_offset_for_epoch(asked)
    if epoch == leader.leader_epoch or (epoch >= 0 and end < 0):  # replica_manager.offsets_for_leader_epoch
        end = leader.log.log_end_offset
    _, local_end = follower.log.leader_epoch_cache.end_offset_for_epoch(epoch)
    local_leo = follower.log.log_end_offset
    offset = truncation_offset(
        local_leo=local_leo,
        requested_epoch=asked,
        leader_epoch=epoch,
        leader_end_offset=end,
        local_end_offset_for_leader_epoch=local_end if local_end >= 0 else local_leo,
    )
    follower.truncate_to(offset)  # fetcher.maybe_truncate: always (epochs starting at the offset go too)
    records = leader.log.read(follower.log.log_end_offset, max_bytes=1 << 20).records
    if records:
        follower.append_as_follower(records, now_ms=0)


def test_ki2_follower_replicates_after_leading_an_epoch_without_writing() -> None:
    storage = MemoryStorage()
    b1, b2 = _partition(1, storage), _partition(2, storage)
    b1.become_leader(_state(1, 0), now_ms=0)
    b2.become_follower(_state(1, 0))
    b1.append_as_leader(encode_values([b"a", b"b"], timestamp_ms=0), acks=1, now_ms=0)
    _replicate(b2, b1)
    # Epoch 1: b1 leads again and writes offset 2; b2 does not fetch it in time.
    b1.become_leader(_state(1, 1), now_ms=0)
    b1.append_as_leader(encode_values([b"c"], timestamp_ms=0), acks=1, now_ms=0)
    # Epoch 2: b2 leads (its epoch cache now says epoch 2 starts at 2) but writes nothing.
    b2.become_leader(_state(2, 2), now_ms=0)
    # Epoch 3: b1 leads again; b2 follows and must end up with b1's log.
    b1.become_leader(_state(1, 3), now_ms=0)
    b2.become_follower(_state(1, 3))
    _replicate(b2, b1)
    assert b2.log.log_end_offset == b1.log.log_end_offset == 3


# ---- controller scenarios -------------------------------------------------------------------


def _broker(broker_id: int, broker_epoch: int) -> BrokerInfo:
    return BrokerInfo(broker_id, f"b{broker_id}", 9092, "", 0, broker_epoch)


def _context(brokers: dict[int, int], replicas: tuple[int, ...]) -> ControllerContext:
    ctx = ControllerContext(controller_id=1, epoch=1)
    ctx.live_brokers = {b: _broker(b, e) for b, e in brokers.items()}
    ctx.topics["t"] = TopicInfo("t", "topic-id", {0: replicas})
    ctx.states[TP] = LeaderAndIsr(replicas[0], 0, replicas, 1, 1)
    return ctx


def _apply(ctx: ControllerContext, result: handlers.ControllerResult) -> handlers.ControllerResult:
    for write in result.writes:
        results.apply_write(ctx, write)
    return result


def _reassign(replicas: list[int]) -> common_pb2.AlterPartitionReassignmentsRequest:
    return common_pb2.AlterPartitionReassignmentsRequest(
        topics=[
            common_pb2.ReassignableTopic(
                name="t", partitions=[common_pb2.ReassignablePartition(partition=0, replicas=replicas)]
            )
        ]
    )


def test_ki3_second_reassignment_keeps_the_leader_in_the_replica_set() -> None:
    """KI-3, fixed: a reassignment replacing an ongoing one kept dropping the replica being added."""
    ctx = _context({1: 10, 2: 11, 3: 12, 4: 13, 5: 14}, (1, 2, 3))
    _apply(ctx, reassignment.on_alter_reassignments(ctx, _reassign([2, 3, 5])))  # AR (2, 3, 5, 1), adding 5
    state = ctx.states[TP]
    _apply(
        ctx,
        handlers.on_alter_partition(
            ctx,
            controller_pb2.AlterPartitionRequest(
                broker_id=state.leader,
                broker_epoch=10,
                partitions=[
                    controller_pb2.AlterPartitionItem(
                        topic="t",
                        partition=0,
                        leader_epoch=state.leader_epoch,
                        partition_epoch=state.partition_epoch,
                        new_isr=[1, 2, 3, 5],
                    )
                ],
            ),
        ),
    )
    # Brokers 1, 2 and 3 fail: 5, caught up and in the ISR, is elected.
    _apply(ctx, handlers.on_broker_change(ctx, {4: _broker(4, 13), 5: _broker(5, 14)}))
    assert ctx.states[TP].leader == 5
    # 2 and 3 come back (out of the ISR); an operator moves the partition again, leaving 5 out.
    _apply(
        ctx,
        handlers.on_broker_change(
            ctx, {2: _broker(2, 21), 3: _broker(3, 22), 4: _broker(4, 13), 5: _broker(5, 14)}
        ),
    )
    result = _apply(ctx, reassignment.on_alter_reassignments(ctx, _reassign([3, 4, 2])))
    state = ctx.states[TP]
    assert state.leader in ctx.replicas(TP) or state.leader == -1, (
        f"leader {state.leader} is outside replicas {ctx.replicas(TP)}"
    )
    assert state.leader < 0 or TP in result.rpcs.leader_and_isr.get(state.leader, set()), (
        f"leader {state.leader} is not sent leader epoch {state.leader_epoch}"
    )


def test_ki1_restarted_broker_is_handled_as_failed_then_started() -> None:
    """KI-1, first half, fixed (a bounced broker fails, then starts): kept as a regression test."""
    ctx = _context({1: 10, 2: 11, 3: 12}, (1, 2, 3))
    # Broker 1 crashed and registered again before the controller read /brokers/ids: one
    # BrokerChange shows it with a new broker epoch. It may have lost unflushed data, so as in
    # Kafka (bounced brokers: onBrokerFailure, then onBrokerStartup) it must lose leadership
    # and leave the ISR until it has caught up again.
    _apply(ctx, handlers.on_broker_change(ctx, {1: _broker(1, 20), 2: _broker(2, 11), 3: _broker(3, 12)}))
    state = ctx.states[TP]
    assert state.leader != 1 and 1 not in state.isr, (
        f"restarted broker 1 kept leader {state.leader} ISR {state.isr}"
    )


# ---- KI-4: the leader's HW stops waiting for a member the controller put in the ISR ----------


def _leader_expanding_to_3() -> tuple[Partition, object]:
    """Leader 1 of replicas (1, 2, 3), ISR (1, 2); follower 3 has caught up: expansion proposed."""
    leader = _partition(1, MemoryStorage())
    leader.become_leader(LeaderAndIsrState(1, 0, (1, 2), (1, 2, 3), 1, 1), now_ms=0)
    leader.append_as_leader(encode_values([b"a", b"b"], timestamp_ms=0), acks=-1, now_ms=0)
    leader.record_follower_fetch(2, 2, now_ms=1)
    change = leader.record_follower_fetch(3, 2, now_ms=1)
    assert change is not None and change.new_isr == (1, 2, 3) and leader.high_watermark == 2
    return leader, change


def _more_records_replicated_to_2_only(leader: Partition) -> None:
    leader.append_as_leader(encode_values([b"c"], timestamp_ms=0), acks=-1, now_ms=2)
    leader.record_follower_fetch(2, 3, now_ms=3)


class _UnusedIO:
    """The BrokerIO of a core whose only task here is driven by hand."""

    def start_fetcher(self, fetcher: Any) -> None:
        raise AssertionError("no fetcher is started here")

    stop_fetcher = start_fetcher

    def spawn(self, name: str, task: Any) -> None:
        raise AssertionError("no task is spawned here")

    def call_later(self, delay_ms: int, fn: Callable[[], None]) -> Callable[[], None]:
        raise AssertionError("no timer is set here")


class _FrozenClock:
    def monotonic_ms(self) -> int:
        return 0

    def wall_ms(self) -> int:
        return 0


def _ask_controller(
    leader: Partition, change: IsrChange, answer: Callable[[], object], attempts: int = 5
) -> int:
    """Run the broker core's AlterPartition task for `attempts` calls, answering each with answer().

    Its back-off sleeps are stepped over: only what it decides matters here. Returns how
    many calls it made (fewer when it stopped asking by itself).
    """
    core = BrokerCore(
        broker_id=1,
        data_dir="/ki4",
        storage=MemoryStorage(),
        clock=_FrozenClock(),
        io=_UnusedIO(),
        log=logging.getLogger("tests.sim.ki4"),
    )
    core.partitions[TP] = leader
    task = core._alter_partition(leader, change)
    asked, reply = 0, None
    with contextlib.suppress(StopIteration):
        while asked < attempts:
            step = task.send(reply)
            reply = None
            if isinstance(step, CallController):
                asked += 1
                reply = answer()
    return asked


def test_ki4_lost_alter_partition_answer_keeps_the_member_in_the_hw() -> None:
    leader, change = _leader_expanding_to_3()
    asked = _ask_controller(
        leader,
        change,
        lambda: RpcFailed("DEADLINE_EXCEEDED: the controller committed ISR (1, 2, 3), its answer was lost"),
    )
    assert asked == 5, "an unanswered expansion is asked again"
    assert leader.pending_isr == (1, 2, 3), "the unanswered expansion stays pending"
    _more_records_replicated_to_2_only(leader)
    assert leader.high_watermark <= 2, (
        f"HW {leader.high_watermark} passed the LEO 2 of broker 3, which the committed ISR may count"
    )


def test_ki4_stale_update_metadata_keeps_the_pending_member_in_the_hw() -> None:
    leader, _ = _leader_expanding_to_3()
    # The controller commits (1, 2, 3) as partition epoch 2; an UpdateMetadata it built just
    # before (ISR (1, 2), partition epoch 1) reaches the leader ahead of the AlterPartition answer.
    leader.update_isr((1, 2), partition_epoch=1, leader_epoch=0)
    _more_records_replicated_to_2_only(leader)
    assert leader.high_watermark <= 2, (
        f"HW {leader.high_watermark} passed the LEO 2 of broker 3 while its expansion is still unanswered"
    )


def test_ki4_not_controller_answer_keeps_the_member_in_the_hw() -> None:
    """Sim seed 340: the first AlterPartition committed (answer lost); the retry reached a
    controller that had just restarted and answered NOT_CONTROLLER. That is no answer about
    the partition, so the expansion must stay pending, not be dropped."""
    leader, change = _leader_expanding_to_3()
    asked = _ask_controller(
        leader,
        change,
        lambda: controller_pb2.AlterPartitionResponse(
            error_code=common_pb2.NOT_CONTROLLER, error_message="this controller is not active"
        ),
    )
    assert asked >= 2, "NOT_CONTROLLER is asked again (the active controller may answer next time)"
    assert leader.pending_isr == (1, 2, 3), "an expansion answered only by NOT_CONTROLLER stays pending"
    _more_records_replicated_to_2_only(leader)
    assert leader.high_watermark <= 2, (
        f"HW {leader.high_watermark} passed the LEO 2 of broker 3, which the committed ISR may count"
    )


# ---- topic deletion: a StopReplica answer that arrives after its broker left -------------------


def test_stale_stop_replica_answer_does_not_halt_the_controller() -> None:
    """Sim seeds of defect (c): broker 2 answered StopReplica(delete), then left (lease expiry) before
    the controller handled the answer; its replica was marked ReplicaDeletionIneligible, and the
    late success answer moved it Ineligible -> Successful, an illegal transition that halted the
    controller. The answer must be taken for what it is (stale) and the deletion finish once
    broker 2 is back and confirms."""
    ctx = _context({1: 10, 2: 11, 3: 12}, (1, 2, 3))
    _apply(ctx, deletion.on_delete_topics(ctx, ["t"], deletion_enabled=True))
    _apply(ctx, handlers.on_broker_change(ctx, {1: _broker(1, 10), 3: _broker(3, 12)}))
    stale = _apply(ctx, deletion.on_replica_deletion_result(ctx, 2, 11, [TP], True))  # no halt
    assert not stale.writes, "an answer from an incarnation that is gone changes nothing"
    for broker_id, broker_epoch in ((1, 10), (3, 12)):
        _apply(ctx, deletion.on_replica_deletion_result(ctx, broker_id, broker_epoch, [TP], True))
    back = _apply(
        ctx, handlers.on_broker_change(ctx, {1: _broker(1, 10), 2: _broker(2, 21), 3: _broker(3, 12)})
    )
    assert TP in back.rpcs.stop_replica.get(2, {}), "broker 2 is asked again to delete its replica"
    done = _apply(ctx, deletion.on_replica_deletion_result(ctx, 2, 21, [TP], True))
    assert "t" not in ctx.topics and any(isinstance(w, results.TopicDelete) for w in done.writes), (
        "the topic's keys go once every replica confirmed"
    )


def test_stale_stop_replica_answer_after_a_resend_does_not_halt_the_controller() -> None:
    """Issue 16 defect 3 as reported: broker 2 re-registered during a deletion, the deletion was sent
    again to the new incarnation, then the old request's failure arrived (moving Started ->
    Ineligible) and the re-send's success asked for Ineligible -> Successful (exit 70)."""
    ctx = _context({1: 10, 2: 11, 3: 12}, (1, 2, 3))
    _apply(ctx, deletion.on_delete_topics(ctx, ["t"], deletion_enabled=True))
    resent = _apply(
        ctx, handlers.on_broker_change(ctx, {1: _broker(1, 10), 2: _broker(2, 22), 3: _broker(3, 12)})
    )
    assert TP in resent.rpcs.stop_replica.get(2, {})
    _apply(ctx, deletion.on_replica_deletion_result(ctx, 2, 11, [TP], False))  # the old incarnation's failure
    for broker_id, broker_epoch in ((2, 22), (1, 10), (3, 12)):
        _apply(ctx, deletion.on_replica_deletion_result(ctx, broker_id, broker_epoch, [TP], True))
    assert "t" not in ctx.topics, "the topic is deleted once every live incarnation confirmed"


def test_deciding_a_deletion_changes_the_context_only_when_its_writes_are_replayed() -> None:
    """Handlers decide; the context changes on replay
    (a controller that fails to commit knows nothing new).
    """
    ctx = _context({1: 10, 2: 11, 3: 12}, (1, 2, 3))
    decided = deletion.on_delete_topics(ctx, ["t"], deletion_enabled=True)
    assert not ctx.replica_deletion and not ctx.topics_to_delete
    _apply(ctx, decided)
    assert set(ctx.replica_deletion) == {(TP, 1), (TP, 2), (TP, 3)}
    shutdown = handlers.on_controlled_shutdown(ctx, 1, 10)
    assert not ctx.shutting_down
    _apply(ctx, shutdown)
    assert ctx.shutting_down == {1}


# ---- KI-1: a broker that lost unflushed data in a power loss ----------------------------------


def _offline_with_isr(isr: tuple[int, ...]) -> ControllerContext:
    """Partition t-0 on brokers 1, 2, 3 went offline keeping ISR `isr` (every member died at once)."""
    ctx = _context({1: 10, 2: 11, 3: 12}, (1, 2, 3))
    ctx.states[TP] = LeaderAndIsr(isr[0], 4, isr, 1, 5)
    gone = {b: info for b, info in ctx.live_brokers.items() if b not in isr}
    _apply(ctx, handlers.on_broker_change(ctx, gone))
    assert ctx.states[TP].leader == -1 and ctx.states[TP].isr == isr
    return ctx


def _back(ctx: ControllerContext, broker_id: int, broker_epoch: int, *, unclean: bool) -> None:
    registered = dict(ctx.live_brokers)
    registered[broker_id] = BrokerInfo(broker_id, f"b{broker_id}", 9092, "", 0, broker_epoch, unclean)
    _apply(ctx, handlers.on_broker_change(ctx, registered))


def test_ki1_broker_back_after_power_loss_does_not_lead_while_another_isr_member_may_return() -> None:
    ctx = _offline_with_isr((2, 3))
    _back(ctx, 2, 30, unclean=True)
    assert ctx.states[TP].leader == -1, "broker 2 lost unflushed data; broker 3 may still have everything"
    assert ctx.states[TP].isr == (3,), "the member that lost data leaves the last ISR"
    _back(ctx, 3, 31, unclean=False)
    assert ctx.states[TP].leader == 3 and ctx.states[TP].isr == (3,)


def test_ki1_last_isr_members_all_back_after_power_loss_elect_the_first() -> None:
    ctx = _offline_with_isr((2, 3))
    _back(ctx, 2, 30, unclean=True)
    _back(ctx, 3, 31, unclean=True)
    assert ctx.states[TP].leader == 3, "every member lost data: the one left in the last ISR leads"


def test_ki1_broker_back_after_a_clean_stop_leads_at_once() -> None:
    ctx = _offline_with_isr((2, 3))
    _back(ctx, 2, 30, unclean=False)
    assert ctx.states[TP].leader == 2 and ctx.states[TP].isr == (2,)


def test_ki1_unclean_election_enabled_takes_the_first_live_replica() -> None:
    ctx = _offline_with_isr((2, 3))
    ctx.topics["t"].configs["unclean.leader.election.enable"] = "true"
    _back(ctx, 2, 30, unclean=True)
    assert ctx.states[TP].leader == 1 and ctx.states[TP].isr == (1,), (
        "unclean: first live replica in AR order"
    )
