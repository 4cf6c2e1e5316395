"""A follower partition's fetch state (Kafka's PartitionFetchState): pure data.

Transitions are data: `LEGAL_TRANSITIONS` lists every allowed move and
`LEGAL_RESUMES` where a delay may end; any other raises InvariantViolation. A
partition enters the fetcher TRUNCATING (it must first agree with the leader on
where its log ends), moves to FETCHING, and is DELAYED after an error until
`delayed_until_ms`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from clients.common.errors import check
from protos.highwater.v1 import common_pb2
from services.common import limits


class FetchPhase(enum.Enum):
    TRUNCATING = "truncating"
    FETCHING = "fetching"
    DELAYED = "delayed"


# Kafka's AbstractFetcherThread moves a partition Truncating -> Fetching once its log agrees
# with the leader's, and back to Truncating when it must agree again; a delay (Kafka's
# `delay` beside the state) interrupts either. No phase moves to itself: a partition is
# re-added as a new PartitionFetchState, a fetched append only advances fetch_offset, and a
# delayed partition is not delayed again (its resume phase would be lost, and with it the
# truncation still owed).
LEGAL_TRANSITIONS: dict[FetchPhase, frozenset[FetchPhase]] = {
    FetchPhase.TRUNCATING: frozenset({FetchPhase.FETCHING, FetchPhase.DELAYED}),
    FetchPhase.FETCHING: frozenset({FetchPhase.TRUNCATING, FetchPhase.DELAYED}),
    FetchPhase.DELAYED: frozenset({FetchPhase.TRUNCATING, FetchPhase.FETCHING}),
}

# Where a delay may end, by the phase the partition was delayed from. A partition that had
# not truncated yet must truncate after its delay: resuming it FETCHING would append the
# leader's records after divergent entries of its own (KIP-101). A FETCHING one resumes where
# it was (a whole RPC failed; Kafka keeps its Fetching state through the delay) or truncates
# again (its leader answered an error: the epoch may have moved).
LEGAL_RESUMES: dict[FetchPhase, frozenset[FetchPhase]] = {
    FetchPhase.TRUNCATING: frozenset({FetchPhase.TRUNCATING}),
    FetchPhase.FETCHING: frozenset({FetchPhase.FETCHING, FetchPhase.TRUNCATING}),
}


@dataclass
class PartitionFetchState:
    topic: str
    partition: int
    fetch_offset: int
    current_leader_epoch: int
    phase: FetchPhase = FetchPhase.TRUNCATING
    # The topic's id from LeaderAndIsr, sent with each Fetch so that the leader tells this topic
    # from a deleted one of the same name ("": unknown, not checked).
    topic_id: str = ""
    delayed_until_ms: int = 0
    # Where to go back to when a delay ends.
    resume_phase: FetchPhase = FetchPhase.TRUNCATING

    def move(self, phase: FetchPhase) -> None:
        check(
            phase in LEGAL_TRANSITIONS[self.phase],
            "illegal fetch transition %s -> %s for %s-%d",
            self.phase,
            phase,
            self.topic,
            self.partition,
        )
        self.phase = phase

    def delay(self, now_ms: int, backoff_ms: int, resume: FetchPhase) -> None:
        """Wait until now_ms + backoff_ms, then go on in `resume` (LEGAL_RESUMES says which).

        Raises InvariantViolation for a partition already delayed or an illegal resume."""
        delayed_from = self.phase
        self.move(FetchPhase.DELAYED)
        check(
            resume in LEGAL_RESUMES[delayed_from],
            "illegal fetch resume for %s-%d: delayed from %s, it may not resume %s",
            self.topic,
            self.partition,
            delayed_from,
            resume,
        )
        self.delayed_until_ms = now_ms + backoff_ms
        self.resume_phase = resume

    def ready(self, now_ms: int) -> bool:
        """Whether the partition can be worked on now (a due delay ends here)."""
        if self.phase is FetchPhase.DELAYED and now_ms >= self.delayed_until_ms:
            self.move(self.resume_phase)
        return self.phase is not FetchPhase.DELAYED


def backoff_after_error(error_code: int, backoff_ms: int) -> int:
    """How long a partition waits after a partition-level error from its leader.

    UNKNOWN_LEADER_EPOCH means the leader has not yet applied the LeaderAndIsr that this
    follower already has (the controller sent both at once): it will in milliseconds, so
    a full replica.fetch.backoff.ms would cost every failover that much.
    """
    if error_code == common_pb2.UNKNOWN_LEADER_EPOCH:
        return min(backoff_ms, limits.REPLICA_FETCH_EPOCH_RACE_BACKOFF_MS)
    return backoff_ms


def truncation_offset(
    *,
    local_leo: int,
    requested_epoch: int,
    leader_epoch: int,
    leader_end_offset: int,
    local_end_offset_for_leader_epoch: int,
) -> int:
    """Where a follower truncates after OffsetsForLeaderEpoch (KIP-101 / KIP-279).

    - The leader knows our latest epoch: truncate to min(its end offset for
      that epoch, our LEO).
    - The leader's answer is an older epoch (it never had ours): truncate to
      min(the leader's end offset, our own end offset for that older epoch),
      so divergent entries of epochs the leader never saw are removed.
    """
    if leader_epoch == requested_epoch:
        return min(leader_end_offset, local_leo)
    return min(leader_end_offset, local_end_offset_for_leader_epoch, local_leo)
