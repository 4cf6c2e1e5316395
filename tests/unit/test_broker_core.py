"""The broker core's rules (services/broker/core.py), driven through its seams without I/O."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from clients.common.records import Record, decode_batches, encode_batch
from protos.highwater.v1 import broker_pb2, common_pb2, controller_pb2
from services.broker.core import PARTITION_METADATA_FILE, RUN_MARKER_FILE
from services.broker.log import MemoryStorage
from services.broker.log.checkpoints import HighWatermarkCheckpoint
from services.broker.partition import Role
from services.broker.steps import CallController, RpcFailed, Sleep
from services.common import limits
from tests.unit.broker_seams import Broker, lone_leader, partition_error, run_slices
from tests.unit.test_fetcher_core import T0, one_round, pair, values_in


def batch(*values: str) -> bytes:
    return encode_batch([Record(None, v.encode(), [], 1_000) for v in values])


def consumer_fetch(
    offset: int, current_leader_epoch: int = -1, max_wait_ms: int = 0
) -> common_pb2.FetchRequest:
    return common_pb2.FetchRequest(
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=1,
        topics=[
            common_pb2.FetchTopic(
                topic="t",
                partitions=[
                    common_pb2.FetchPartition(
                        partition=0,
                        fetch_offset=offset,
                        partition_max_bytes=1 << 20,
                        current_leader_epoch=current_leader_epoch,
                    )
                ],
            )
        ],
    )


def stop_replica(broker: Broker, *, delete: bool) -> broker_pb2.StopReplicaResponse:
    return broker.core.stop_replica(
        broker_pb2.StopReplicaRequest(
            header=broker.header(),
            partitions=[
                broker_pb2.StopReplicaPartition(
                    topic="t", partition=0, leader_epoch=-2, delete_partition=delete
                )
            ],
        )
    )


# ---- control requests: who may be told what -----------------------------------------------------


def test_control_requests_before_registration_are_refused_as_not_available_so_the_controller_retries() -> (
    None
):
    b = Broker(1)
    b.core.start("boot-1")
    resp = b.leader_and_isr(
        leader=1, leader_epoch=0, isr=(1,), replicas=(1,), live=[], header=b.header(broker_epoch=10)
    )
    assert resp.error_code == common_pb2.BROKER_NOT_AVAILABLE and "has not registered" in resp.error_message
    assert not b.core.partitions


def test_control_requests_while_closing_are_refused_as_not_available() -> None:
    b = Broker(1)
    b.register(10)
    b.core.begin_close()
    resp = b.core.update_metadata(broker_pb2.UpdateMetadataRequest(header=b.header()))
    assert resp.error_code == common_pb2.BROKER_NOT_AVAILABLE and "shutting down" in resp.error_message


def test_only_an_older_broker_epoch_is_stale_a_newer_one_names_this_incarnation() -> None:
    # The broker registered as epoch 10 but its driver has not learned 12 yet (Kafka refuses older only).
    b = Broker(1)
    b.register(10)
    stale = b.leader_and_isr(
        leader=1, leader_epoch=0, isr=(1,), replicas=(1,), live=[b.node], header=b.header(broker_epoch=9)
    )
    assert (
        stale.error_code == common_pb2.STALE_BROKER_EPOCH
        and "older than this incarnation's 10" in stale.error_message
    )
    newer = b.leader_and_isr(
        leader=1, leader_epoch=0, isr=(1,), replicas=(1,), live=[b.node], header=b.header(broker_epoch=12)
    )
    assert newer.error_code == common_pb2.NONE
    assert b.core.partitions[T0].role is Role.LEADER


def test_a_request_from_an_older_controller_epoch_is_refused_after_a_newer_one_was_seen() -> None:
    b = Broker(1)
    b.register(10)
    assert (
        b.core.update_metadata(
            broker_pb2.UpdateMetadataRequest(header=b.header(controller_epoch=5))
        ).error_code
        == common_pb2.NONE
    )
    old = b.core.update_metadata(broker_pb2.UpdateMetadataRequest(header=b.header(controller_epoch=4)))
    assert old.error_code == common_pb2.STALE_CONTROLLER_EPOCH


def test_leader_and_isr_with_an_epoch_that_is_not_newer_is_fenced_per_partition() -> None:
    b = Broker(1)
    b.register(10)
    assert b.leader_and_isr(leader=1, leader_epoch=3, isr=(1,), replicas=(1,), live=[b.node]).error_code == 0
    resp = b.leader_and_isr(leader=1, leader_epoch=2, isr=(1,), replicas=(1,), live=[b.node])
    (result,) = resp.partitions
    assert result.error_code == common_pb2.FENCED_LEADER_EPOCH
    assert b.core.partitions[T0].leader_epoch == 3


def update_metadata_naming(b: Broker, *, leader: int, leader_epoch: int, replicas: tuple[int, ...]) -> None:
    state = common_pb2.PartitionState(
        topic="t",
        partition=0,
        leader=leader,
        leader_epoch=leader_epoch,
        isr=list(replicas),
        replicas=list(replicas),
        partition_epoch=leader_epoch + 1,
    )
    resp = b.core.update_metadata(broker_pb2.UpdateMetadataRequest(header=b.header(), partitions=[state]))
    assert resp.error_code == common_pb2.NONE


def test_a_leader_moved_away_while_cut_off_stops_when_the_metadata_shows_a_newer_epoch_without_it() -> None:
    # Simulation seed 60076 (transactions): broker 1's session expired while a reassignment moved
    # t-0 to other brokers; the StopReplica was never sent to it and it led epoch 0 for good.
    b = lone_leader()
    update_metadata_naming(b, leader=1, leader_epoch=0, replicas=(1,))  # its own epoch: nothing changes
    # Still a replica at epoch 3: its LeaderAndIsr will come.
    update_metadata_naming(b, leader=2, leader_epoch=3, replicas=(1, 2))
    assert b.core.partitions[T0].role is Role.LEADER
    update_metadata_naming(b, leader=2, leader_epoch=4, replicas=(2, 3))
    p = b.core.partitions[T0]
    assert p.role is Role.NONE and p.log.log_end_offset == 0 and not p.log.is_closed  # files kept
    (answer,) = b.produce(batch("a"), acks=1)
    assert partition_error(answer) == common_pb2.NOT_LEADER_OR_FOLLOWER
    # Named again later: a LeaderAndIsr starts it over.
    b.leader_and_isr(leader=1, leader_epoch=5, isr=(1,), replicas=(1,), live=[b.node])
    assert b.core.partitions[T0].role is Role.LEADER


def test_a_follower_moved_away_stops_fetching_and_an_older_epoch_without_it_changes_nothing() -> None:
    _leader, follower, fetcher = pair()
    update_metadata_naming(follower, leader=1, leader_epoch=0, replicas=(1, 3))  # a late request: not newer
    assert follower.core.partitions[T0].role is Role.FOLLOWER and T0 in fetcher.partitions
    update_metadata_naming(follower, leader=1, leader_epoch=1, replicas=(1, 3))
    assert follower.core.partitions[T0].role is Role.NONE and T0 not in fetcher.partitions


# ---- produce -------------------------------------------------------------------------------------


def test_produce_to_a_follower_is_refused_naming_the_leader() -> None:
    _leader, follower, _fetcher = pair()
    (resp,) = follower.produce(batch("a"), acks=1)
    part = resp.topics[0].partitions[0]
    assert part.error_code == common_pb2.NOT_LEADER_OR_FOLLOWER and "leader is 1" in part.error_message
    assert part.base_offset == -1, "nothing was written"


def test_acks_all_waits_until_every_isr_member_has_the_records() -> None:
    leader, follower, fetcher = pair()
    answers = leader.produce(batch("a", "b"), acks=-1)
    assert answers == [], "the follower has not fetched yet"
    one_round(fetcher, leader)  # the follower copies the records...
    assert answers == []
    one_round(fetcher, leader)  # ...and its next fetch tells the leader it has them
    assert len(answers) == 1 and partition_error(answers[0]) == common_pb2.NONE
    assert values_in(follower) == [b"a", b"b"]


def test_an_answered_produce_or_fetch_leaves_no_timer_holding_it_until_its_deadline() -> None:
    leader, _follower, fetcher = pair()
    fetched: list[common_pb2.FetchResponse] = []
    leader.core.fetch(consumer_fetch(0, max_wait_ms=500), fetched.append)
    produced = leader.produce(batch("a"), acks=-1, timeout_ms=30_000)
    assert len(leader.io.timers) == 2, "the waiting fetch and produce each have an expiry timer"
    one_round(fetcher, leader)
    one_round(fetcher, leader)
    assert len(produced) == 1 and len(fetched) == 1
    assert leader.io.timers == [], "a timer left set keeps the answered operation alive until its deadline"


def test_acks_all_times_out_at_the_produce_timeout() -> None:
    leader, _follower, _fetcher = pair()
    answers = leader.produce(batch("a"), acks=-1, timeout_ms=1_000)
    leader.clock.now_ms = 999
    leader.io.fire_due()
    assert answers == []
    leader.clock.now_ms = 1_000
    leader.io.fire_due()
    assert len(answers) == 1 and partition_error(answers[0]) == common_pb2.REQUEST_TIMED_OUT
    assert len(leader.core.purgatory) == 0


def test_closing_answers_a_waiting_produce_and_stops_every_fetcher() -> None:
    leader, follower, fetcher = pair()
    answers = leader.produce(batch("a"), acks=-1)
    leader.core.begin_close()
    assert len(answers) == 1 and partition_error(answers[0]) == common_pb2.NOT_LEADER_OR_FOLLOWER
    follower.core.begin_close()
    assert fetcher.stopped and follower.io.stopped == [fetcher]


def test_produce_to_an_unknown_topic_says_it_does_not_exist() -> None:
    b = Broker(1)
    b.register(10)
    (resp,) = b.produce(batch("a"), acks=1, topic="nope")
    assert partition_error(resp) == common_pb2.UNKNOWN_TOPIC_OR_PARTITION


# ---- fetch ---------------------------------------------------------------------------------------


def test_a_consumer_reads_only_up_to_the_high_watermark() -> None:
    leader, _follower, fetcher = pair()
    leader.produce(batch("a"), acks=1)
    one_round(fetcher, leader)
    one_round(fetcher, leader)  # HW 1
    leader.produce(batch("b"), acks=1)  # not yet on the follower
    part = leader.fetch_now(consumer_fetch(0)).topics[0].partitions[0]
    assert part.high_watermark == 1 and part.log_end_offset == 2
    assert [r.value for r in _decode(part.records)] == [b"a"]


def test_a_consumer_fetch_at_the_high_watermark_waits_for_new_data() -> None:
    leader, _follower, fetcher = pair()
    answers: list[common_pb2.FetchResponse] = []
    leader.core.fetch(consumer_fetch(0, max_wait_ms=500), answers.append)
    assert answers == [] and len(leader.core.purgatory) == 1
    leader.produce(batch("a"), acks=1)
    assert answers == [], "the record is not committed yet"
    one_round(fetcher, leader)
    one_round(fetcher, leader)
    assert len(answers) == 1 and answers[0].topics[0].partitions[0].records


def test_fetch_with_an_older_leader_epoch_is_fenced_and_a_newer_one_is_unknown() -> None:
    leader, _follower, _fetcher = pair()
    leader.leader_and_isr(
        leader=1, leader_epoch=2, isr=(1, 2), replicas=(1, 2), partition_epoch=2, live=[leader.node]
    )
    fenced = leader.fetch_now(consumer_fetch(0, current_leader_epoch=1)).topics[0].partitions[0]
    assert fenced.error_code == common_pb2.FENCED_LEADER_EPOCH
    unknown = leader.fetch_now(consumer_fetch(0, current_leader_epoch=3)).topics[0].partitions[0]
    assert unknown.error_code == common_pb2.UNKNOWN_LEADER_EPOCH
    current = leader.fetch_now(consumer_fetch(0, current_leader_epoch=2)).topics[0].partitions[0]
    assert current.error_code == common_pb2.NONE


def test_offsets_for_leader_epoch_answers_the_end_of_the_asked_epoch() -> None:
    b = Broker(1)
    b.register(10)
    b.leader_and_isr(leader=1, leader_epoch=0, isr=(1,), replicas=(1,), live=[b.node])
    b.produce(batch("a", "b"), acks=1)
    b.leader_and_isr(leader=1, leader_epoch=1, isr=(1,), replicas=(1,), partition_epoch=2, live=[b.node])
    b.produce(batch("c"), acks=1)

    def ask(epoch: int) -> tuple[int, int]:
        resp = b.core.offsets_for_leader_epoch(
            broker_pb2.OffsetsForLeaderEpochRequest(
                replica_id=2,
                topics=[
                    broker_pb2.OffsetsForLeaderEpochTopic(
                        topic="t",
                        partitions=[
                            broker_pb2.OffsetsForLeaderEpochPartition(
                                partition=0, current_leader_epoch=-1, leader_epoch=epoch
                            )
                        ],
                    )
                ],
            )
        )
        (res,) = resp.topics[0].partitions
        return res.leader_epoch, res.end_offset

    assert ask(0) == (0, 2)
    assert ask(1) == (1, 3), "the current epoch ends at the LEO"
    assert ask(7) == (-1, -1), "an epoch newer than any known is undefined (as Kafka answers)"


# ---- the run marker ------------------------------------------------------------------------------


def test_the_run_marker_reports_an_unclean_stop_only_across_a_reboot() -> None:
    storage = MemoryStorage()
    first = Broker(1, storage=storage)
    previous = first.core.start("boot-1")
    assert previous.clean, "a new data directory"
    # Killed (no close): the same host still runs, the page cache kept every write.
    killed = Broker(1, storage=storage).core.start("boot-1")
    assert not killed.clean and not killed.unclean_shutdown
    # Killed again, then the host restarted (a new boot id): unflushed writes may be gone.
    power_loss = Broker(1, storage=storage)
    assert power_loss.core.start("boot-2").unclean_shutdown
    assert "did not stop cleanly and its host restarted" in power_loss.lines.text("warning")
    power_loss.core.close()
    assert Broker(1, storage=storage).core.start("boot-3").clean


def test_an_unreadable_run_marker_counts_as_a_power_loss() -> None:
    storage = MemoryStorage()
    storage.mkdir("/data/b1")
    storage.write_atomic(f"/data/b1/{RUN_MARKER_FILE}", b"\x00garbage")
    assert Broker(1, storage=storage).core.start("boot-1").unclean_shutdown


# ---- topic ids -----------------------------------------------------------------------------------


def test_a_replica_of_a_deleted_topic_with_the_same_name_is_dropped_not_reused() -> None:
    storage = MemoryStorage()
    b = lone_leader(storage, broker_epoch=10, topic_id="old-id")
    b.produce(batch("old"), acks=1)
    assert storage.read_file(f"/data/b1/t-0/{PARTITION_METADATA_FILE}") == b"version: 0\ntopic_id: old-id\n"
    b.core.close()

    # The broker was down while "t" was deleted and created again; it comes back to the new "t".
    again = lone_leader(storage, broker_epoch=20, topic_id="new-id")
    p = again.core.partitions[T0]
    assert p.log.log_end_offset == 0, "the old topic's records are gone"
    assert p.log.leader_epoch_cache.latest_epoch() == 0
    assert storage.read_file(f"/data/b1/t-0/{PARTITION_METADATA_FILE}") == b"version: 0\ntopic_id: new-id\n"
    assert "belongs to topic id old-id, not new-id" in again.lines.text("warning")


def test_a_replica_of_the_same_topic_is_kept_across_a_restart() -> None:
    storage = MemoryStorage()
    b = lone_leader(storage, broker_epoch=10, topic_id="id-1")
    b.produce(batch("kept"), acks=1)
    b.core.close()
    again = lone_leader(storage, broker_epoch=20, topic_id="id-1", leader_epoch=1, partition_epoch=2)
    assert values_in(again) == [b"kept"]


def test_stop_replica_with_delete_removes_the_replica_and_its_files() -> None:
    storage = MemoryStorage()
    b = lone_leader(storage, broker_epoch=10, topic_id="id-1")
    b.produce(batch("a"), acks=1)
    assert stop_replica(b, delete=True).partitions[0].error_code == common_pb2.NONE
    assert T0 not in b.core.partitions
    assert not storage.exists(f"/data/b1/t-0/{PARTITION_METADATA_FILE}")


def test_the_periodic_hw_checkpoint_is_written_aside_and_one_at_a_time() -> None:
    """The pass hands the checkpoint's write to io.run_blocking (a thread in the broker: 30-46 ms
    with 10,000 replicas, on the event loop before); a pass that finds one still being written
    starts no other, and the file is what the next pass compares with only once written."""
    storage = MemoryStorage()
    b = lone_leader(storage, topic_id="id-1")
    b.produce(batch("a"), acks=1)
    held: list[tuple[str, Callable[[], None], Callable[[BaseException | None], None]]] = []
    b.io.run_blocking = lambda name, fn, then: held.append((name, fn, then))  # type: ignore[method-assign]

    def checkpoint_passes() -> None:
        for _ in range(limits.HW_CHECKPOINT_EVERY_ISR_TICKS):
            for _ in b.core.periodic_duties():
                pass

    checkpoint_passes()
    assert [name for name, _, _ in held] == ["hw-checkpoint"]
    checkpoint_passes()
    assert len(held) == 1, "one checkpoint at a time"
    _, write, then = held[0]
    write()
    then(None)
    assert HighWatermarkCheckpoint(storage, b.core.data_dir).stored_at_start(T0) == 1
    checkpoint_passes()
    assert len(held) == 1, "nothing moved since it was written"
    b.produce(batch("b"), acks=1)
    checkpoint_passes()
    assert len(held) == 2


# ---- AlterPartition ------------------------------------------------------------------------------


def test_an_isr_shrink_asks_the_controller_again_with_the_current_broker_epoch_until_answered() -> None:
    leader, _follower, _fetcher = pair()
    leader.clock.now_ms = 60_000  # the follower has not fetched for longer than replica.lag.time.max.ms
    for _ in leader.core.periodic_duties():
        pass
    ((name, task),) = leader.io.spawned
    assert name == "alter-partition"
    call = next(task)
    assert isinstance(call, CallController) and call.rpc == "AlterPartition"
    assert (call.request.broker_epoch, list(call.request.partitions[0].new_isr)) == (10, [1])
    assert isinstance(task.send(RpcFailed("controller unreachable")), Sleep)
    leader.core.broker_epoch = 15  # the broker re-registered meanwhile
    retry = task.send(None)
    assert isinstance(retry, CallController) and retry.request.broker_epoch == 15
    committed = common_pb2.PartitionState(
        topic="t", partition=0, leader=1, leader_epoch=0, isr=[1], replicas=[1, 2], partition_epoch=2
    )
    with pytest.raises(StopIteration):
        task.send(
            controller_pb2.AlterPartitionResponse(
                partitions=[controller_pb2.AlterPartitionResult(topic="t", partition=0, state=committed)]
            )
        )
    p = leader.core.partitions[T0]
    assert (p.isr, p.partition_epoch, p.pending_isr) == ((1,), 2, None)


def test_an_isr_shrink_stops_asking_once_leadership_moved() -> None:
    leader, _follower, _fetcher = pair()
    leader.clock.now_ms = 60_000
    for _ in leader.core.periodic_duties():
        pass
    ((_, task),) = leader.io.spawned
    next(task)
    leader.leader_and_isr(
        leader=2,
        leader_epoch=1,
        isr=(1, 2),
        replicas=(1, 2),
        partition_epoch=2,
        live=[leader.node, common_pb2.BrokerNode(broker_id=2, host="127.0.0.1", port=9002)],
    )
    with pytest.raises(StopIteration):
        task.send(RpcFailed("controller unreachable"))


def _decode(records: bytes) -> list[Record]:
    return list(decode_batches(records))


def test_a_replica_refused_for_its_topic_config_is_logged_not_silent() -> None:
    b = Broker(1)
    b.register(10)
    state = common_pb2.PartitionState(
        topic="t",
        partition=0,
        leader=1,
        leader_epoch=0,
        isr=[1],
        replicas=[1],
        controller_epoch=1,
        partition_epoch=1,
    )
    req = broker_pb2.LeaderAndIsrRequest(
        header=b.header(),
        live_leaders=[b.node],
        partitions=[
            broker_pb2.LeaderAndIsrPartition(state=state, config=common_pb2.TopicConfig(max_message_bytes=1))
        ],
    )
    (result,) = run_slices(b.core.leader_and_isr(req)).partitions
    assert result.error_code == common_pb2.INVALID_CONFIG
    assert "LeaderAndIsr for t-0 at leader epoch 0 refused: INVALID_CONFIG" in b.lines.text("warning")


def test_a_broker_with_a_malformed_high_watermark_checkpoint_starts_and_says_so() -> None:
    storage = MemoryStorage()
    storage.mkdir("/data/b1")
    storage.write_atomic("/data/b1/replication-offset-checkpoint", b"0\n1\nnot a valid line\n")
    b = Broker(1, storage=storage)
    b.register(10)
    assert "malformed checkpoint" in b.lines.text("error")
    assert b.leader_and_isr(leader=1, leader_epoch=0, isr=(1,), replicas=(1,), live=[b.node]).error_code == 0


# ---- requests a broker must refuse whole (found by the adversarial review) ----------------------


def test_a_produce_naming_a_partition_twice_writes_nothing() -> None:
    b = Broker(1)
    b.register(10)
    b.leader_and_isr(leader=1, leader_epoch=0, isr=(1,), replicas=(1,), live=[b.node])
    answers: list[common_pb2.ProduceResponse] = []
    entry = common_pb2.ProducePartitionData(partition=0, records=batch("a"))
    b.core.produce(
        common_pb2.ProduceRequest(
            acks=1, topics=[common_pb2.ProduceTopicData(topic="t", partitions=[entry, entry])]
        ),
        answers.append,
    )
    (part,) = answers[0].topics[0].partitions
    assert part.error_code == common_pb2.INVALID_REQUEST and "appears more than once" in part.error_message
    assert b.core.partitions[T0].log.log_end_offset == 0


def test_a_produce_with_a_negative_timeout_writes_nothing() -> None:
    b = Broker(1)
    b.register(10)
    b.leader_and_isr(leader=1, leader_epoch=0, isr=(1,), replicas=(1,), live=[b.node])
    (resp,) = b.produce(batch("a"), acks=-1, timeout_ms=-1)
    assert partition_error(resp) == common_pb2.INVALID_REQUEST
    assert b.core.partitions[T0].log.log_end_offset == 0


def test_a_fetch_from_a_live_broker_that_is_not_a_replica_reads_only_committed_records() -> None:
    leader, _follower, fetcher = pair()
    leader.produce(batch("a"), acks=1)
    one_round(fetcher, leader)
    one_round(fetcher, leader)  # HW 1
    leader.produce(batch("uncommitted"), acks=1)
    bystander = common_pb2.BrokerNode(broker_id=3, host="127.0.0.1", port=9003, broker_epoch=12)
    leader.core.update_metadata(
        broker_pb2.UpdateMetadataRequest(header=leader.header(), live_brokers=[leader.node, bystander])
    )
    fetch = consumer_fetch(0)
    fetch.replica_id = 3  # a broker of the cluster, but not a replica of t-0 (replicas are 1 and 2)
    part = leader.fetch_now(fetch).topics[0].partitions[0]
    assert [r.value for r in _decode(part.records)] == [b"a"]
    assert leader.core.partitions[T0].followers.keys() == {2}, "and it is not taken for a follower"


def test_a_fetch_whose_replica_id_is_no_broker_of_the_cluster_is_refused() -> None:
    leader, _follower, _fetcher = pair()
    leader.produce(batch("a"), acks=1)
    stranger = consumer_fetch(0)
    stranger.replica_id = 0  # a consumer that left the field at its default
    part = leader.fetch_now(stranger).topics[0].partitions[0]
    assert part.error_code == common_pb2.INVALID_REQUEST and "no broker of this cluster" in part.error_message
    assert not part.records


def test_a_fetch_with_a_replica_id_below_minus_one_is_refused() -> None:
    leader, _follower, _fetcher = pair()
    bad = consumer_fetch(0)
    bad.replica_id = -5
    part = leader.fetch_now(bad).topics[0].partitions[0]
    assert part.error_code == common_pb2.INVALID_REQUEST and "consumers send -1" in part.error_message


def test_a_storage_failure_is_logged_with_its_file_and_the_client_sees_no_path() -> None:
    storage = MemoryStorage()
    b = Broker(1, storage=storage)
    b.register(10)
    b.leader_and_isr(leader=1, leader_epoch=0, isr=(1,), replicas=(1,), live=[b.node])
    storage.fail_writes = True
    (resp,) = b.produce(batch("a"), acks=1)
    part = resp.topics[0].partitions[0]
    assert part.error_code == common_pb2.STORAGE_ERROR
    assert (
        "/data/" not in part.error_message
        and "could not read or write its replica of t-0" in part.error_message
    )
    assert "/data/b1/t-0" in b.lines.text("error")
