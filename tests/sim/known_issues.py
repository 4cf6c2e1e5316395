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

# Fixed since the simulation found them (their scenarios stay in test_known_issues.py as
# plain regression tests): KI-1's first half, a restarted broker seen in one BrokerChange
# keeping leadership and ISR membership (3607b0a); KI-2, a follower stuck behind an empty
# epoch of its own at its LEO; KI-3, a reassignment replacing an ongoing one dropping the
# replica being added even when it had become leader (66c28ac); KI-4, the leader's HW
# passing a member whose ISR expansion was committed but not answered; KI-1's second half,
# a broker back from a power loss leading an offline partition over ISR members that may
# return with every record (brokers report unclean shutdowns at registration, issue 16).
KNOWN_ISSUES: dict[str, str] = {}


# What a failure caused by KI-1 says: records lost, cut, changed, or logs that diverge.
KI1_REASONS = re.compile(r"record|diverges|not a prefix|LEO")


def known_issue(reason: str, checker: Checker) -> str | None:
    """The tag of a known, reported bug that explains this failure, if any.

    The signatures that name their rule come first; KI-1 (a restarted broker leading again)
    is judged last, from what the checker saw happen to the partition that failed.
    """
    if "KI-1" not in KNOWN_ISSUES or not KI1_REASONS.search(reason):
        return None  # KI-1 loses or rewrites records; a cluster that does not converge is something else
    partitions = set(re.findall(r"\b(t\d+-\d+)\b", reason))
    for line in checker.suspect_leaders:
        if line.split(" ", 1)[0] in partitions:
            return f"KI-1: {KNOWN_ISSUES['KI-1']}"
    return None
