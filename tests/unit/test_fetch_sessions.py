"""Kafka's incremental fetch sessions (KIP-227), the pure rules (services/kafka/fetch_sessions.py).

Each test follows one of KIP-227's sentences or FetchSession.scala's rules: a full Fetch opens a
session, an incremental one answers only what changed, a wrong epoch or id is refused, forgotten
partitions leave, and a full cache evicts by Kafka's order (stale first, then the least valuable
session that has lived long enough, never one worth more than the newcomer).
"""

from __future__ import annotations

import asyncio
import datetime
import random
from collections.abc import Mapping
from typing import Any, cast

from protos.highwater.v1 import common_pb2
from services.kafka import protocol
from services.kafka.acl_rules import ConnectionAccess
from services.kafka.fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    FetchSessionCache,
    FullContext,
    IncrementalContext,
    PartitionAnswer,
    PartitionKey,
    PartitionRequest,
    SessionError,
    SessionErrorContext,
    SessionlessContext,
    next_epoch,
    without_sessions,
)
from services.kafka.handler import KafkaHandler
from services.security.authz import AclBinding, Authorizer
from services.security.identity import certificate_caller
from tests.unit.test_kafka_protocol import FakeBackend, module_of, request_frame

EVICTION_MS = 120_000
A, B, C = ("t", 0), ("t", 1), ("u", 0)


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 1_000

    def monotonic_ms(self) -> int:
        return self.now_ms


def make_cache(
    clock: FakeClock, *, slots: int = 10, session_partitions_max: int = 100, partitions_max: int = 1_000
) -> FetchSessionCache:
    return FetchSessionCache(
        clock,
        slots=slots,
        eviction_ms=EVICTION_MS,
        session_partitions_max=session_partitions_max,
        partitions_max=partitions_max,
        rng=random.Random(7),
    )


def asked(offset: int = 0) -> PartitionRequest:
    return PartitionRequest(
        fetch_offset=offset, log_start_offset=-1, max_bytes=1 << 20, current_leader_epoch=3
    )


def answer(
    hw: int = 10, *, records: bool = False, log_start: int = 0, error: bool = False
) -> PartitionAnswer:
    return PartitionAnswer(
        has_records=records,
        high_watermark=hw,
        last_stable_offset=hw,
        log_start_offset=log_start,
        has_error=error,
    )


def requests(*keys: PartitionKey) -> dict[PartitionKey, PartitionRequest]:
    return {k: asked() for k in keys}


def open_session(cache: FetchSessionCache, *keys: PartitionKey, privileged: bool = False) -> int:
    """A full Fetch with epoch 0 over keys, every partition answered at HW 10; the new session id."""
    context = cache.new_context(INVALID_SESSION_ID, INITIAL_EPOCH, requests(*keys), [], privileged=privileged)
    assert isinstance(context, FullContext)
    return context.respond({k: answer() for k in keys}).session_id


def incremental(
    cache: FetchSessionCache,
    session_id: int,
    epoch: int,
    answers: Mapping[PartitionKey, PartitionAnswer] | None = None,
    *,
    fetch_data: Mapping[PartitionKey, PartitionRequest] | None = None,
    forgotten: tuple[PartitionKey, ...] = (),
) -> tuple[list[PartitionKey], tuple[PartitionKey, ...]]:
    """One incremental Fetch: (the partitions read, the partitions answered)."""
    context = cache.new_context(session_id, epoch, fetch_data or {}, forgotten)
    assert isinstance(context, IncrementalContext), context
    read = [k for k, _ in context.partitions()]
    result = context.respond(answers if answers is not None else {k: answer() for k in read})
    assert result.error is None and result.session_id == session_id
    return read, result.partitions


def test_a_full_fetch_opens_a_session_and_the_next_one_answers_only_what_changed() -> None:
    cache = make_cache(FakeClock())
    session_id = open_session(cache, A, B, C)
    assert session_id != INVALID_SESSION_ID
    assert (cache.size, cache.partitions_cached) == (1, 3)

    # Epoch 1 lists nothing: every cached partition is read with what the full Fetch asked.
    context = cache.new_context(session_id, 1, {}, [])
    assert isinstance(context, IncrementalContext)
    assert context.partitions() == [(A, asked()), (B, asked()), (C, asked())]
    result = context.respond({A: answer(records=True), B: answer(), C: answer()})
    assert (result.error, result.session_id, result.partitions) == (None, session_id, (A,))

    # Epoch 2 moves A's fetch offset; only A's request changes in the session.
    context = cache.new_context(session_id, 2, {A: asked(offset=7)}, [])
    assert isinstance(context, IncrementalContext)
    assert dict(context.partitions())[A].fetch_offset == 7
    assert dict(context.partitions())[B].fetch_offset == 0
    assert context.respond({A: answer(), B: answer(), C: answer()}).partitions == ()


def test_only_partitions_with_records_a_moved_offset_or_an_error_are_answered() -> None:
    cache = make_cache(FakeClock())
    session_id = open_session(cache, A, B, C)
    changed = {A: answer(hw=11), B: answer(log_start=4), C: answer()}
    assert incremental(cache, session_id, 1, changed)[1] == (A, B), "HW and log start moves are sent"
    assert incremental(cache, session_id, 2, changed)[1] == (), "the same again is news to nobody"
    # An error is always sent; the error's answer then forgets the last-sent HW, so the next good
    # answer is sent even at the HW the fetcher had before the error.
    failed = {A: answer(hw=-1, log_start=-1, error=True), B: answer(log_start=4), C: answer()}
    assert incremental(cache, session_id, 3, failed)[1] == (A,)
    assert incremental(cache, session_id, 4, failed)[1] == (A,), "still failing: still sent"
    assert incremental(cache, session_id, 5, changed)[1] == (A,), "recovered: sent again"
    assert incremental(cache, session_id, 6, changed)[1] == ()


def test_a_partition_answered_with_records_is_read_last_next_time() -> None:
    cache = make_cache(FakeClock())
    session_id = open_session(cache, A, B, C)
    read, _ = incremental(cache, session_id, 1, {A: answer(records=True), B: answer(), C: answer()})
    assert read == [A, B, C]
    read, _ = incremental(cache, session_id, 2)
    assert read == [B, C, A], "the others come first within the next Fetch's max_bytes"


def test_a_wrong_epoch_is_refused_and_the_session_kept() -> None:
    cache = make_cache(FakeClock())
    session_id = open_session(cache, A, B)
    for stale in (2, 7):
        context = cache.new_context(session_id, stale, {}, [])
        assert isinstance(context, SessionErrorContext)
        refused = context.respond({})
        assert (refused.error, refused.session_id, refused.partitions) == (
            SessionError.INVALID_FETCH_SESSION_EPOCH,
            INVALID_SESSION_ID,
            (),
        )
        assert context.partitions() == (), "nothing is read for a refused Fetch"
    incremental(cache, session_id, 1)  # the right epoch still works
    assert isinstance(cache.new_context(session_id, 1, {}, []), SessionErrorContext), "1 was used up"


def test_two_fetches_of_one_session_in_flight_the_first_answered_loses() -> None:
    """Kafka's "possible duplicate request": the epoch is checked again when the answer is made."""
    cache = make_cache(FakeClock())
    session_id = open_session(cache, A)
    first = cache.new_context(session_id, 1, {}, [])
    second = cache.new_context(session_id, 2, {}, [])
    assert isinstance(first, IncrementalContext) and isinstance(second, IncrementalContext)
    late = first.respond({A: answer(records=True)})
    assert (late.error, late.session_id, late.partitions) == (
        SessionError.INVALID_FETCH_SESSION_EPOCH,
        session_id,
        (),
    )
    assert second.respond({A: answer(records=True)}).partitions == (A,)


def test_an_unknown_session_id_is_not_found() -> None:
    cache = make_cache(FakeClock())
    open_session(cache, A)
    context = cache.new_context(424242, 1, requests(B), [])
    assert isinstance(context, SessionErrorContext)
    assert context.respond({}).error is SessionError.FETCH_SESSION_ID_NOT_FOUND
    assert cache.partitions_cached == 1, "nothing was added to any session"


def test_forgotten_partitions_leave_the_session_and_the_last_one_closes_it() -> None:
    cache = make_cache(FakeClock())
    session_id = open_session(cache, A, B)
    read, _ = incremental(cache, session_id, 1, fetch_data=requests(C), forgotten=(A,))
    assert read == [B, C]
    assert cache.partitions_cached == 2
    context = cache.new_context(session_id, 2, {}, [B, C, ("never", 9)])
    assert isinstance(context, SessionlessContext), "an empty session is closed"
    assert context.respond({}).session_id == INVALID_SESSION_ID
    assert (cache.size, cache.partitions_cached) == (0, 0)


def test_full_fetches_close_the_session_they_name() -> None:
    cache = make_cache(FakeClock())
    session_id = open_session(cache, A)
    again = cache.new_context(session_id, INITIAL_EPOCH, requests(A, B), [])
    assert isinstance(again, FullContext) and cache.get(session_id) is None
    new_id = again.respond({A: answer(), B: answer()}).session_id
    assert new_id not in (INVALID_SESSION_ID, session_id)
    sessionless = cache.new_context(new_id, FINAL_EPOCH, requests(A), [])
    assert isinstance(sessionless, SessionlessContext)
    result = sessionless.respond({A: answer()})
    assert (result.session_id, result.partitions) == (INVALID_SESSION_ID, (A,))
    assert cache.size == 0


def test_a_full_cache_evicts_by_kafkas_rules() -> None:
    clock = FakeClock()
    cache = make_cache(clock, slots=2)
    small = open_session(cache, A)
    large = open_session(cache, A, B, C)
    # Young sessions are not evictable by a consumer's: the newcomer goes without a session.
    assert open_session(cache, A, B) == INVALID_SESSION_ID
    assert cache.evictions == 0

    # Both have lived past eviction_ms and are in use: the least valuable goes, if the newcomer is
    # worth more (more partitions); one of equal size is not.
    clock.now_ms += EVICTION_MS + 1
    incremental(cache, small, 1)
    incremental(cache, large, 1)
    assert open_session(cache, C) == INVALID_SESSION_ID, "equal in size: not worth more"
    newcomer = open_session(cache, A, B)
    assert newcomer != INVALID_SESSION_ID
    assert cache.get(small) is None and cache.get(large) is not None
    assert (cache.evictions, cache.size, cache.partitions_cached) == (1, 2, 5)

    # A session unused for eviction_ms goes first, whatever its size.
    clock.now_ms += EVICTION_MS // 2
    incremental(cache, newcomer, 1)
    clock.now_ms += EVICTION_MS // 2 + 1
    assert open_session(cache, A) != INVALID_SESSION_ID
    assert cache.get(large) is None and cache.get(newcomer) is not None
    assert cache.evictions == 2


def test_a_privileged_session_evicts_a_young_consumers_but_not_the_reverse() -> None:
    clock = FakeClock()
    cache = make_cache(clock, slots=1)
    consumer = open_session(cache, A, B, C)
    follower = open_session(cache, A, privileged=True)
    assert follower != INVALID_SESSION_ID and cache.get(consumer) is None
    assert open_session(cache, A, B, C) == INVALID_SESSION_ID, "a young follower's session stays"
    assert cache.evictions == 1


def test_sessions_and_their_partitions_are_bounded() -> None:
    cache = make_cache(FakeClock(), session_partitions_max=3, partitions_max=4)
    assert open_session(cache, A, B, C, ("u", 1)) == INVALID_SESSION_ID, "over the per-session bound"
    session_id = open_session(cache, A, B)
    context = cache.new_context(session_id, 1, requests(C, ("u", 1)), [])
    assert isinstance(context, SessionErrorContext)
    assert context.respond({}).error is SessionError.FETCH_SESSION_ID_NOT_FOUND
    assert (cache.size, cache.partitions_cached) == (0, 0), "the session over its bound was closed"
    open_session(cache, A, B, C)
    assert open_session(cache, A, B) == INVALID_SESSION_ID, "over the cache's partitions, none evictable"


def test_without_sessions_every_full_fetch_is_sessionless() -> None:
    cache = without_sessions()
    assert open_session(cache, A) == INVALID_SESSION_ID
    context = cache.new_context(5, 1, {}, [])
    assert isinstance(context, SessionErrorContext)
    assert context.error is SessionError.FETCH_SESSION_ID_NOT_FOUND


def test_epochs_count_up_and_wrap_to_one() -> None:
    assert next_epoch(INITIAL_EPOCH) == 1
    assert next_epoch(41) == 42
    assert next_epoch(2**31 - 1) == 1
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH


# ---- through the handler (services/kafka/handler.py, fake backend) -----------------------------


class EchoBackend(FakeBackend):
    """test_kafka_protocol's fake backend (only what the handler uses), answering every asked
    partition at its high watermark in `hw` (0 if absent), without records."""

    def __init__(self) -> None:
        super().__init__()
        self.hw: dict[PartitionKey, int] = {}

    async def fetch(self, req: common_pb2.FetchRequest) -> common_pb2.FetchResponse:
        self.fetched.append(req)
        resp = common_pb2.FetchResponse()
        for t in req.topics:
            out = resp.topics.add(topic=t.topic)
            for p in t.partitions:
                out.partitions.add(
                    partition=p.partition, high_watermark=self.hw.get((t.topic, p.partition), 0)
                )
        return resp


def fetch_v12(handler: KafkaHandler, session_id: int, epoch: int, *keys: PartitionKey) -> Any:
    cls = protocol.request_class(protocol.FETCH, 12)
    mod = module_of(cls)
    topics = sorted({k[0] for k in keys})
    body = cls(
        max_wait=datetime.timedelta(0),
        min_bytes=0,
        session_id=session_id,
        session_epoch=epoch,
        topics=tuple(
            mod.FetchTopic(
                topic=t,
                partitions=tuple(
                    mod.FetchPartition(partition=p, fetch_offset=0, partition_max_bytes=100)
                    for tt, p in keys
                    if tt == t
                ),
            )
            for t in topics
        ),
        forgotten_topics_data=(),
    )
    return asyncio.run(handler.handle(protocol.decode_request(request_frame(protocol.FETCH, 12, body))))


def answered(answer: Any) -> dict[PartitionKey, int]:
    """{(topic, partition): error code} of a Fetch answer."""
    return {(t.topic, p.partition_index): int(p.error_code) for t in answer.responses for p in t.partitions}


def asked_of(req: common_pb2.FetchRequest) -> list[PartitionKey]:
    return [(t.topic, p.partition) for t in req.topics for p in t.partitions]


def test_the_handler_reads_the_whole_session_and_answers_what_changed() -> None:
    backend = EchoBackend()
    handler = KafkaHandler(cast(Any, backend), fetch_session_cache=make_cache(FakeClock()))
    full = fetch_v12(handler, INVALID_SESSION_ID, INITIAL_EPOCH, A, B, C)
    assert full.session_id != INVALID_SESSION_ID and answered(full) == {A: 0, B: 0, C: 0}

    backend.hw[B] = 3
    incremental_answer = fetch_v12(handler, full.session_id, 1)
    assert asked_of(backend.fetched[-1]) == [A, B, C], "the request listed none; the session all"
    assert (incremental_answer.session_id, answered(incremental_answer)) == (full.session_id, {B: 0})
    assert answered(fetch_v12(handler, full.session_id, 2)) == {}

    stale = fetch_v12(handler, full.session_id, 2)
    assert (int(stale.error_code), stale.responses) == (71, ()), "INVALID_FETCH_SESSION_EPOCH"
    assert int(fetch_v12(handler, 99, 1).error_code) == 70, "FETCH_SESSION_ID_NOT_FOUND"


def test_an_incremental_fetch_checks_read_acls_on_every_topic_of_its_session() -> None:
    backend = EchoBackend()
    acls = [
        AclBinding.of("User:alice", "Read", "Topic", "t"),
        AclBinding.of("User:alice", "Read", "Topic", "u"),
    ]
    snapshot = [Authorizer(acls)]
    alice = ConnectionAccess(certificate_caller("alice"), lambda: snapshot[0])
    handler = KafkaHandler(cast(Any, backend), fetch_session_cache=make_cache(FakeClock())).for_connection(
        alice
    )
    full = fetch_v12(handler, INVALID_SESSION_ID, INITIAL_EPOCH, A, C)
    assert answered(full) == {A: 0, C: 0}

    snapshot[0] = Authorizer(acls[:1])  # Read on u revoked; the next Fetch lists no topic at all
    revoked = fetch_v12(handler, full.session_id, 1)
    assert answered(revoked) == {C: 29}, "TOPIC_AUTHORIZATION_FAILED for the session's u"
    assert asked_of(backend.fetched[-1]) == [A], "u is not read"
