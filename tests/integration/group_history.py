"""The history checker of the consumer-group test: what every member wrote, judged against
what the producer had acknowledged and what the test did to the members.

Every member process appends one JSON object per line to its own history file (flushed per
line, so a SIGKILL loses nothing the member had written):

    {"t": wall ms, "ev": "assigned", "epoch": e, "tps": [[topic, p], ...]}   partitions gained
    {"t": ..., "ev": "revoked", "tps": [...]}     given up on request (after committing them)
    {"t": ..., "ev": "lost", "tps": [...]}        taken away without a chance to commit (fenced)
    {"t": ..., "ev": "record", "tp": [topic, p], "offset": o, "value": "..."}
    {"t": ..., "ev": "commit", "offsets": [[topic, p, next_offset], ...]}      accepted
    {"t": ..., "ev": "commit_refused", "error": "FENCED_MEMBER_EPOCH", "offsets": [...]}
    {"t": ..., "ev": "closed"}

The test adds its own actions: {"t": ..., "member": name, "ev": "killed" | "stopped" |
"resumed" | "close_started"}.

What must hold (issue 19):
1. Every acknowledged record was processed at least once.
2. A record processed twice was first processed by a member that died (killed, or paused
   past its session and fenced) before committing past it: duplicates only come from the
   uncommitted window of a dead member.
3. Never two live members own one partition at once. A member owns a partition from its
   "assigned" line to its "revoked"/"lost" line; a member is dead from its kill (or pause)
   on, so a paused zombie's stale ownership does not count against its successor.
4. After a crash, every partition the dead member owned is owned again within the session
   timeout + 1 s; after a clean leave (close), within 1 s.
5. A paused member that resumed had its commits refused (a zombie cannot commit).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clients.common.types import TopicPartitionKey

# How much later than the rule's bound a re-assignment may be logged: the member logs
# "assigned" after the heartbeat answer reached it, a few ms after the coordinator decided.
LOG_SLACK_MS = 0


@dataclass
class Member:
    name: str
    events: list[dict[str, Any]] = field(default_factory=list)
    died_ms: int | None = None  # killed, or paused (a zombie from then on)
    paused: bool = False
    resumed_ms: int | None = None
    close_started_ms: int | None = None


def read_history(path: Path) -> list[dict[str, Any]]:
    """The events of one file; a last line cut short by a kill is ignored."""
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def _tp(raw: list[Any]) -> TopicPartitionKey:
    return (str(raw[0]), int(raw[1]))


def ownership(member: Member) -> dict[TopicPartitionKey, list[tuple[int, int]]]:
    """Per partition, the [from, to) wall-clock intervals in which the member owned it while
    alive. Ownership still open at death (or at the end) ends there."""
    end_of_life = member.died_ms if member.died_ms is not None else 2**62
    owned: dict[TopicPartitionKey, int] = {}
    intervals: dict[TopicPartitionKey, list[tuple[int, int]]] = defaultdict(list)
    for ev in member.events:
        t = int(ev["t"])
        if ev["ev"] == "assigned":
            for raw in ev["tps"]:
                owned.setdefault(_tp(raw), t)
        elif ev["ev"] in ("revoked", "lost"):
            for raw in ev["tps"]:
                tp = _tp(raw)
                if tp in owned:
                    start = owned.pop(tp)
                    intervals[tp].append((start, min(t, end_of_life)))
    for tp, start in owned.items():
        intervals[tp].append((start, end_of_life))
    return {tp: [(a, b) for a, b in spans if a < b] for tp, spans in intervals.items()}


def check(
    produced: dict[TopicPartitionKey, dict[int, str]],
    members: list[Member],
    *,
    session_timeout_ms: int,
) -> list[str]:
    """Every violation of the rules above, as sentences (empty: the history is correct)."""
    problems: list[str] = []
    processed: dict[tuple[TopicPartitionKey, int], list[tuple[int, str]]] = defaultdict(list)
    for m in members:
        for ev in m.events:
            if ev["ev"] == "record":
                tp = _tp(ev["tp"])
                processed[(tp, int(ev["offset"]))].append((int(ev["t"]), m.name))
                want = produced.get(tp, {}).get(int(ev["offset"]))
                if want is not None and want != ev["value"]:
                    problems.append(
                        f"{m.name} read {ev['value']!r} at {tp}@{ev['offset']}, the producer wrote {want!r}"
                    )

    # 1. at least once
    missing = [(tp, o) for tp, by_offset in produced.items() for o in by_offset if (tp, o) not in processed]
    if missing:
        problems.append(f"{len(missing)} acknowledged records never processed, e.g. {sorted(missing)[:5]}")

    # 2. duplicates only from a dead member's uncommitted window
    by_name = {m.name: m for m in members}
    committed_by: dict[str, dict[TopicPartitionKey, int]] = {}
    for m in members:
        last: dict[TopicPartitionKey, int] = {}
        for ev in m.events:
            if ev["ev"] == "commit":
                for topic, p, nxt in ev["offsets"]:
                    last[(topic, int(p))] = max(last.get((topic, int(p)), 0), int(nxt))
        committed_by[m.name] = last
    for (tp, offset), seen in processed.items():
        if len(seen) < 2:
            continue
        seen.sort()
        for _, name in seen[:-1]:
            first = by_name[name]
            if first.died_ms is None:
                problems.append(
                    f"{tp}@{offset} processed again after {name}, which did not die: "
                    f"a duplicate outside a dead member's window ({seen})"
                )
            elif committed_by[name].get(tp, 0) > offset:
                problems.append(
                    f"{tp}@{offset} processed again although {name} had committed past it "
                    f"({committed_by[name][tp]})"
                )

    # 3. never two live owners at once
    spans: dict[TopicPartitionKey, list[tuple[int, int, str]]] = defaultdict(list)
    for m in members:
        for tp, intervals in ownership(m).items():
            spans[tp].extend((a, b, m.name) for a, b in intervals)
    for tp, items in spans.items():
        items.sort()
        for i, (a1, b1, n1) in enumerate(items):
            for a2, b2, n2 in items[i + 1 :]:
                if a2 >= b1:
                    break  # sorted by start: no later interval overlaps this one
                if n1 != n2:
                    problems.append(f"{tp} owned by {n1} [{a1}, {b1}) and {n2} [{a2}, {b2}) at once")

    # 4. partitions owned again in time
    for m in members:
        if m.died_ms is not None:
            bound, what = m.died_ms + session_timeout_ms + 1_000, "pause" if m.paused else "crash"
        elif m.close_started_ms is not None:
            bound, what = None, "clean leave"
        else:
            continue
        left_ms = m.died_ms if m.died_ms is not None else _closed_ms(m)
        if bound is None:
            bound = left_ms + 1_000
        held = [tp for tp, intervals in ownership(m).items() if intervals and intervals[-1][1] >= left_ms]
        for tp in held:
            taken = [a for a, _, n in spans[tp] if n != m.name and a >= intervals_end(m, tp)]
            if not taken or min(taken) > bound + LOG_SLACK_MS:
                when = f"{min(taken) - left_ms} ms" if taken else "never"
                problems.append(
                    f"{tp} owned again {when} after {m.name}'s {what} (bound {bound - left_ms} ms)"
                )

    # 5. a resumed zombie cannot commit
    for m in members:
        if m.paused and m.resumed_ms is not None:
            late = [ev for ev in m.events if ev["ev"] == "commit" and int(ev["t"]) >= m.resumed_ms]
            if late:
                problems.append(
                    f"{m.name} committed after it resumed from a pause past its session: {late[:2]}"
                )
    return problems


def _closed_ms(m: Member) -> int:
    assert m.close_started_ms is not None
    return m.close_started_ms


def intervals_end(m: Member, tp: TopicPartitionKey) -> int:
    """When the member's last ownership of tp started (a successor's must start after it)."""
    return ownership(m)[tp][-1][0]
