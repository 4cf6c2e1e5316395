"""Leader election rules (Kafka's PartitionLeaderElectionAlgorithms): pure functions.

Each returns (leader, isr) or None when no leader can be chosen under the
rule. `live` is the set of brokers that may lead (registered and not shutting
down). A clean election always picks a leader from the ISR (invariant 5).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

Election = tuple[int, tuple[int, ...]]


def offline_partition_leader(
    assignment: Sequence[int], isr: Sequence[int], live: Collection[int], unclean_enabled: bool
) -> tuple[Election | None, bool]:
    """Leader after the current one died: first live replica in AR order that is in the ISR.

    Returns ((leader, new_isr), unclean) where unclean says the leader came from
    outside the ISR (potential data loss, logged and counted by the caller).
    """
    live_isr = tuple(r for r in isr if r in live)
    for r in assignment:
        if r in live_isr:
            return (r, live_isr), False
    if unclean_enabled:
        for r in assignment:
            if r in live:
                return (r, (r,)), True
    return None, False


def preferred_replica_leader(
    assignment: Sequence[int], isr: Sequence[int], live: Collection[int]
) -> Election | None:
    """The first replica of AR, if it is live and in the ISR."""
    if not assignment:
        return None
    preferred = assignment[0]
    if preferred in live and preferred in isr:
        return preferred, tuple(isr)
    return None


def controlled_shutdown_leader(
    assignment: Sequence[int], isr: Sequence[int], live: Collection[int], shutting_down: Collection[int]
) -> Election | None:
    """A live ISR member other than the brokers shutting down; they leave the ISR."""
    new_isr = tuple(r for r in isr if r not in shutting_down)
    for r in assignment:
        if r in new_isr and r in live and r not in shutting_down:
            return r, new_isr
    return None


def reassignment_leader(target: Sequence[int], isr: Sequence[int], live: Collection[int]) -> Election | None:
    """A leader from the target replicas (RAR) that is live and in the ISR."""
    for r in target:
        if r in live and r in isr:
            return r, tuple(isr)
    return None


def restarted_isr_leader(
    assignment: Sequence[int],
    last_isr: Sequence[int],
    live: Collection[int],
    restarted: Collection[int],
    lost_data: Collection[int],
) -> Election | None:
    """When no member of the last ISR survived: one that restarted since (Kafka's KIP-966 idea).

    `restarted` are live brokers whose registration is newer than their ISR
    membership; `lost_data` those of them that report an unclean shutdown (a power
    loss may have taken records they acknowledged). A member that kept its data
    leads, alone in the ISR. One that lost data does not while another member of
    the last ISR may still come back with every committed record; once every
    member is back and all lost data, nothing better will come, and the first in
    AR order leads.
    """
    back = [r for r in assignment if r in last_isr and r in restarted and r in live]
    kept = [r for r in back if r not in lost_data]
    if kept:
        return kept[0], (kept[0],)
    if back and all(r in back for r in last_isr):
        return back[0], (back[0],)
    return None
