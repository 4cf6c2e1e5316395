"""Pure parts of the connector: option parsing, range planning, admission control, batch numbering.

No Spark session and no cluster: these run in milliseconds (they need pyspark importable).
"""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

import itertools

from spark_connector import limits
from spark_connector.options import (
    OptionError,
    offsets_from_json,
    offsets_to_json,
    parse_read_options,
    parse_write_options,
)
from spark_connector.planning import OffsetRange, allocate, limit_by_bytes, limit_by_rows, split_ranges
from spark_connector.writer import BatchNumbering

BASE = {"bootstrap": "127.0.0.1:9092"}


def test_offsets_json_is_kafkas_and_round_trips() -> None:
    options = parse_read_options({**BASE, "subscribe": "a,b",
                                  "startingOffsets": '{"a": {"0": 23, "1": -2}, "b": {"0": -1}}'}, streaming=True)
    assert options.starting.offsets == {("a", 0): 23, ("a", 1): -2, ("b", 0): -1}
    assert offsets_from_json(offsets_to_json({("a", 1): 5, ("a", 0): 3})) == {("a", 0): 3, ("a", 1): 5}
    assert offsets_to_json({("a", 1): 5, ("a", 0): 3}) == {"a": {"0": 3, "1": 5}}


@pytest.mark.parametrize(("options", "named"), [
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
])
def test_bad_read_options_name_the_option(options: dict[str, str], named: str) -> None:
    with pytest.raises(OptionError, match=named):
        parse_read_options({**BASE, **options}, streaming=False)


def test_options_are_case_insensitive_and_typed() -> None:
    options = parse_read_options({**BASE, "SUBSCRIBE": "a", "maxoffsetspertrigger": "10",
                                  "maxBytesPerTrigger": "2m", "includeHeaders": "TRUE",
                                  "highwater.fetch.max.bytes": "65536"}, streaming=True)
    assert options.subscription.topics == ("a",)
    assert (options.max_offsets_per_trigger, options.max_bytes_per_trigger) == (10, 2 << 20)
    assert options.include_headers and options.client.fetch_max_bytes == 65536
    assert options.client.fetch_from_leaders
    assert not parse_read_options({**BASE, "subscribe": "a", "highwater.fetch.from.leaders": "False"},
                                  streaming=False).client.fetch_from_leaders
    with pytest.raises(OptionError, match=r"highwater\.fetch\.from\.leaders"):
        parse_read_options({**BASE, "subscribe": "a", "highwater.fetch.from.leaders": "sometimes"}, streaming=False)
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
