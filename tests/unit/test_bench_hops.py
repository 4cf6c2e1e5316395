"""bench/hops.py: a record's path through a loopback capture, stage by stage.

The captures here are written byte by byte as tcpdump writes them (pcap, Ethernet framing,
IPv4, TCP), with the stamps bench/e2e_latency.py puts in its records.
"""

from __future__ import annotations

import struct

import pytest

from bench import hops

PRODUCER, LEADER, FOLLOWER_A, FOLLOWER_B, CONSUMER = 50_001, 9_092, 50_002, 50_003, 50_004
SENT_S = 1_795_000_000.0  # a send time in 2026: what the stamps' top bytes look like


def stamp(sent_s: float, measured: bool = True) -> bytes:
    return struct.pack(">qB", round(sent_s * 1e9), 1 if measured else 0)


def packet(time_s: float, source: int, destination: int, payload: bytes) -> tuple[float, bytes]:
    tcp = struct.pack(">HHIIBBHHH", source, destination, 1, 1, 5 << 4, 0x18, 65535, 0, 0)
    ip = struct.pack(
        ">BBHHHBBH4s4s",
        0x45,
        0,
        20 + len(tcp) + len(payload),
        0,
        0,
        64,
        6,
        0,
        b"\x7f\0\0\x01",
        b"\x7f\0\0\x01",
    )
    frame = b"\0" * 12 + struct.pack(">H", 0x0800) + ip + tcp + payload
    seconds = int(time_s)
    microseconds = round((time_s - seconds) * 1e6)
    return time_s, struct.pack("<IIII", seconds, microseconds, len(frame), len(frame)) + frame


def pcap(packets: list[tuple[float, bytes]]) -> bytes:
    """The capture file, packets in time order as tcpdump writes them."""
    header = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)
    return header + b"".join(data for _, data in sorted(packets, key=lambda p: p[0]))


def message(body: bytes = b"") -> bytes:
    """A gRPC message's bytes on the wire: at least MESSAGE_BYTES_MIN of them."""
    return b"\0" * 9 + body + b"\0" * max(0, hops.MESSAGE_BYTES_MIN - 9 - len(body))


def one_record(sent_s: float, ms: dict[str, float], consumer: int = CONSUMER) -> list[tuple[float, bytes]]:
    """The segments of one record's path, each at sent_s + ms[name] / 1000."""

    def at(name: str) -> float:
        return sent_s + ms[name] / 1000

    record = message(b"producer-id" + stamp(sent_s) + b"x" * 20)
    return [
        packet(at("produce"), PRODUCER, LEADER, record),
        packet(at("answer_a"), LEADER, FOLLOWER_A, message(stamp(sent_s))),
        packet(at("answer_b"), LEADER, FOLLOWER_B, message(stamp(sent_s))),
        # A window update between: no message, not an acknowledgement.
        packet(at("answer_b") + 0.00001, FOLLOWER_A, LEADER, b"\0" * 13),
        packet(at("fetch_a"), FOLLOWER_A, LEADER, message(b"next fetch")),
        packet(at("fetch_b"), FOLLOWER_B, LEADER, message(b"next fetch")),
        packet(at("consumer"), LEADER, consumer, message(stamp(sent_s))),
        packet(at("produce_answer"), LEADER, PRODUCER, message(b"produce answer")),
    ]


FIRST = {
    "produce": 0.3,
    "answer_a": 0.8,
    "answer_b": 0.9,
    "fetch_a": 1.2,
    "fetch_b": 1.4,
    "consumer": 1.7,
    "produce_answer": 1.75,
}
SECOND = {
    "produce": 1.0,
    "answer_a": 1.6,
    "answer_b": 1.5,
    "fetch_a": 2.0,
    "fetch_b": 1.9,
    "consumer": 2.3,
    "produce_answer": 2.35,
}


def test_each_stage_is_timed_from_the_segments_that_carry_the_record() -> None:
    capture = pcap(one_record(SENT_S, FIRST) + one_record(SENT_S + 0.01, SECOND))
    stages = hops.hop_stages(hops.read_pcap(capture), LEADER)
    expected = {
        "A": [0.3, 1.0],
        "B": [0.5, 0.5],
        "B_last": [0.6, 0.6],
        "C": [0.4, 0.5, 0.4, 0.4],
        "D": [0.3, 0.3],  # from the later of the two followers' next Fetches
        "D_produce": [0.35, 0.35],
        "total": [1.7, 2.3],
    }
    for name, values in expected.items():
        assert sorted(stages[name]) == pytest.approx(sorted(values), abs=0.002), name
    summary = hops.summarize(stages)
    assert summary["total"]["n"] == 2
    assert summary["A"]["p50"] == pytest.approx(0.65, abs=0.002)


def test_the_producers_answer_is_the_first_message_to_it_after_the_acknowledgements() -> None:
    # The answer to the batch ahead reaches the producer while this one is replicated.
    earlier_answer = packet(SENT_S + 0.001, LEADER, PRODUCER, message(b"the batch ahead's answer"))
    stages = hops.hop_stages(hops.read_pcap(pcap([*one_record(SENT_S, FIRST), earlier_answer])), LEADER)
    assert stages["D_produce"] == pytest.approx([0.35], abs=0.002)


def test_a_record_only_partly_captured_is_left_out() -> None:
    # The capture began after this record reached the followers: only the consumer's answer.
    late = [packet(SENT_S + 0.0017, LEADER, CONSUMER, message(stamp(SENT_S)))]
    capture = pcap(late + one_record(SENT_S + 0.01, FIRST) + one_record(SENT_S + 0.02, SECOND))
    stages = hops.hop_stages(hops.read_pcap(capture), LEADER)
    assert len(stages["total"]) == 2
    assert sorted(stages["total"]) == pytest.approx([1.7, 2.3], abs=0.002)


def test_roles_come_from_the_traffic_whatever_the_port_numbers() -> None:
    # The consumer's port sorts first here; it is still the one that gets the record last.
    capture = pcap(one_record(SENT_S, FIRST, consumer=40_000))
    stages = hops.hop_stages(hops.read_pcap(capture), LEADER)
    assert stages["total"] == pytest.approx([1.7], abs=0.002)
    assert stages["D"] == pytest.approx([0.3], abs=0.002)
    assert stages["B_last"] == pytest.approx([0.6], abs=0.002)


def test_what_cannot_be_read_is_said() -> None:
    with pytest.raises(hops.CaptureError, match="24-byte header"):
        hops.read_pcap(b"\0" * 10)
    with pytest.raises(hops.CaptureError, match="pcapng"):
        hops.read_pcap(b"\x0a\x0d\x0d\x0a" + b"\0" * 40)
    with pytest.raises(hops.CaptureError, match="link type 228"):
        hops.read_pcap(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 228))
    with pytest.raises(hops.CaptureError, match="leader's port 1234"):
        hops.hop_stages(hops.read_pcap(pcap(one_record(SENT_S, FIRST))), 1234)
    produce_and_one_answer = one_record(SENT_S, FIRST)[:2]
    with pytest.raises(hops.CaptureError, match="a consumer and at least one follower"):
        hops.hop_stages(hops.read_pcap(pcap(produce_and_one_answer)), LEADER)
