"""Pure parts of the connector: option parsing, range planning, admission control, batch numbering.

No Spark session and no cluster: these run in milliseconds (they need pyspark importable).
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

import itertools
from typing import Any

from protos.highwater.v1 import common_pb2
from spark_connector import limits
from spark_connector.options import (
    ClientSettings,
    OptionError,
    offsets_from_json,
    offsets_to_json,
    parse_read_options,
    parse_write_options,
)
from spark_connector.planning import OffsetRange, allocate, limit_by_bytes, limit_by_rows, split_ranges
from spark_connector.writer import BatchNumbering, ChunkSender, WriteStats, _Chunk

BASE = {"bootstrap": "127.0.0.1:9092"}


def test_offsets_json_is_kafkas_and_round_trips() -> None:
    options = parse_read_options(
        {**BASE, "subscribe": "a,b", "startingOffsets": '{"a": {"0": 23, "1": -2}, "b": {"0": -1}}'},
        streaming=True,
    )
    assert options.starting.offsets == {("a", 0): 23, ("a", 1): -2, ("b", 0): -1}
    assert offsets_from_json(offsets_to_json({("a", 1): 5, ("a", 0): 3})) == {("a", 0): 3, ("a", 1): 5}
    assert offsets_to_json({("a", 1): 5, ("a", 0): 3}) == {"a": {"0": 3, "1": 5}}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"subscribe": "a", "startingOffsets": "{not json"}, "startingOffsets"),
        ({"subscribe": "a", "startingOffsets": '{"a": [1]}'}, "startingOffsets"),
        ({"subscribe": "a", "endingOffsets": '{"a": {"0": -2}}'}, "endingOffsets"),
        ({"subscribe": "a", "startingOffsets": "latest"}, "startingOffsets"),
        ({"assign": '{"a": "0"}'}, "assign"),
        ({"subscribe": "a", "subscribePattern": "a.*"}, "subscribe"),
        ({"subscribe": "a", "startingOffsets": '{"b": {"0": 1}}'}, "startingOffsets"),
        ({"subscribe": "bad topic"}, "subscribe"),
        ({"subscribe": "a", "minPartitions": "0"}, "minPartitions"),
        ({"subscribe": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"subscribe": "a", "highwater.request.timeout": "5"}, "highwater.request.timeout"),
        ({"subscribe": "a", "bootstrap": "nohost"}, "bootstrap"),
    ],
)
def test_bad_read_options_name_the_option(options: dict[str, str], named: str) -> None:
    with pytest.raises(OptionError, match=named):
        parse_read_options({**BASE, **options}, streaming=False)


def test_options_are_case_insensitive_and_typed() -> None:
    options = parse_read_options(
        {
            **BASE,
            "SUBSCRIBE": "a",
            "maxoffsetspertrigger": "10",
            "maxBytesPerTrigger": "2m",
            "includeHeaders": "TRUE",
            "highwater.fetch.max.bytes": "65536",
        },
        streaming=True,
    )
    assert options.subscription.topics == ("a",)
    assert (options.max_offsets_per_trigger, options.max_bytes_per_trigger) == (10, 2 << 20)
    assert options.include_headers and options.client.fetch_max_bytes == 65536
    assert options.client.fetch_from_leaders
    assert not parse_read_options(
        {**BASE, "subscribe": "a", "highwater.fetch.from.leaders": "False"}, streaming=False
    ).client.fetch_from_leaders
    with pytest.raises(OptionError, match=r"highwater\.fetch\.from\.leaders"):
        parse_read_options(
            {**BASE, "subscribe": "a", "highwater.fetch.from.leaders": "sometimes"}, streaming=False
        )
    assert options.client.local_reads
    assert not parse_read_options(
        {**BASE, "subscribe": "a", "highwater.local.reads": "false"}, streaming=False
    ).client.local_reads
    with pytest.raises(OptionError, match=r"highwater\.local\.reads"):
        parse_read_options({**BASE, "subscribe": "a", "highwater.local.reads": "maybe"}, streaming=False)
    with pytest.raises(OptionError, match="batch queries only"):
        parse_read_options({**BASE, "subscribe": "a", "endingOffsets": "latest"}, streaming=True)
    assert parse_write_options({**BASE, "highwater.acks": "1"}).client.acks == 1


def test_split_ranges_spreads_large_partitions() -> None:
    ranges = [OffsetRange("a", 0, 0, 900), OffsetRange("a", 1, 0, 100), OffsetRange("a", 2, 5, 5)]
    split = split_ranges(ranges, 10)
    assert [r for r in split if r.partition == 1] == [ranges[1]]
    big = [r for r in split if r.partition == 0]
    assert len(big) == 9 and big[0].start == 0 and big[-1].end == 900
    assert all(a.end == b.start for a, b in itertools.pairwise(big))
    assert split_ranges(ranges, None) == ranges[:2]


def test_admission_control_is_exact() -> None:
    assert sum(allocate({("a", 0): 100, ("a", 1): 60, ("a", 2): 40}, 50).values()) == 50
    start = {("a", 0): 0, ("a", 1): 10}
    latest = {("a", 0): 7, ("a", 1): 100}
    end = limit_by_rows(start, latest, 20)
    assert sum(end[tp] - start[tp] for tp in start) == 20 and all(end[tp] <= latest[tp] for tp in end)
    assert limit_by_rows(start, latest, 1000) == latest
    by_bytes = limit_by_bytes(start, latest, {("a", 0): 100.0, ("a", 1): 100.0}, 2000)
    assert 18 <= sum(by_bytes[tp] - start[tp] for tp in start) <= 20  # soft: whole records only
    assert sum(limit_by_bytes(start, latest, {}, 1).values()) - sum(start.values()) == 1  # never stalls


def test_batch_numbering_is_deterministic_and_moves_producer_id_every_five_batches() -> None:
    def run() -> list[tuple[int, int, int]]:
        numbering = BatchNumbering("query:q", task=3, batch_id=limits.PRODUCER_EPOCH_MODULUS + 7)
        return [numbering.number(("t", 0), 10) for _ in range(7)]

    first, again = run(), run()
    assert first == again
    ids = [pid for pid, _, _ in first]
    assert len(set(ids[:5])) == 1 and ids[5] != ids[0] and ids[5] == ids[6]
    assert all(pid >= limits.DERIVED_PRODUCER_ID_BASE for pid in ids)
    assert [seq for _, _, seq in first] == [0, 10, 20, 30, 40, 0, 10]
    assert {epoch for _, epoch, _ in first} == {7}


def test_kafka_client_settings_map_to_the_connectors_with_the_same_meaning() -> None:
    write = parse_write_options(
        {
            "kafka.bootstrap.servers": "h:1",
            "topic": "t",
            "kafka.acks": "0",
            "kafka.compression.type": "ZSTD",
            "kafka.linger.ms": "5",
            "kafka.batch.size": "1024",
            "kafka.max.request.size": "65536",
            "kafka.request.timeout.ms": "7000",
            "kafka.delivery.timeout.ms": "9000",
            "includeHeaders": "true",
        }
    )
    c = write.client
    assert write.bootstrap == "h:1"
    assert (c.acks, c.compression, c.linger_ms, c.batch_size_bytes) == (0, "zstd", 5, 1024)
    assert (c.max_request_bytes, c.request_timeout_ms, c.retry_timeout_ms) == (65536, 7000, 9000)
    read = parse_read_options(
        {
            **BASE,
            "subscribe": "a",
            "kafka.max.partition.fetch.bytes": "65536",
            "kafkaConsumer.pollTimeoutMs": "5000",
        },
        streaming=False,
    )
    assert (read.client.fetch_max_bytes, read.client.request_timeout_ms) == (65536, 5000)


def test_one_setting_under_two_names_with_different_values_is_refused() -> None:
    with pytest.raises(OptionError, match=r"'highwater\.acks' and 'kafka\.acks'"):
        parse_write_options({**BASE, "topic": "t", "highwater.acks": "1", "kafka.acks": "all"})
    assert (
        parse_write_options({**BASE, "topic": "t", "highwater.acks": "1", "kafka.acks": "1"}).client.acks == 1
    )
    with pytest.raises(OptionError, match=r"kafka\.linger\.ms' must be between"):
        parse_write_options({**BASE, "topic": "t", "kafka.linger.ms": "-1"})


def test_min_offsets_per_trigger_and_max_trigger_delay_are_parsed_as_spark_does() -> None:
    options = parse_read_options(
        {**BASE, "subscribe": "a", "minOffsetsPerTrigger": "100", "maxTriggerDelay": "2m"}, streaming=True
    )
    assert (options.min_offsets_per_trigger, options.max_trigger_delay_ms) == (100, 120_000)
    default = parse_read_options({**BASE, "subscribe": "a", "minOffsetsPerTrigger": "1"}, streaming=True)
    assert default.max_trigger_delay_ms == limits.MAX_TRIGGER_DELAY_MS_DEFAULT == 15 * 60 * 1000
    for bad, named in (
        ({"minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"}, "minOffsetsPerTrigger"),
        ({"minOffsetsPerTrigger": "10", "maxTriggerDelay": "soon"}, "maxTriggerDelay"),
        ({"maxTriggerDelay": "5s"}, "maxTriggerDelay"),
    ):
        with pytest.raises(OptionError, match=named):
            parse_read_options({**BASE, "subscribe": "a", **bad}, streaming=True)


def test_credentials_are_read_on_the_driver_and_never_printed(tmp_path: Any) -> None:
    pem = tmp_path / "ca.pem"
    pem.write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    options = parse_read_options(
        {**BASE, "subscribe": "a", "highwater.ssl.cafile": str(pem), "highwater.auth.token": "hwt.1.s3cret"},
        streaming=False,
    )
    assert options.client.ca_cert == pem.read_bytes() and options.client.token == "hwt.1.s3cret"
    assert options.client.secure and "s3cret" not in repr(options) and "MIIB" not in repr(options)
    with pytest.raises(OptionError, match=r"highwater\.ssl\.cafile.*cannot read"):
        parse_read_options(
            {**BASE, "subscribe": "a", "highwater.ssl.cafile": str(tmp_path / "nope")}, streaming=False
        )
    with pytest.raises(OptionError, match="go together"):
        parse_read_options({**BASE, "subscribe": "a", "highwater.ssl.certfile": str(pem)}, streaming=False)


def test_max_records_per_partition_cuts_ranges_before_min_partitions_spreads_them() -> None:
    ranges = [OffsetRange("a", 0, 0, 1000), OffsetRange("a", 1, 0, 10)]
    split = split_ranges(ranges, None, 300)
    assert [r.size for r in split] == [250, 250, 250, 250, 10]
    assert split[0].start == 0 and split[3].end == 1000
    assert len(split_ranges(ranges, 20, 300)) >= 20
    options = parse_read_options({**BASE, "subscribe": "a", "maxRecordsPerPartition": "300"}, streaming=False)
    assert options.max_records_per_partition == 300


class _RecordingClient:
    """Just enough of GatewayClient for ChunkSender: every Produce is recorded and accepted."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self.requests: list[Any] = []

    def call_future(self, method: str, request: Any) -> Any:
        self.requests.append(request)
        answer = common_pb2.ProduceResponse(
            topics=[
                common_pb2.ProduceTopicResponse(
                    topic=t.topic,
                    partitions=[
                        common_pb2.ProducePartitionResponse(partition=p.partition, base_offset=0)
                        for p in t.partitions
                    ],
                )
                for t in request.topics
            ]
        )
        return lambda: answer


def test_linger_ms_bounds_how_long_a_closed_batch_waits_for_its_produce() -> None:
    def produces(linger_ms: int | None) -> int:
        client = _RecordingClient(ClientSettings(linger_ms=linger_ms))
        sender = ChunkSender(client, -1, WriteStats())  # type: ignore[arg-type]
        for p in range(4):  # one batch to each of 4 partitions
            sender.add(_Chunk(("t", p), b"x" * 100, 1))
            if linger_ms == 0:
                assert sender.stats.records == p  # the one before is acknowledged, this one is in flight
        sender.flush()
        assert sender.stats.records == 4
        return len(client.requests)

    assert produces(None) == 1  # no linger.ms: all four wait for the task's end, then share a Produce
    assert produces(3_600_000) == 1  # a linger longer than the task: the same
    assert produces(0) == 4  # linger.ms=0: each leaves as it closes


def test_max_request_size_bounds_what_one_produce_carries() -> None:
    client = _RecordingClient(ClientSettings(max_request_bytes=1024))
    sender = ChunkSender(client, -1, WriteStats())  # type: ignore[arg-type]
    for p in range(4):
        sender.add(_Chunk(("t", p), b"x" * 400, 1))
    sender.flush()
    assert all(sum(len(d.records) for t in r.topics for d in t.partitions) <= 1024 for r in client.requests)


def test_bootstrap_under_two_names_must_agree() -> None:
    assert (
        parse_write_options({"bootstrap": "h:1", "kafka.bootstrap.servers": "h:1", "topic": "t"}).bootstrap
        == "h:1"
    )
    with pytest.raises(OptionError, match=r"kafka\.bootstrap\.servers"):
        parse_write_options({"bootstrap": "h:1", "kafka.bootstrap.servers": "h:2", "topic": "t"})


class _FakeChannel:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_shared_channels_are_one_per_address_and_credentials_and_bounded() -> None:
    """A reused Spark Python worker keeps its channels across tasks and queries (a fresh one cost
    a connect and, at close, up to 200 ms of waiting for grpc's state poll): same address and
    credentials, same channel; the least recently used beyond the bound is closed; a channel
    that never connected is dropped and closed."""
    from spark_connector.gateway import _SharedChannels

    pool = _SharedChannels(max_channels=2)
    made: list[_FakeChannel] = []

    def get(address: str, token: str | None = None) -> Any:
        def make() -> Any:
            made.append(_FakeChannel(address))
            return made[-1]

        return pool.get((address, None, None, None, token), make)

    a = get("a:1")
    assert get("a:1") is a and len(made) == 1
    with_token = get("a:1", token="t")
    assert with_token is not a  # other credentials, another channel
    get("a:1")  # a is now the most recently used
    b = get("b:1")  # three channels: the least recently used (a with the token) goes
    assert with_token.closed and not a.closed and not b.closed
    assert get("a:1") is a
    pool.discard(("b:1", None, None, None, None), b)
    assert b.closed and get("b:1") is not b


def test_closing_a_client_leaves_its_channels_to_the_next_client_in_the_process() -> None:
    from spark_connector.gateway import GatewayClient

    with GatewayClient("127.0.0.1:1", ClientSettings()) as first:
        channel = first._channel("127.0.0.1:1")
    with GatewayClient("127.0.0.1:1", ClientSettings()) as second:
        assert second._channel("127.0.0.1:1") is channel
    with GatewayClient("127.0.0.1:1", ClientSettings(token="t", ca_cert=b"ca")) as secure:
        assert secure._channel("127.0.0.1:1") is not channel
