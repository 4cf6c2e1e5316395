"""Kafka's incremental fetch sessions (KIP-227): the session cache and each Fetch's context. Pure.

A consumer that fetches many partitions need not list them all in every Fetch. Its first Fetch
to a broker is a full one with session epoch 0 (INITIAL_EPOCH): the broker answers every
partition and, if the cache has room, a new session id. Each later Fetch names that id and the
next epoch (1, 2, ...) and lists only the partitions whose fetch offset or bounds changed, or
that it adds; `forgotten_topics_data` lists those it drops. The broker keeps the rest from the
session and answers only the partitions with something new: records, a moved high watermark,
last stable offset or log start offset, or an error. Epoch -1 (FINAL_EPOCH) asks for a full
Fetch without a session (librdkafka and kafkajs always send it). An incremental Fetch naming
an id the cache does not hold is answered FETCH_SESSION_ID_NOT_FOUND, one with another epoch
than the session's INVALID_FETCH_SESSION_EPOCH; either way the client starts again with a full
Fetch.

Kafka's rules (FetchSession.scala) as we keep them:
- The cache holds at most `slots` sessions (max.incremental.fetch.session.cache.slots). A new
  session takes a free slot, or one of a session evicted for it: first the least recently used
  session if it went unused for `eviction_ms`; else the least valuable evictable session if the
  new one is worth more. Value orders by (privileged, partitions, id): a follower's session
  (privileged) outranks any consumer's, a larger one a smaller one. A consumer's session is
  evictable once it has lived `eviction_ms`, and by a privileged one at once; a privileged one
  only after `eviction_ms`. Our followers replicate over gRPC, so every session here is a
  consumer's, but the rule is kept whole.
- A partition answered with records moves to the end of its session's order, so the next
  Fetch, read in that order within max_bytes, serves the others first.
- After an error the partition's last-sent high watermark is forgotten (-1): it is answered
  again when the error clears.

Beyond Kafka (which bounds neither): a session holds at most `session_partitions_max`
partitions and the cache `partitions_max` over all sessions. A full Fetch over either is served
without a session; an incremental one that would pass them closes its session and is answered
FETCH_SESSION_ID_NOT_FOUND, so the client falls back to full Fetches.

No I/O and no clock of its own: the clock is injected (`MonotonicClock`), and so is the random
source of session ids. Owned by the broker's event loop (the Kafka handler); contexts hold
their session between the Fetch's arrival and its answer, and the epoch check at the answer
catches a second Fetch of the same session answered in between (Kafka's "possible duplicate
request").
"""

from __future__ import annotations

import enum
import random
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from clients.common.errors import InvariantViolation
from services.common import limits

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0  # a full Fetch that opens a new session
FINAL_EPOCH = -1  # a full Fetch without a session (or one that closes its session)
_EPOCH_MAX = 2**31 - 1  # an int32 on the wire; the epoch after it is 1

PartitionKey = tuple[str, int]  # (topic, partition)


def next_epoch(epoch: int) -> int:
    """The epoch a session expects after `epoch` (Kafka's FetchMetadata.nextEpoch)."""
    if epoch < 0:
        return FINAL_EPOCH
    if epoch == _EPOCH_MAX:
        return 1
    return epoch + 1


class MonotonicClock(Protocol):
    def monotonic_ms(self) -> int: ...


class SessionError(enum.Enum):
    """A Fetch whose session fields cannot be served: answered with this top-level error and no
    partitions; the client's next Fetch is a full one."""

    FETCH_SESSION_ID_NOT_FOUND = "FETCH_SESSION_ID_NOT_FOUND"
    INVALID_FETCH_SESSION_EPOCH = "INVALID_FETCH_SESSION_EPOCH"


@dataclass(slots=True)
class PartitionRequest:
    """What a fetcher asked of one partition; a session keeps it for the Fetches that omit it."""

    fetch_offset: int
    log_start_offset: int  # the fetcher's (-1 for consumers)
    max_bytes: int
    current_leader_epoch: int


@dataclass(frozen=True, slots=True)
class PartitionAnswer:
    """What one partition's answer holds, as far as deciding whether to send it goes."""

    has_records: bool
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    has_error: bool


@dataclass(slots=True)
class CachedPartition:
    """A partition of a session: its last request and what the fetcher was last sent of it."""

    request: PartitionRequest
    high_watermark: int = -1  # last sent; -1: never, or an error since
    last_stable_offset: int = -1
    log_start_offset: int = -1  # the leader's, last sent

    def must_answer(self, answer: PartitionAnswer, *, record: bool) -> bool:
        """Whether an incremental answer carries this partition; with record, remember what it sends."""
        changed = (
            answer.has_records
            or answer.has_error
            or answer.high_watermark != self.high_watermark
            or answer.last_stable_offset != self.last_stable_offset
            or answer.log_start_offset != self.log_start_offset
        )
        if record:
            # After an error, -1 makes the partition's next good answer differ and be sent.
            self.high_watermark = -1 if answer.has_error else answer.high_watermark
            self.last_stable_offset = answer.last_stable_offset
            self.log_start_offset = answer.log_start_offset
        return changed


class FetchSession:
    """One fetcher's session. `partitions` is ordered: the order its Fetches are read in."""

    __slots__ = ("counted_size", "creation_ms", "epoch", "id", "last_used_ms", "partitions", "privileged")

    def __init__(
        self,
        session_id: int,
        privileged: bool,
        partitions: OrderedDict[PartitionKey, CachedPartition],
        now_ms: int,
    ) -> None:
        self.id = session_id
        self.privileged = privileged
        self.creation_ms = now_ms
        self.last_used_ms = now_ms
        self.epoch = next_epoch(INITIAL_EPOCH)
        self.partitions = partitions
        self.counted_size = 0  # the size the cache's partition count holds for it

    def eviction_key(self) -> tuple[bool, int, int]:
        """Kafka's EvictableKey: the smallest is evicted first."""
        return (self.privileged, len(self.partitions), self.id)


@dataclass(frozen=True, slots=True)
class SessionAnswer:
    """How to answer a Fetch: its top-level error (None: NONE), the session id to return, and
    the partitions the answer carries, in order."""

    error: SessionError | None
    session_id: int
    partitions: tuple[PartitionKey, ...]


class FetchSessionCache:
    """Every fetch session of one broker, bounded (module docstring: Kafka's eviction rules).

    The counts are Kafka's metrics: `size` (NumIncrementalFetchSessions), `partitions_cached`
    (NumIncrementalFetchPartitionsCached) and `evictions` (IncrementalFetchSessionEvictionsPerSec,
    as a running total).
    """

    def __init__(
        self,
        clock: MonotonicClock,
        *,
        slots: int,
        eviction_ms: int,
        session_partitions_max: int,
        partitions_max: int,
        rng: random.Random | None = None,
    ) -> None:
        if (
            slots < 0
            or eviction_ms < 0
            or session_partitions_max < 1
            or partitions_max < session_partitions_max
        ):
            raise ValueError(
                f"fetch session cache bounds: slots={slots} eviction_ms={eviction_ms} "
                f"session_partitions_max={session_partitions_max} partitions_max={partitions_max} "
                "(need slots >= 0, eviction_ms >= 0, 1 <= session_partitions_max <= partitions_max)"
            )
        self.clock = clock
        self.slots = slots
        self.eviction_ms = eviction_ms
        self.session_partitions_max = session_partitions_max
        self.partitions_max = partitions_max
        self._rng = rng or random.Random()
        # Least recently used first: a touch moves a session to the end (the clock is monotonic).
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self.partitions_cached = 0
        self.evictions = 0

    @property
    def size(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    # ---- a Fetch's context -----------------------------------------------------------------

    def new_context(
        self,
        session_id: int,
        epoch: int,
        fetch_data: Mapping[PartitionKey, PartitionRequest],
        forgotten: Iterable[PartitionKey],
        *,
        privileged: bool = False,
    ) -> FetchContext:
        """The context of one Fetch from its session fields (Kafka's FetchManager.newContext).

        fetch_data: the partitions the Fetch lists, in its order. A full Fetch (epoch 0 or -1)
        closes any session it names first."""
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID:
                self.remove(session_id)
            if epoch == FINAL_EPOCH:
                return SessionlessContext(fetch_data)
            return FullContext(self, fetch_data, privileged)
        session = self._sessions.get(session_id)
        if session is None:
            return SessionErrorContext(SessionError.FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != epoch:
            return SessionErrorContext(SessionError.INVALID_FETCH_SESSION_EPOCH)
        added = sum(1 for key in fetch_data if key not in session.partitions)
        size_after_at_most = len(session.partitions) + added
        if size_after_at_most > self.session_partitions_max or (
            self.partitions_cached + added > self.partitions_max
        ):
            # Past a bound: the session goes, and the client's next Fetch is a full one (served
            # without a session while it stays over).
            self.remove(session_id)
            return SessionErrorContext(SessionError.FETCH_SESSION_ID_NOT_FOUND)
        for key, request in fetch_data.items():
            cached = session.partitions.get(key)
            if cached is None:
                session.partitions[key] = CachedPartition(request)
            else:
                cached.request = request
        for key in forgotten:
            session.partitions.pop(key, None)
        if not session.partitions:
            self.remove(session_id)
            return SessionlessContext(fetch_data)
        self._touch(session, self.clock.monotonic_ms())
        session.epoch = next_epoch(session.epoch)
        return IncrementalContext(session, epoch)

    # ---- the cache -------------------------------------------------------------------------

    def maybe_create(self, privileged: bool, partitions: OrderedDict[PartitionKey, CachedPartition]) -> int:
        """A new session holding `partitions`, or INVALID_SESSION_ID when there is no room for it
        (Kafka's maybeCreateSession)."""
        size = len(partitions)
        if size > self.session_partitions_max or size > self.partitions_max:
            return INVALID_SESSION_ID
        now_ms = self.clock.monotonic_ms()
        if len(self._sessions) >= self.slots and not self._evict_for(privileged, size, now_ms):
            return INVALID_SESSION_ID
        # Room in slots; make room in partitions from the least recently used, as for a slot.
        while self.partitions_cached + size > self.partitions_max:
            if not self._evict_for(privileged, size, now_ms):
                return INVALID_SESSION_ID
        session = FetchSession(self._new_session_id(), privileged, partitions, now_ms)
        self._sessions[session.id] = session
        self._touch(session, now_ms)
        return session.id

    def remove(self, session_id: int) -> FetchSession | None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self.partitions_cached -= session.counted_size
            session.counted_size = 0
        return session

    def _touch(self, session: FetchSession, now_ms: int) -> None:
        session.last_used_ms = now_ms
        self._sessions.move_to_end(session.id)
        self.partitions_cached += len(session.partitions) - session.counted_size
        session.counted_size = len(session.partitions)

    def _evict_for(self, privileged: bool, size: int, now_ms: int) -> bool:
        """Evict one session for a new one of this kind and size; False if none may go
        (Kafka's tryEvict)."""
        if not self._sessions:
            return False
        oldest = next(iter(self._sessions.values()))
        if now_ms - oldest.last_used_ms > self.eviction_ms:
            victim = oldest
        else:
            candidates = [s for s in self._sessions.values() if self._evictable(s, privileged, now_ms)]
            if not candidates:
                return False
            victim = min(candidates, key=FetchSession.eviction_key)
            # The new session's key has id 0: it must be worth strictly more than the victim.
            if (privileged, size, 0) < victim.eviction_key():
                return False
        self.remove(victim.id)
        self.evictions += 1
        return True

    def _evictable(self, session: FetchSession, by_privileged: bool, now_ms: int) -> bool:
        lived_long_enough = now_ms - session.creation_ms > self.eviction_ms
        if by_privileged:
            return not session.privileged or lived_long_enough
        return lived_long_enough

    def _new_session_id(self) -> int:
        while True:
            session_id = self._rng.randint(1, _EPOCH_MAX - 1)
            if session_id not in self._sessions:
                return session_id


# ---- contexts: what one Fetch reads and how it is answered ------------------------------------


class FetchContext(Protocol):
    def partitions(self) -> Sequence[tuple[PartitionKey, PartitionRequest]]:
        """The partitions to read, in order."""
        ...

    def respond(self, answers: Mapping[PartitionKey, PartitionAnswer]) -> SessionAnswer:
        """How to answer, given what each partition read (`answers`, in reading order)."""
        ...


class SessionErrorContext:
    """A Fetch whose session fields are wrong: nothing is read."""

    def __init__(self, error: SessionError) -> None:
        self.error = error

    def partitions(self) -> Sequence[tuple[PartitionKey, PartitionRequest]]:
        return ()

    def respond(self, answers: Mapping[PartitionKey, PartitionAnswer]) -> SessionAnswer:
        return SessionAnswer(self.error, INVALID_SESSION_ID, ())


class SessionlessContext:
    """A full Fetch without a session: every partition it lists is answered."""

    def __init__(self, fetch_data: Mapping[PartitionKey, PartitionRequest]) -> None:
        self.fetch_data = fetch_data

    def partitions(self) -> Sequence[tuple[PartitionKey, PartitionRequest]]:
        return list(self.fetch_data.items())

    def respond(self, answers: Mapping[PartitionKey, PartitionAnswer]) -> SessionAnswer:
        return SessionAnswer(None, INVALID_SESSION_ID, tuple(answers))


class FullContext:
    """A full Fetch that asks for a new session: every partition is answered, and the session,
    if the cache makes room for it, starts from what this answer sends."""

    def __init__(
        self, cache: FetchSessionCache, fetch_data: Mapping[PartitionKey, PartitionRequest], privileged: bool
    ) -> None:
        self.cache = cache
        self.fetch_data = fetch_data
        self.privileged = privileged

    def partitions(self) -> Sequence[tuple[PartitionKey, PartitionRequest]]:
        return list(self.fetch_data.items())

    def respond(self, answers: Mapping[PartitionKey, PartitionAnswer]) -> SessionAnswer:
        cached: OrderedDict[PartitionKey, CachedPartition] = OrderedDict()
        for key, answer in answers.items():
            part = CachedPartition(self.fetch_data[key])
            part.must_answer(answer, record=True)
            cached[key] = part
        session_id = self.cache.maybe_create(self.privileged, cached)
        return SessionAnswer(None, session_id, tuple(answers))


class IncrementalContext:
    """An incremental Fetch: every partition of the session is read, the changed ones answered."""

    def __init__(self, session: FetchSession, request_epoch: int) -> None:
        self.session = session
        self.request_epoch = request_epoch

    def partitions(self) -> Sequence[tuple[PartitionKey, PartitionRequest]]:
        return [(key, part.request) for key, part in self.session.partitions.items()]

    def respond(self, answers: Mapping[PartitionKey, PartitionAnswer]) -> SessionAnswer:
        session = self.session
        if session.epoch != next_epoch(self.request_epoch):
            # Another Fetch of this session was taken while this one read: its answer would
            # disagree with what the session now remembers.
            return SessionAnswer(SessionError.INVALID_FETCH_SESSION_EPOCH, session.id, ())
        sent: list[PartitionKey] = []
        for key, answer in answers.items():
            part = session.partitions.get(key)
            if part is None:
                # Only a Fetch of this session changes its partitions, and the epoch says none did.
                raise InvariantViolation(
                    f"fetch session {session.id} epoch {session.epoch}: an answer for {key}, not in it"
                )
            if part.must_answer(answer, record=True):
                sent.append(key)
                if answer.has_records:
                    session.partitions.move_to_end(key)
        return SessionAnswer(None, session.id, tuple(sent))


def broker_cache(clock: MonotonicClock, rng: random.Random | None = None) -> FetchSessionCache:
    """One broker's cache, with the bounds of services/common/limits.py."""
    return FetchSessionCache(
        clock,
        slots=limits.KAFKA_FETCH_SESSION_CACHE_SLOTS,
        eviction_ms=limits.KAFKA_FETCH_SESSION_EVICTION_MS,
        session_partitions_max=limits.KAFKA_FETCH_SESSION_PARTITIONS_MAX,
        partitions_max=limits.KAFKA_FETCH_SESSION_CACHE_PARTITIONS_MAX,
        rng=rng,
    )


class _NoClock:
    def monotonic_ms(self) -> int:
        return 0  # read only when a session is made or used, and this cache has no slot for one


def without_sessions() -> FetchSessionCache:
    """A cache with no slot: every full Fetch is served without a session, every incremental
    one FETCH_SESSION_ID_NOT_FOUND (a handler outside a broker, in unit tests)."""
    return FetchSessionCache(_NoClock(), slots=0, eviction_ms=0, session_partitions_max=1, partitions_max=1)
