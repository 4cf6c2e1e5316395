"""The history checker of the consumer-group test: what every member wrote, judged against
what the producer had acknowledged and what the test did to the members.

Every member process appends one JSON object per line to its own history file (flushed per
line, so a SIGKILL loses nothing the member had written):

    {"t": wall ms, "ev": "assigned", "epoch": e, "tps": [[topic, p], ...]}   partitions gained
    {"t": ..., "ev": "revoked", "tps": [...]}     given up on request (after committing them)
    {"t": ..., "ev": "lost", "tps": [...]}        taken away without a chance to commit (fenced)
    {"t": ..., "ev": "record", "tp": [topic, p], "offset": o, "value": "..."}
    {"t": ..., "ev": "commit", "sent": ..., "offsets": [[topic, p, next_offset], ...]}  accepted
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
    died_ms: int | None = None  # killed, or paused (a zombie from then on, until fenced)
    paused: bool = False
    resumed_ms: int | None = None
    close_started_ms: int | None = None

    def zombie_until_ms(self) -> int:
        """The end of the member's dead window: never for a killed member; for a paused one,
        the moment it learnt it was fenced (its first "lost" after resuming)."""
        if not self.paused or self.resumed_ms is None:
            return 2**62
        for ev in self.events:
            if ev["ev"] == "lost" and int(ev["t"]) >= self.resumed_ms:
                return int(ev["t"])
        return 2**62

    def dead_at(self, t: int) -> bool:
        return self.died_ms is not None and self.died_ms <= t <= self.zombie_until_ms()


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
    alive: an ownership open when the member died (was killed or paused) ends there."""
    owned: dict[TopicPartitionKey, int] = {}
    raw: dict[TopicPartitionKey, list[tuple[int, int]]] = defaultdict(list)
    for ev in member.events:
        t = int(ev["t"])
        if ev["ev"] == "assigned":
            for item in ev["tps"]:
                owned.setdefault(_tp(item), t)
        elif ev["ev"] in ("revoked", "lost"):
            for item in ev["tps"]:
                tp = _tp(item)
                if tp in owned:
                    raw[tp].append((owned.pop(tp), t))
    for tp, start in owned.items():
        raw[tp].append((start, 2**62))
    intervals: dict[TopicPartitionKey, list[tuple[int, int]]] = {}
    for tp, spans in raw.items():
        cut = []
        for a, b in spans:
            if member.died_ms is not None and a < member.died_ms:
                b = min(b, member.died_ms)
            elif member.died_ms is not None and a >= member.died_ms and a <= member.zombie_until_ms():
                continue  # taken while a zombie (cannot happen: it heartbeats nothing then)
            if a < b:
                cut.append((a, b))
        intervals[tp] = cut
    return intervals


def _committed_before(member: Member, tp: TopicPartitionKey, t: int) -> int:
    """The highest next-offset the member committed for tp before time t (0: none)."""
    best = 0
    for ev in member.events:
        if ev["ev"] == "commit" and int(ev["t"]) <= t:
            for topic, p, nxt in ev["offsets"]:
                if (topic, int(p)) == tp:
                    best = max(best, int(nxt))
    return best


def check(
    produced: dict[TopicPartitionKey, dict[int, str]],
    members: list[Member],
    *,
    session_timeout_ms: int,
) -> list[str]:
    """Every violation of the rules above, as sentences (empty: the history is correct)."""
    problems: list[str] = []
    processed: dict[tuple[TopicPartitionKey, int], list[tuple[int, Member]]] = defaultdict(list)
    for m in members:
        for ev in m.events:
            if ev["ev"] == "record":
                tp = _tp(ev["tp"])
                processed[(tp, int(ev["offset"]))].append((int(ev["t"]), m))
                want = produced.get(tp, {}).get(int(ev["offset"]))
                if want is not None and want != ev["value"]:
                    problems.append(
                        f"{m.name} read {ev['value']!r} at {tp}@{ev['offset']}, the producer wrote {want!r}"
                    )

    # 1. at least once
    missing = [(tp, o) for tp, by_offset in produced.items() for o in by_offset if (tp, o) not in processed]
    if missing:
        problems.append(f"{len(missing)} acknowledged records never processed, e.g. {sorted(missing)[:5]}")

    # 2. duplicates only from a dead member's uncommitted window: of all the times a record
    # was processed, at most one is by a member that was alive and had not died with the
    # record uncommitted.
    for (tp, offset), seen in processed.items():
        if len(seen) < 2:
            continue
        excused = []
        for t, m in seen:
            if m.dead_at(t):
                excused.append(True)  # a zombie's processing after its pause
            elif m.died_ms is not None and t < m.died_ms:
                # before its death: excused only if it never committed past the record
                excused.append(_committed_before(m, tp, m.died_ms) <= offset)
            else:
                excused.append(False)
        if excused.count(False) > 1:
            who = [(t, m.name) for t, m in sorted(seen, key=lambda s: s[0])]
            problems.append(f"{tp}@{offset} processed by more than one live member: {who}")

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
            left_ms = m.died_ms
            bound_ms, what = session_timeout_ms + 1_000, "pause" if m.paused else "crash"
        elif m.close_started_ms is not None:
            left_ms, bound_ms, what = m.close_started_ms, 1_000, "clean leave"
        else:
            continue
        for tp, intervals in ownership(m).items():
            held = [a for a, b in intervals if a <= left_ms <= b]
            if not held:
                continue
            taken = [a for a, _, n in spans[tp] if n != m.name and a >= held[0]]
            if not taken or min(taken) - left_ms > bound_ms:
                when = f"{min(taken) - left_ms} ms" if taken else "never"
                problems.append(f"{tp} owned again {when} after {m.name}'s {what} (bound {bound_ms} ms)")

    # 5. a resumed zombie cannot commit
    for m in members:
        if m.paused and m.resumed_ms is not None:
            late = [
                ev
                for ev in m.events
                # Judged by when the commit was sent: one sent before the pause and answered
                # while the member was still live is logged only after it resumed.
                if ev["ev"] == "commit"
                and m.resumed_ms <= int(ev.get("sent", ev["t"])) <= m.zombie_until_ms()
            ]
            if late:
                problems.append(
                    f"{m.name} committed after it resumed from a pause past its session: {late[:2]}"
                )
            if m.zombie_until_ms() == 2**62:
                problems.append(f"{m.name} resumed from a pause past its session and was never fenced")
    return problems
