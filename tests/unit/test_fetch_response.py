"""spark_connector/fetch_response.py against the protobuf parser it stands in for.

The wire reader must give, for every FetchResponse, what
`FetchResponse.FromString(raw).topics[0].partitions[0]` gives, with records as a view of
`raw`, and must refuse truncated or garbled bytes with MalformedFetchResponse instead of
reading past them.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protos.highwater.v1 import common_pb2
from spark_connector.fetch_response import FetchedPartition, MalformedFetchResponse, parse_fetch_response

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
ERROR_CODES = st.sampled_from(list(common_pb2.ErrorCode.values()))


@st.composite
def partitions(draw: st.DrawFn) -> common_pb2.FetchPartitionResponse:
    return common_pb2.FetchPartitionResponse(
        partition=draw(INT32),
        error_code=draw(ERROR_CODES),
        high_watermark=draw(INT64),
        log_start_offset=draw(INT64),
        log_end_offset=draw(INT64),
        records=draw(st.binary(max_size=300)),
        error_message=draw(st.text(max_size=40)),
        leader_epoch=draw(INT32),
        # Optional (presence matters): absent, the reader takes the high watermark for it.
        last_stable_offset=draw(st.none() | INT64),
        aborted_transactions=draw(
            st.lists(
                st.builds(common_pb2.AbortedTransaction, producer_id=INT64, first_offset=INT64),
                max_size=3,
            )
        ),
    )


@st.composite
def responses(draw: st.DrawFn) -> common_pb2.FetchResponse:
    topics = [
        common_pb2.FetchTopicResponse(
            topic=draw(st.text(max_size=20)), partitions=draw(st.lists(partitions(), min_size=1, max_size=3))
        )
        for _ in range(draw(st.integers(1, 3)))
    ]
    return common_pb2.FetchResponse(topics=topics, throttle_time_ms=draw(INT32), error_code=draw(ERROR_CODES))


def expected(response: common_pb2.FetchResponse) -> FetchedPartition:
    return FetchedPartition.from_proto(common_pb2.FetchResponse.FromString(response.SerializeToString()))


@settings(max_examples=300, deadline=None)
@given(responses())
def test_the_wire_reader_gives_what_the_protobuf_parser_gives(response: common_pb2.FetchResponse) -> None:
    raw = response.SerializeToString()
    part = parse_fetch_response(raw)
    want = expected(response)
    assert {**_fields(part), "records": bytes(part.records)} == {
        **_fields(want),
        "records": bytes(want.records),
    }


def test_records_are_a_view_of_the_received_bytes_not_a_copy() -> None:
    records = bytes(range(256)) * 4096
    raw = common_pb2.FetchResponse(
        topics=[
            common_pb2.FetchTopicResponse(
                topic="t", partitions=[common_pb2.FetchPartitionResponse(partition=3, records=records)]
            )
        ]
    ).SerializeToString()
    part = parse_fetch_response(raw)
    assert isinstance(part.records, memoryview) and part.records.obj is raw
    assert part.records == records and part.partition == 3


def test_fields_it_does_not_know_are_skipped() -> None:
    # A newer broker may add fields: here field 15 (varint), 16 (fixed64), 17 (length) and
    # 18 (fixed32) inside the partition, and field 9 (length) in the response.
    part = common_pb2.FetchPartitionResponse(
        partition=1, error_code=common_pb2.NONE, high_watermark=42, records=b"abc"
    ).SerializeToString()
    unknown = (
        _varint(15 << 3 | 0)
        + bytes([0x96, 0x01])
        + _varint(16 << 3 | 1)
        + bytes(8)
        + _varint(17 << 3 | 2)
        + bytes([2])
        + b"zz"
        + _varint(18 << 3 | 5)
        + bytes(4)
    )
    topic = common_pb2.FetchTopicResponse(topic="t").SerializeToString() + _len_field(2, unknown + part)
    raw = _len_field(1, topic) + _len_field(9, b"later")
    got = parse_fetch_response(raw)
    assert (got.partition, got.high_watermark, bytes(got.records)) == (1, 42, b"abc")


def _one_partition(part: common_pb2.FetchPartitionResponse) -> bytes:
    raw: bytes = common_pb2.FetchResponse(
        topics=[common_pb2.FetchTopicResponse(topic="t", partitions=[part])]
    ).SerializeToString()
    return raw


def test_a_read_committed_answer_gives_its_last_stable_offset_and_aborted_transactions() -> None:
    raw = _one_partition(
        common_pb2.FetchPartitionResponse(
            high_watermark=9,
            last_stable_offset=4,
            aborted_transactions=[
                common_pb2.AbortedTransaction(producer_id=7, first_offset=0),
                common_pb2.AbortedTransaction(producer_id=2**40, first_offset=3),
            ],
        )
    )
    got = parse_fetch_response(raw)
    assert (got.high_watermark, got.last_stable_offset) == (9, 4)
    assert got.aborted_transactions == ((7, 0), (2**40, 3))


def test_an_answer_without_a_last_stable_offset_reads_it_as_the_high_watermark() -> None:
    # A broker from before transactions leaves field 10 out; a sent 0 is a real LSO of 0.
    assert (
        parse_fetch_response(
            _one_partition(common_pb2.FetchPartitionResponse(high_watermark=9))
        ).last_stable_offset
        == 9
    )
    sent_zero = common_pb2.FetchPartitionResponse(high_watermark=9, last_stable_offset=0)
    assert parse_fetch_response(_one_partition(sent_zero)).last_stable_offset == 0


def test_an_answer_with_only_a_top_level_error_is_that_error() -> None:
    raw = common_pb2.FetchResponse(error_code=common_pb2.NOT_LEADER_OR_FOLLOWER).SerializeToString()
    assert parse_fetch_response(raw).error_code == common_pb2.NOT_LEADER_OR_FOLLOWER
    with pytest.raises(MalformedFetchResponse, match="without the partition"):
        parse_fetch_response(b"")


@settings(max_examples=200, deadline=None)
@given(responses(), st.data())
def test_truncated_answers_are_refused_or_read_within_their_bytes(
    response: common_pb2.FetchResponse, data: st.DataObject
) -> None:
    raw = response.SerializeToString()
    cut = raw[: data.draw(st.integers(0, len(raw) - 1))]
    try:
        part = parse_fetch_response(cut)
    except MalformedFetchResponse:
        return
    # A cut between whole fields is still well-formed protobuf: then it must agree with the parser.
    want = FetchedPartition.from_proto(common_pb2.FetchResponse.FromString(cut))
    assert {**_fields(part), "records": bytes(part.records)} == {
        **_fields(want),
        "records": bytes(want.records),
    }


def test_garbled_keys_are_refused() -> None:
    with pytest.raises(MalformedFetchResponse, match="wire type"):
        parse_fetch_response(bytes([1 << 3 | 3]))  # a group start: no field here is a group
    with pytest.raises(MalformedFetchResponse, match="longer than"):
        parse_fetch_response(bytes([0xFF] * 11))
    with pytest.raises(MalformedFetchResponse, match="field number 0"):
        parse_fetch_response(bytes([0x00, 0x00]))


def _fields(part: FetchedPartition) -> dict[str, object]:
    return {name: getattr(part, name) for name in FetchedPartition.__slots__}


def _len_field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2]) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
