"""Short-circuit local reads (transport/local_reads.py): the leader names where the records lie.

A consumer Fetch with `locate_records` is answered with a RecordsLocation instead of the
bytes; these tests hold the location to exactly the bytes a plain Fetch returns (whole
batches, below the high watermark, within the size asked), the reader's checks to what
they refuse, and the leader to sending bytes where it has no files to name.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from clients.common.records import Record, decode_batches, encode_batch
from clients.common.transport.host import host_id
from clients.common.transport.local_reads import NotReadableHere, read_located
from protos.highwater.v1 import common_pb2
from services.broker.log import Log, LogConfig
from services.broker.log.file_storage import FileStorage
from services.gateway.routing import fetch_request_for
from spark_connector.fetch_response import FetchedPartition, parse_fetch_response
from tests.unit.broker_seams import lone_leader
from tests.unit.test_broker_core import consumer_fetch
from tests.unit.test_fetcher_core import one_round, pair

pytestmark = pytest.mark.skipif(not host_id(), reason="local reads need Linux's boot id")

# Small segments, so that reads meet segment ends and many batches.
SMALL = LogConfig(segment_bytes=4096, index_interval_bytes=256, retention_ms=-1, max_message_bytes=4096)


def batch(first: int, count: int) -> bytes:
    return encode_batch([Record(None, b"v%06d" % (first + i), [], 1_000) for i in range(count)])


def located_fetch(offset: int, *, locate: bool = True) -> common_pb2.FetchRequest:
    request = consumer_fetch(offset)
    request.locate_records = locate
    return request


def test_a_location_names_exactly_the_bytes_a_read_returns(tmp_path: Path) -> None:
    log = Log.open(str(tmp_path / "t-0"), SMALL, storage=FileStorage(), now_ms=0)
    rng = random.Random(7)
    while log.log_end_offset < 2_000:
        first = log.log_end_offset
        log.append_as_leader(batch(first, rng.randint(1, 40)), leader_epoch=0, now_ms=0)
    assert len(log.segment_base_offsets) > 5
    for _ in range(400):
        offset = rng.randrange(log.log_end_offset)
        max_bytes = rng.choice([1, 100, 700, 4096, 1 << 20])
        max_offset = rng.choice([None, rng.randrange(offset, log.log_end_offset + 1)])
        min_one = rng.random() < 0.8
        read = log.read(offset, max_bytes=max_bytes, max_offset=max_offset, min_one_message=min_one)
        located = log.read_location(
            offset, max_bytes=max_bytes, max_offset=max_offset, min_one_message=min_one
        )
        if read.is_empty:
            assert located is None
            continue
        assert located is not None
        with open(located.path, "rb") as file:
            file.seek(located.position)
            assert file.read(located.size) == read.records
        assert (located.first_offset, located.next_offset) == (read.first_offset, read.next_offset)
    log.close()


def test_a_consumer_asking_the_leader_to_locate_reads_the_bytes_a_fetch_returns(tmp_path: Path) -> None:
    leader = lone_leader(FileStorage(), data_dir=str(tmp_path / "b1"))
    for first in range(0, 300, 30):
        leader.produce(batch(first, 30), acks=1)
    plain = leader.fetch_now(located_fetch(45, locate=False)).topics[0].partitions[0]
    located = leader.fetch_now(located_fetch(45)).topics[0].partitions[0]
    assert located.error_code == common_pb2.NONE and not located.records
    where = located.records_location
    assert where.host_id == host_id() and os.path.isabs(where.path) and where.size == len(plain.records)
    assert read_located(where) == plain.records
    assert located.high_watermark == plain.high_watermark == 300
    # The reader's parse of the raw answer carries the location on.
    raw = common_pb2.FetchResponse(topics=[common_pb2.FetchTopicResponse(topic="t", partitions=[located])])
    assert parse_fetch_response(raw.SerializeToString()).location == where


def test_a_location_stops_at_the_high_watermark_and_a_follower_always_gets_bytes() -> None:
    leader, _follower, fetcher = pair()
    leader.produce(batch(0, 3), acks=1)
    one_round(fetcher, leader)
    one_round(fetcher, leader)  # HW 3
    leader.produce(batch(3, 2), acks=1)  # not yet replicated: above the HW
    # MemoryStorage has no files to name: the leader answers the bytes, committed ones only.
    part = leader.fetch_now(located_fetch(0)).topics[0].partitions[0]
    assert not part.HasField("records_location")
    assert [r.offset for r in decode_batches(part.records)] == [0, 1, 2]
    follower_fetch = located_fetch(3)
    follower_fetch.replica_id = 2
    part = leader.fetch_now(follower_fetch).topics[0].partitions[0]
    assert not part.HasField("records_location") and [r.offset for r in decode_batches(part.records)] == [
        3,
        4,
    ]


def test_nothing_to_read_is_an_empty_answer_without_a_location(tmp_path: Path) -> None:
    leader = lone_leader(FileStorage(), data_dir=str(tmp_path / "b1"))
    leader.produce(batch(0, 5), acks=1)
    part = leader.fetch_now(located_fetch(5)).topics[0].partitions[0]
    assert part.error_code == common_pb2.NONE and not part.records and not part.HasField("records_location")
    out_of_range = leader.fetch_now(located_fetch(9)).topics[0].partitions[0]
    assert out_of_range.error_code == common_pb2.OFFSET_OUT_OF_RANGE


def _location(path: Path, size: int, **changes: object) -> common_pb2.RecordsLocation:
    stat = os.stat(path)
    fields: dict[str, object] = {
        "path": str(path),
        "position": 0,
        "size": size,
        "device": stat.st_dev,
        "inode": stat.st_ino,
        "host_id": host_id(),
    }
    fields.update(changes)
    return common_pb2.RecordsLocation(**fields)  # type: ignore[arg-type]


def test_the_reader_refuses_what_it_cannot_trust(tmp_path: Path) -> None:
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(b"x" * 100)
    assert read_located(_location(segment, 60, position=40)) == b"x" * 60

    def refused(location: common_pb2.RecordsLocation) -> NotReadableHere:
        with pytest.raises(NotReadableHere) as caught:
            read_located(location)
        return caught.value

    assert refused(_location(segment, 10, host_id="another-host")).permanent
    assert refused(_location(segment, 10, inode=os.stat(segment).st_ino + 1)).permanent
    truncated = refused(_location(segment, 61, position=40))
    assert not truncated.permanent and "truncated" in str(truncated)
    gone = _location(segment, 10)
    segment.unlink()
    assert not refused(gone).permanent


def test_a_gateway_parsed_answer_carries_the_location_too() -> None:
    where = common_pb2.RecordsLocation(
        path="/d/t-0/0.log", position=5, size=9, device=1, inode=2, host_id="h"
    )
    response = common_pb2.FetchResponse(
        topics=[
            common_pb2.FetchTopicResponse(
                topic="t", partitions=[common_pb2.FetchPartitionResponse(partition=0, records_location=where)]
            )
        ]
    )
    assert FetchedPartition.from_proto(response).location == where
    assert (
        FetchedPartition.from_proto(
            common_pb2.FetchResponse(
                topics=[
                    common_pb2.FetchTopicResponse(
                        topic="t", partitions=[common_pb2.FetchPartitionResponse(partition=0)]
                    )
                ]
            )
        ).location
        is None
    )


def test_a_gateway_asks_leaders_for_bytes_even_when_its_client_asked_for_a_location() -> None:
    forwarded = fetch_request_for(located_fetch(0), {("t", 0)})
    assert not forwarded.locate_records and forwarded.topics[0].partitions[0].fetch_offset == 0
