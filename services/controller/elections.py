"""Leader election rules (Kafka's PartitionLeaderElectionAlgorithms): pure functions.

Each returns (leader, isr) or None when no leader can be chosen under the
rule. `live` is the set of brokers that may lead (registered and not shutting
down). A clean election always picks a leader from the ISR (invariant 5).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

Election = tuple[int, tuple[int, ...]]


def offline_partition_leader(assignment: Sequence[int], isr: Sequence[int], live: Collection[int],
                             unclean_enabled: bool) -> tuple[Election | None, bool]:
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


def preferred_replica_leader(assignment: Sequence[int], isr: Sequence[int], live: Collection[int]
                             ) -> Election | None:
    """The first replica of AR, if it is live and in the ISR."""
    if not assignment:
        return None
    preferred = assignment[0]
    if preferred in live and preferred in isr:
        return preferred, tuple(isr)
    return None


def controlled_shutdown_leader(assignment: Sequence[int], isr: Sequence[int], live: Collection[int],
                               shutting_down: Collection[int]) -> Election | None:
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
