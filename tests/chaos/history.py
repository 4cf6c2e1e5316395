"""The history of a chaos run and the checks made on it at the end.

Writers record every acknowledged acks=all write (topic, partition, offset,
value); readers record every record they consumed, in order. The checker
reads each partition back in full and verifies invariant 7 (every
acknowledged record present at its acknowledged offset), that no offset holds
two different records, that values written once are stored once, and that
each reader saw offsets strictly increasing with no acknowledged record
skipped below what it read.

Writers also record every attempt with its start and end time and its
outcome, so a scenario can ask what happened to one partition while a fault
lasted (e.g. that no write was acknowledged while its ISR was below
min.insync.replicas).
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from dataclasses import dataclass, field

from clients.common.types import TopicPartitionKey

# The outcome of a write the gateway answered without an error code; others are ErrorCode names.
ACKNOWLEDGED = "NONE"
# The outcome of a write whose gRPC call itself failed (the gateway unreachable or too slow).
RPC_FAILED = "RPC_FAILED"


@dataclass(frozen=True)
class WriteAttempt:
    tp: TopicPartitionKey
    started_s: float  # time.monotonic() when the request was sent
    finished_s: float  # time.monotonic() when its answer (or failure) came
    outcome: str  # ACKNOWLEDGED, an ErrorCode name, or RPC_FAILED


@dataclass
class History:
    acked: dict[TopicPartitionKey, dict[int, bytes]] = field(default_factory=lambda: defaultdict(dict))
    failed_writes: int = 0
    consumed: dict[str, dict[TopicPartitionKey, list[tuple[int, bytes]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    faults: list[str] = field(default_factory=list)
    attempts: list[WriteAttempt] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, tp: TopicPartitionKey, offset: int, value: bytes) -> None:
        with self._lock:
            previous = self.acked[tp].get(offset)
            if previous is not None and previous != value:
                raise AssertionError(
                    f"offset {offset} of {tp} acknowledged twice: {previous!r} and {value!r}"
                )
            self.acked[tp][offset] = value

    def fail(self) -> None:
        with self._lock:
            self.failed_writes += 1

    def attempt(self, tp: TopicPartitionKey, started_s: float, finished_s: float, outcome: str) -> None:
        with self._lock:
            self.attempts.append(WriteAttempt(tp, started_s, finished_s, outcome))

    def attempts_within(
        self, tps: set[TopicPartitionKey], start_s: float, end_s: float
    ) -> list[WriteAttempt]:
        """Attempts on tps sent at or after start_s and answered by end_s (both time.monotonic())."""
        with self._lock:
            return [
                a for a in self.attempts if a.tp in tps and a.started_s >= start_s and a.finished_s <= end_s
            ]

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
            problems.append(
                f"{tp}: {len(lost)} acknowledged records lost or moved; first: offset {o} "
                f"{v!r} is now {stored.get(o)!r}"
            )
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
                skipped = [
                    o for o in history.acked.get(tp, {}) if offsets[0] <= o <= read_up_to and o not in read
                ]
                if skipped:
                    problems.append(
                        f"reader {reader} skipped {len(skipped)} acknowledged records of {tp} "
                        f"(first offset {min(skipped)})"
                    )
            stored = dict(logs.get(tp, []))
            wrong = [(o, v) for o, v in records if o in stored and stored[o] != v]
            if wrong:
                problems.append(
                    f"reader {reader} read {tp} offset {wrong[0][0]} as {wrong[0][1]!r}, "
                    f"the log has {stored[wrong[0][0]]!r}"
                )
    return problems


def check_replicas(
    logs: dict[TopicPartitionKey, list[tuple[int, bytes]]],
    replicas: dict[int, dict[TopicPartitionKey, list[tuple[int, bytes]]]],
    in_sync: dict[TopicPartitionKey, set[int]],
) -> list[str]:
    """Invariant 6 on the replicas' own logs (read from disk after the cluster stopped).

    logs: each partition as read back through its leader (the committed records).
    replicas: broker -> partition -> its log. in_sync: the ISR when the run ended.
    Every replica's offsets run without a gap; any two replicas (and the committed
    log) that hold an offset hold the same record there; every ISR member holds
    every committed record.
    """
    problems: list[str] = []
    for tp, committed in sorted(logs.items()):
        holders: dict[int, tuple[str, bytes]] = {o: ("the committed log", v) for o, v in committed}
        for broker, by_tp in sorted(replicas.items()):
            records = by_tp.get(tp)
            if records is None:
                if broker in in_sync.get(tp, set()):
                    problems.append(f"{tp}: broker {broker} is in the ISR but has no log")
                continue
            offsets = [o for o, _ in records]
            if offsets and offsets != list(range(offsets[0], offsets[0] + len(offsets))):
                problems.append(f"{tp}: broker {broker}'s log has a gap or disorder in its offsets")
            for o, v in records:
                first = holders.setdefault(o, (f"broker {broker}", v))
                if first[1] != v:
                    problems.append(
                        f"{tp}: broker {broker} holds {v!r} at offset {o}, {first[0]} holds {first[1]!r}"
                    )
                    break
            if broker in in_sync.get(tp, set()):
                held = set(offsets)
                missing = [o for o, _ in committed if o not in held]
                if missing:
                    problems.append(
                        f"{tp}: broker {broker} is in the ISR but lacks {len(missing)} committed "
                        f"records (first offset {missing[0]})"
                    )
    return problems
