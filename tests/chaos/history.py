"""The history of a chaos run and the checks made on it at the end.

Writers record every acknowledged acks=all write (topic, partition, offset,
value); readers record every record they consumed, in order. The checker
reads each partition back in full and verifies invariant 7 (every
acknowledged record present at its acknowledged offset), that no offset holds
two different records, that values written once are stored once, and that
each reader saw offsets strictly increasing with no acknowledged record
skipped below what it read.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from dataclasses import dataclass, field

TopicPartitionKey = tuple[str, int]


@dataclass
class History:
    acked: dict[TopicPartitionKey, dict[int, bytes]] = field(default_factory=lambda: defaultdict(dict))
    failed_writes: int = 0
    consumed: dict[str, dict[TopicPartitionKey, list[tuple[int, bytes]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    faults: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, tp: TopicPartitionKey, offset: int, value: bytes) -> None:
        with self._lock:
            previous = self.acked[tp].get(offset)
            if previous is not None and previous != value:
                raise AssertionError(f"offset {offset} of {tp} acknowledged twice: {previous!r} and {value!r}")
            self.acked[tp][offset] = value

    def fail(self) -> None:
        with self._lock:
            self.failed_writes += 1

    def consume(self, reader: str, tp: TopicPartitionKey, offset: int, value: bytes) -> None:
        with self._lock:
            self.consumed[reader][tp].append((offset, value))

    def fault(self, what: str) -> None:
        with self._lock:
            self.faults.append(what)

    @property
    def acked_count(self) -> int:
        return sum(len(v) for v in self.acked.values())


def check(history: History, logs: dict[TopicPartitionKey, list[tuple[int, bytes]]]) -> list[str]:
    """Every violation found, as sentences (empty: the run is clean)."""
    problems: list[str] = []
    for tp, acked in history.acked.items():
        stored = dict(logs.get(tp, []))
        lost = [(o, v) for o, v in sorted(acked.items()) if stored.get(o) != v]
        if lost:
            o, v = lost[0]
            problems.append(f"{tp}: {len(lost)} acknowledged records lost or moved; first: offset {o} "
                            f"{v!r} is now {stored.get(o)!r}")
    for tp, records in logs.items():
        offsets = [o for o, _ in records]
        if len(offsets) != len(set(offsets)):
            problems.append(f"{tp}: the log returned an offset twice")
        if offsets != sorted(offsets):
            problems.append(f"{tp}: the log's offsets are out of order")
        acked_values = set(history.acked.get(tp, {}).values())
        seen: dict[bytes, int] = {}
        for o, v in records:
            if v in acked_values and v in seen:
                problems.append(f"{tp}: acknowledged value {v!r} stored twice (offsets {seen[v]} and {o})")
                break
            seen[v] = o
    for reader, by_tp in history.consumed.items():
        for tp, records in by_tp.items():
            offsets = [o for o, _ in records]
            if any(b <= a for a, b in itertools.pairwise(offsets)):
                problems.append(f"reader {reader} saw {tp} offsets go backwards or repeat")
            if offsets:
                read_up_to = offsets[-1]
                read = set(offsets)
                skipped = [o for o in history.acked.get(tp, {}) if offsets[0] <= o <= read_up_to and o not in read]
                if skipped:
                    problems.append(f"reader {reader} skipped {len(skipped)} acknowledged records of {tp} "
                                    f"(first offset {min(skipped)})")
            stored = dict(logs.get(tp, []))
            wrong = [(o, v) for o, v in records if o in stored and stored[o] != v]
            if wrong:
                problems.append(f"reader {reader} read {tp} offset {wrong[0][0]} as {wrong[0][1]!r}, "
                                f"the log has {stored[wrong[0][0]]!r}")
    return problems
