"""Bugs the simulation found in the pure logic and that are not fixed yet, and how to recognise them.

A failing run is attributed to one of these only when the checker saw that bug's own
signature on the partition that failed, so a new bug is not hidden behind an old one.
tests/sim/test_known_issues.py reduces each to a scripted scenario and
tests/sim/test_simulation.py keeps a regression seed for each (all xfail(strict=True)).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.sim.checker import Checker

KNOWN_ISSUES = {
    "KI-1": "a broker that lost unflushed data in a power loss restarts, keeps its ISR membership "
            "(and even its leader epoch) because the controller never saw it die, and is elected "
            "leader over ISR members that kept every committed record",
    "KI-2": "a follower keeps a leader-epoch entry that starts at its LEO (it became leader and wrote "
            "nothing); truncation to that LEO is skipped, so the leader's older-epoch batches at that "
            "offset are refused by append_as_follower (InvariantViolation) and the replica stops replicating",
    "KI-3": "a reassignment submitted while another is in progress drops the replicas the first one was "
            "adding, even the one that has become leader: the leader and ISR are left outside the replica "
            "set, the leader is not sent the new leader epoch, and the partition stops making progress",
    "KI-4": "when the answer to an ISR expansion is lost (AlterPartition timed out after the controller "
            "committed it), the leader drops the pending member and advances the HW without it, although "
            "the committed ISR counts it; if it is elected, committed records are lost",
}
_KI2_MESSAGE = re.compile(r"log /sim/b(\d+)/(t\d+)-(\d+): follower batch at offset \d+ has leader epoch \d+ below")


def known_issue(reason: str, checker: Checker) -> str | None:
    """The tag of a known, reported bug that explains this failure, if any.

    The signatures that name their rule come first; KI-1 (a restarted broker leading again)
    is judged last, from what the checker saw happen to the partition that failed.
    """
    if "the HW no longer waits for" in reason:
        return f"KI-4: {KNOWN_ISSUES['KI-4']}"
    if "outside its replicas" in reason:
        return f"KI-3: {KNOWN_ISSUES['KI-3']}"
    match = _KI2_MESSAGE.search(reason)
    if match is not None:
        broker = checker.brokers.get(int(match.group(1)))
        p = broker.partitions.get((match.group(2), int(match.group(3)))) if broker is not None else None
        entries = p.log.leader_epoch_cache.entries() if p is not None else []
        if entries and entries[-1][1] == p.log.log_end_offset:  # type: ignore[union-attr]
            return f"KI-2: {KNOWN_ISSUES['KI-2']}"
    partitions = set(re.findall(r"\b(t\d+-\d+)\b", reason))
    for line in checker.suspect_leaders:
        if line.split(" ", 1)[0] in partitions:
            return f"KI-1: {KNOWN_ISSUES['KI-1']}"
    return None
