"""Where end-to-end latency goes, hop by hop, from a packet capture of loopback.

`bench/e2e_latency.py --hops` captures the partition leader's TCP traffic with tcpdump for a
few seconds of a run. Every record the benchmark sends carries its send time in its first 8
bytes (`time.time_ns()`, big-endian, then a one-byte measured flag), and gRPC does not
compress message bytes, so each record can be found in every TCP segment that carries it: the
Produce to the leader, the leader's Fetch answers to the followers and to the consumer. A
follower's acknowledgement is its next Fetch (the next segment with a message in it on its
connection), and the producer's answer the next such segment from the leader to it. Roles come
from the traffic itself: the producer sends the records to the leader; of the connections the
leader sends them on, the consumer's is the one that gets them last (only once the HW has
moved past them), the others are the followers'.

Stages, in milliseconds per record (see STAGES):
  A  send() -> its Produce reaches the leader (the Producer's batching and hand-over)
  B  the Produce in -> the first follower's Fetch answer out (B_last: the last follower's)
  C  a follower's answer in -> its next Fetch out (its append and acknowledgement)
  D  the last follower's next Fetch in -> the consumer's answer out (the HW moves)
  D_produce  the same -> the leader's next message to the producer (its answer)
  total  send() -> the consumer's answer out

Pure functions over the capture's bytes; the capture itself is e2e_latency.py's.
"""

from __future__ import annotations

import bisect
import collections
import statistics
import struct
from dataclasses import dataclass

# pcap (not pcapng): tcpdump -w writes it by default.
_PCAP_MAGIC_US = 0xA1B2C3D4
_PCAP_MAGIC_NS = 0xA1B23C4D
_LINKTYPE_ETHERNET = 1  # what tcpdump reports for Linux's loopback
_LINKTYPE_LINUX_SLL = 113  # "any" device
_ETHERTYPE_IPV4 = 0x0800
_IPPROTO_TCP = 6
# The record stamp bench/e2e_latency.py writes: send time in ns, then a 0/1 measured flag.
_STAMP = struct.Struct(">qB")
# A segment with fewer payload bytes carries no gRPC message (window updates, pings, acks).
MESSAGE_BYTES_MIN = 30
# Stamps farther than this before the capture began are taken for chance byte patterns.
STAMP_AGE_MAX_S = 60.0

STAGES = ("A", "B", "B_last", "C", "D", "D_produce", "total")


@dataclass(frozen=True, slots=True)
class Segment:
    """One TCP segment with a payload: capture time (s), ports, payload bytes."""

    time_s: float
    source_port: int
    destination_port: int
    payload: bytes


class CaptureError(ValueError):
    """The capture is not something this module reads (format, link type) or holds too little."""


def read_pcap(data: bytes) -> list[Segment]:
    """The IPv4 TCP segments with a payload in a pcap file's bytes, in capture order."""
    if len(data) < 24:
        raise CaptureError(f"a pcap file starts with a 24-byte header; this one has {len(data)} bytes")
    for order in ("<", ">"):
        magic, _major, _minor, _zone, _sigfigs, _snaplen, linktype = struct.unpack_from(
            order + "IHHiIII", data, 0
        )
        if magic in (_PCAP_MAGIC_US, _PCAP_MAGIC_NS):
            break
    else:
        raise CaptureError("not a pcap file (pcapng is not read: capture with tcpdump -w, its default)")
    fraction = 1e-9 if magic == _PCAP_MAGIC_NS else 1e-6
    if linktype == _LINKTYPE_ETHERNET:
        link_bytes = 14
    elif linktype == _LINKTYPE_LINUX_SLL:
        link_bytes = 16
    else:
        raise CaptureError(f"link type {linktype} is not read (capture on lo: Ethernet framing)")
    record = struct.Struct(order + "IIII")
    segments: list[Segment] = []
    offset = 24
    while offset + record.size <= len(data):
        seconds, fraction_units, captured, _original = record.unpack_from(data, offset)
        offset += record.size
        packet = data[offset : offset + captured]
        offset += captured
        if len(packet) < link_bytes + 20:
            continue
        if struct.unpack_from(">H", packet, link_bytes - 2)[0] != _ETHERTYPE_IPV4:
            continue
        ip = packet[link_bytes:]
        if ip[9] != _IPPROTO_TCP:
            continue
        ip_header_bytes = (ip[0] & 0x0F) * 4
        tcp = ip[ip_header_bytes:]
        if len(tcp) < 20:
            continue
        source_port, destination_port = struct.unpack_from(">HH", tcp, 0)
        payload = tcp[(tcp[12] >> 4) * 4 :]
        if payload:
            segments.append(
                Segment(seconds + fraction_units * fraction, source_port, destination_port, bytes(payload))
            )
    return segments


def _stamps(segments: list[Segment]) -> dict[int, list[int]]:
    """Record send time (ns) -> indexes of the segments carrying that record, in order."""
    if not segments:
        return {}
    first_s, last_s = segments[0].time_s, segments[-1].time_s
    # Send times share their top three bytes with the capture's clock (they change every ~18
    # minutes: take both ends' and the oldest believable stamp's).
    prefixes = {_STAMP.pack(int(t * 1e9), 0)[:3] for t in (first_s - STAMP_AGE_MAX_S, first_s, last_s)}
    low_ns, high_ns = int((first_s - STAMP_AGE_MAX_S) * 1e9), int(last_s * 1e9)
    found: dict[int, list[int]] = collections.defaultdict(list)
    for index, segment in enumerate(segments):
        payload = segment.payload
        for prefix in prefixes:
            start = payload.find(prefix)
            while 0 <= start <= len(payload) - _STAMP.size:
                sent_ns, flag = _STAMP.unpack_from(payload, start)
                if flag in (0, 1) and low_ns <= sent_ns <= high_ns:
                    carriers = found[sent_ns]
                    if not carriers or carriers[-1] != index:
                        carriers.append(index)
                start = payload.find(prefix, start + 1)
    return found


def hop_stages(segments: list[Segment], leader_port: int) -> dict[str, list[float]]:
    """Per stage (STAGES), the delay of every record seen through its whole path, in ms."""
    stamps = _stamps(segments)
    into_leader = collections.Counter(
        segments[carriers[0]].source_port
        for carriers in stamps.values()
        if segments[carriers[0]].destination_port == leader_port
    )
    if not into_leader:
        raise CaptureError(f"no record was seen going to the leader's port {leader_port}")
    producer = into_leader.most_common(1)[0][0]
    # Each record's first segment per direction.
    first_by_record: dict[int, dict[tuple[int, int], int]] = {}
    for sent_ns, carriers in stamps.items():
        first: dict[tuple[int, int], int] = {}
        for index in carriers:
            segment = segments[index]
            first.setdefault((segment.source_port, segment.destination_port), index)
        first_by_record[sent_ns] = first
    delays: dict[int, list[float]] = collections.defaultdict(list)
    for sent_ns, first in first_by_record.items():
        for (source, destination), index in first.items():
            if source == leader_port and destination != producer:
                delays[destination].append(segments[index].time_s - sent_ns / 1e9)
    if len(delays) < 2:
        raise CaptureError(
            f"the leader sent the records on {len(delays)} connection(s); a consumer and at least "
            "one follower are needed"
        )
    # The consumer gets a record only once every ISR member has it: last of all.
    consumer = max(delays, key=lambda port: statistics.median(delays[port]))
    followers = sorted(port for port in delays if port != consumer)
    by_direction: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
    for index, segment in enumerate(segments):
        if len(segment.payload) >= MESSAGE_BYTES_MIN:
            by_direction[(segment.source_port, segment.destination_port)].append(index)

    def next_message(direction: tuple[int, int], after: int) -> int | None:
        indexes = by_direction.get(direction, [])
        at = bisect.bisect_right(indexes, after)
        return indexes[at] if at < len(indexes) else None

    stages: dict[str, list[float]] = {name: [] for name in STAGES}
    for sent_ns, first in first_by_record.items():
        needed = [(producer, leader_port), (leader_port, consumer)] + [(leader_port, f) for f in followers]
        if any(direction not in first for direction in needed):
            continue  # only part of its path fell inside the capture
        sent_s = sent_ns / 1e9
        produce_in = segments[first[(producer, leader_port)]].time_s
        answers = [first[(leader_port, f)] for f in followers]
        acknowledgements = [
            next_message((f, leader_port), i) for f, i in zip(followers, answers, strict=True)
        ]
        if any(a is None for a in acknowledgements):
            continue
        last_acknowledgement = max(a for a in acknowledgements if a is not None)
        acknowledged_s = segments[last_acknowledgement].time_s
        consumer_out = segments[first[(leader_port, consumer)]].time_s
        stages["A"].append(produce_in - sent_s)
        stages["B"].append(min(segments[i].time_s for i in answers) - produce_in)
        stages["B_last"].append(max(segments[i].time_s for i in answers) - produce_in)
        for answer, acknowledgement in zip(answers, acknowledgements, strict=True):
            if acknowledgement is not None:
                stages["C"].append(segments[acknowledgement].time_s - segments[answer].time_s)
        stages["D"].append(consumer_out - acknowledged_s)
        produce_answer = next_message((leader_port, producer), last_acknowledgement)
        if produce_answer is not None:
            stages["D_produce"].append(segments[produce_answer].time_s - acknowledged_s)
        stages["total"].append(consumer_out - sent_s)
    return {name: [seconds * 1000 for seconds in values] for name, values in stages.items()}


def summarize(stages: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """p10 / p50 / p90 (ms) and the count of each stage that has values."""
    out: dict[str, dict[str, float]] = {}
    for name, values in stages.items():
        if not values:
            continue
        ordered = sorted(values)
        n = len(ordered)
        out[name] = {
            "n": n,
            "p10": round(ordered[n // 10], 3),
            "p50": round(statistics.median(ordered), 3),
            "p90": round(ordered[n * 9 // 10], 3),
        }
    return out
