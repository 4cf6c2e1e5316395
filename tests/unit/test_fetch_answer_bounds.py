"""A Fetch answer is bounded by the broker, whatever max_bytes the client asked (issue 37).

Kafka caps every answer with the broker's fetch.max.bytes (followers': replica.fetch.response.max.bytes)
and returns the first batch whole even when larger (KIP-74), so a consumer always makes progress.
Before, a Fetch asking max_bytes = partition_max_bytes = 2^31-1 read a whole 100 MB partition into
one answer. These drive the shipped BrokerCore (the one read path of gRPC Fetch, FetchStream and
the Kafka listener), the gateway's pure routing and record-level helpers, and the broker command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import services.broker.server
import services.cli
from clients.common.record_batch import iter_batch_headers
from clients.common.records import Record, encode_batch
from protos.highwater.v1 import common_pb2, gateway_pb2
from services.broker.core import BrokerCore
from services.broker.server import BrokerConfig
from services.common import limits
from services.gateway import record_level, routing
from tests.unit.broker_seams import NO_WAIT_FETCHER, Broker

ASK_EVERYTHING = 2**31 - 1  # what the reviewer's Fetch v12 asked, total and per partition
BOUND = 64 * 1024  # the broker's bound in these tests (--fetch-max-bytes)
KAFKA_FETCH_MAX_BYTES_DEFAULT = 57_671_680  # Kafka's fetch.max.bytes default, 55 MiB


def batch_of(size: int, value: bytes = b"x") -> bytes:
    """One uncompressed batch of one record, about `size` bytes long."""
    return encode_batch([Record(None, value * (size - 80), [], 1_000)])


def leader(
    *,
    partitions: tuple[int, ...] = (0,),
    fetch_max_bytes: int = BOUND,
    replica_fetch_response_max_bytes: int = limits.REPLICA_FETCH_RESPONSE_MAX_BYTES,
) -> Broker:
    """Broker 1, leading t-0.. with broker 2 as a replica out of the ISR (so acks=1 moves the HW)."""
    b = Broker(1)
    b.core = BrokerCore(
        broker_id=1,
        data_dir="/data/b1",
        storage=b.storage,
        clock=b.clock,
        io=b.io,
        log=b.lines,
        fetcher_settings=NO_WAIT_FETCHER,
        fetch_max_bytes=fetch_max_bytes,
        replica_fetch_response_max_bytes=replica_fetch_response_max_bytes,
    )
    b.register(10)
    for partition in partitions:
        b.leader_and_isr(
            leader=1, leader_epoch=0, isr=(1,), replicas=(1, 2), partition=partition, live=[b.node]
        )
    return b


def fill(b: Broker, partition: int, batches: list[bytes]) -> None:
    for records in batches:
        (answer,) = b.produce(records, acks=1, partition=partition)
        assert answer.topics[0].partitions[0].error_code == common_pb2.NONE


def fetch(
    b: Broker, partitions: tuple[int, ...] = (0,), *, replica_id: int = -1, max_bytes: int = ASK_EVERYTHING
) -> common_pb2.FetchResponse:
    return b.fetch_now(
        common_pb2.FetchRequest(
            replica_id=replica_id,
            max_wait_ms=0,
            max_bytes=max_bytes,
            topics=[
                common_pb2.FetchTopic(
                    topic="t",
                    partitions=[
                        common_pb2.FetchPartition(
                            partition=p,
                            fetch_offset=0,
                            partition_max_bytes=ASK_EVERYTHING,
                            current_leader_epoch=-1,
                        )
                        for p in partitions
                    ],
                )
            ],
        )
    )


def record_bytes(answer: common_pb2.FetchResponse) -> list[int]:
    return [len(p.records) for t in answer.topics for p in t.partitions]


def whole_batches(records: bytes) -> int:
    """How many whole batches records holds (and that it holds nothing else)."""
    headers = list(iter_batch_headers(records))
    assert sum(h.size_bytes for h in headers) == len(records), "an answer holds whole batches only"
    return len(headers)


# ---- the broker (gRPC Fetch, FetchStream and the Kafka listener all read through read_all) ------


def test_a_consumer_asking_for_everything_gets_at_most_the_brokers_fetch_max_bytes() -> None:
    b = leader()
    fill(b, 0, [batch_of(10_000) for _ in range(40)])  # ~400 KB below the HW
    answer = fetch(b)
    (size,) = record_bytes(answer)
    assert 0 < size <= BOUND, f"{size} bytes in one answer; the broker's bound is {BOUND}"
    assert whole_batches(answer.topics[0].partitions[0].records) == BOUND // 10_000


def test_the_first_batch_is_returned_whole_when_larger_than_the_bound_and_nothing_more() -> None:
    """KIP-74: a consumer must make progress past a batch larger than the bound, but an answer holds at
    most one such batch: the next partition's data waits for the next Fetch."""
    b = leader(partitions=(0, 1))
    fill(b, 0, [batch_of(3 * BOUND), batch_of(1_000)])
    fill(b, 1, [batch_of(3 * BOUND), batch_of(1_000)])
    answer = fetch(b, (0, 1))
    first, second = answer.topics[0].partitions
    assert whole_batches(first.records) == 1 and len(first.records) > BOUND
    assert second.error_code == common_pb2.NONE and second.records == b""


def test_partitions_share_one_bound_whatever_each_asked() -> None:
    b = leader(partitions=(0, 1, 2))
    for partition in (0, 1, 2):
        fill(b, partition, [batch_of(10_000) for _ in range(10)])
    sizes = record_bytes(fetch(b, (0, 1, 2)))
    assert sum(sizes) <= BOUND, sizes
    assert sizes[0] > 0


def test_a_follower_asking_for_everything_gets_at_most_the_replica_fetch_response_bound() -> None:
    """Kafka's replica.fetch.response.max.bytes: a broker id is all a follower fetch shows."""
    b = leader(fetch_max_bytes=4 * BOUND, replica_fetch_response_max_bytes=BOUND)
    fill(b, 0, [batch_of(10_000) for _ in range(40)])
    (size,) = record_bytes(fetch(b, replica_id=2))
    assert 0 < size <= BOUND


def test_a_smaller_max_bytes_than_the_bound_is_honoured() -> None:
    b = leader()
    fill(b, 0, [batch_of(10_000) for _ in range(10)])
    (size,) = record_bytes(fetch(b, max_bytes=25_000))
    assert 0 < size <= 25_000


def test_the_default_bounds_are_kafkas() -> None:
    core = Broker(1).core
    assert core.fetch_max_bytes == KAFKA_FETCH_MAX_BYTES_DEFAULT == limits.FETCH_RESPONSE_MAX_BYTES_DEFAULT
    assert core.replica_fetch_response_max_bytes == 10 * 1024 * 1024
    assert limits.FETCH_RESPONSE_MAX_BYTES_CEILING < limits.GRPC_MAX_MESSAGE_BYTES


# ---- the broker command: --fetch-max-bytes / HIGHWATER_FETCH_MAX_BYTES --------------------------


def test_fetch_max_bytes_is_a_broker_flag_and_an_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    captured: list[BrokerConfig] = []

    async def serve(config: BrokerConfig) -> None:
        captured.append(config)

    def run_now(main: Any, common: Any) -> None:
        try:
            main.send(None)
        except StopIteration:
            pass

    monkeypatch.setattr(services.broker.server, "serve", serve)
    monkeypatch.setattr(services.cli, "_run", run_now)
    base = ["--broker-id", "1", "--data-dir", "/tmp/unused"]
    runner = CliRunner()
    assert runner.invoke(services.cli.broker_command, base).exit_code == 0
    assert runner.invoke(services.cli.broker_command, [*base, "--fetch-max-bytes", "4194304"]).exit_code == 0
    env = CliRunner(env={"HIGHWATER_FETCH_MAX_BYTES": "1048576"})
    assert env.invoke(services.cli.broker_command, base).exit_code == 0
    assert [c.fetch_max_bytes for c in captured] == [
        KAFKA_FETCH_MAX_BYTES_DEFAULT,
        4 * 1024 * 1024,
        1024 * 1024,
    ]
    too_big = runner.invoke(services.cli.broker_command, [*base, "--fetch-max-bytes", str(ASK_EVERYTHING)])
    assert too_big.exit_code == 2 and "--fetch-max-bytes" in too_big.output


def test_a_fetch_max_bytes_out_of_range_stops_the_broker_naming_the_flag() -> None:
    config = BrokerConfig(
        broker_id=1,
        data_dir=Path("/tmp/unused"),
        etcd_endpoints=["127.0.0.1:2379"],
        fetch_max_bytes=limits.GRPC_MAX_MESSAGE_BYTES,
    )
    with pytest.raises(SystemExit, match="--fetch-max-bytes"):
        config.check()


# ---- the gateway: a merged Fetch answer, Subscribe and ConsumeRecords ---------------------------


def test_a_gateway_fetch_is_bounded_whatever_the_client_asked() -> None:
    assert routing.fetch_answer_bytes_max(ASK_EVERYTHING) == limits.GATEWAY_FETCH_RESPONSE_MAX_BYTES
    assert routing.fetch_answer_bytes_max(0) == limits.FETCH_MAX_BYTES_DEFAULT
    assert routing.fetch_answer_bytes_max(1000) == 1000
    assert limits.GATEWAY_FETCH_RESPONSE_MAX_BYTES < limits.GRPC_MAX_MESSAGE_BYTES


def test_leaders_asked_at_once_share_the_answers_bound() -> None:
    assert routing.leader_share(90, 3) == 30
    assert routing.leader_share(2, 3) == 1, "every leader may still return its first batch"
    template = common_pb2.FetchRequest(
        max_bytes=ASK_EVERYTHING,
        topics=[common_pb2.FetchTopic(topic="t", partitions=[common_pb2.FetchPartition(partition=0)])],
    )
    assert routing.fetch_request_for(template, {("t", 0)}, 30).max_bytes == 30


def test_a_merged_answer_keeps_one_oversize_first_batch_and_drops_what_passes_the_bound() -> None:
    parts = [
        common_pb2.FetchPartitionResponse(partition=0, records=b""),
        common_pb2.FetchPartitionResponse(partition=1, records=b"a" * 150),  # first: kept whole
        common_pb2.FetchPartitionResponse(partition=2, records=b"b" * 150),  # another leader's oversize
        common_pb2.FetchPartitionResponse(partition=3, records=b"c" * 10),
    ]
    routing.keep_within(parts, 100)
    assert [len(p.records) for p in parts] == [0, 150, 0, 0]
    fitting = [common_pb2.FetchPartitionResponse(partition=p, records=b"x" * 30) for p in range(4)]
    routing.keep_within(fitting, 100)
    assert [len(p.records) for p in fitting] == [30, 30, 30, 0]


def test_consume_records_messages_are_cut_by_bytes_as_well_as_by_count() -> None:
    big = [gateway_pb2.ConsumedRecord(topic="t", offset=i, value=b"v" * 1000) for i in range(10)]
    messages = record_level.consume_messages(big, 500, 3_000)
    assert [len(m) for m in messages] == [2] * 5
    assert [r.offset for m in messages for r in m] == list(range(10))
    assert [len(m) for m in record_level.consume_messages(big, 3, 10**9)] == [3, 3, 3, 1]
    huge = [gateway_pb2.ConsumedRecord(topic="t", value=b"v" * 5_000)]
    assert [len(m) for m in record_level.consume_messages(huge, 500, 3_000)] == [1], (
        "a larger record goes alone"
    )
