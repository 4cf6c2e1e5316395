"""The consumer-group history checker finds what it must (it is not a test that cannot fail)."""

from __future__ import annotations

from typing import Any

from tests.integration.group_history import Member, check

SESSION_MS = 3_000
P0 = ["t", 0]
PRODUCED = {("t", 0): {0: "a", 1: "b", 2: "c"}}


def ev(t: int, kind: str, **fields: Any) -> dict[str, Any]:
    return {"t": t, "ev": kind, **fields}


def handoff(close_ms: int = 2_000, taken_ms: int = 2_100) -> list[Member]:
    """m1 reads a, b; closes cleanly (commit, revoke); m2 takes over and reads c."""
    m1 = Member(
        "m1",
        [
            ev(0, "assigned", epoch=1, tps=[P0]),
            ev(10, "record", tp=P0, offset=0, value="a"),
            ev(11, "record", tp=P0, offset=1, value="b"),
            ev(12, "commit", offsets=[["t", 0, 2]]),
            ev(close_ms, "revoked", tps=[P0]),
            ev(close_ms + 1, "closed"),
        ],
        close_started_ms=close_ms,
    )
    m2 = Member(
        "m2",
        [ev(taken_ms, "assigned", epoch=2, tps=[P0]), ev(taken_ms + 5, "record", tp=P0, offset=2, value="c")],
    )
    return [m1, m2]


def test_a_clean_handoff_passes() -> None:
    assert check(PRODUCED, handoff(), session_timeout_ms=SESSION_MS) == []


def test_a_record_nobody_processed_is_found() -> None:
    members = handoff()
    members[1].events.pop()  # m2 never read "c"
    assert any("never processed" in p for p in check(PRODUCED, members, session_timeout_ms=SESSION_MS))


def test_a_wrong_value_is_found() -> None:
    members = handoff()
    members[1].events[-1]["value"] = "x"
    assert any("the producer wrote" in p for p in check(PRODUCED, members, session_timeout_ms=SESSION_MS))


def test_two_live_members_processing_one_record_is_found() -> None:
    members = handoff()
    members[1].events.append(ev(2_200, "record", tp=P0, offset=1, value="b"))  # m1 had committed past it
    problems = check(PRODUCED, members, session_timeout_ms=SESSION_MS)
    assert any("more than one live member" in p for p in problems)


def test_overlapping_owners_are_found() -> None:
    members = handoff(close_ms=2_000, taken_ms=1_500)  # m2 took it before m1 gave it up
    assert any("at once" in p for p in check(PRODUCED, members, session_timeout_ms=SESSION_MS))


def test_a_slow_takeover_after_a_clean_leave_is_found() -> None:
    members = handoff(close_ms=2_000, taken_ms=3_500)
    assert any("after m1's clean leave" in p for p in check(PRODUCED, members, session_timeout_ms=SESSION_MS))


def crash(killed_ms: int, taken_ms: int) -> list[Member]:
    """m1 reads a, b, c, commits only past a, and is killed; m2 reads b, c again."""
    m1 = Member(
        "m1",
        [
            ev(0, "assigned", epoch=1, tps=[P0]),
            ev(10, "record", tp=P0, offset=0, value="a"),
            ev(11, "commit", offsets=[["t", 0, 1]]),
            ev(12, "record", tp=P0, offset=1, value="b"),
            ev(13, "record", tp=P0, offset=2, value="c"),
        ],
        died_ms=killed_ms,
    )
    m2 = Member(
        "m2",
        [
            ev(taken_ms, "assigned", epoch=3, tps=[P0]),
            ev(taken_ms + 1, "record", tp=P0, offset=1, value="b"),
            ev(taken_ms + 2, "record", tp=P0, offset=2, value="c"),
        ],
    )
    return [m1, m2]


def test_duplicates_from_a_dead_members_uncommitted_window_pass() -> None:
    assert check(PRODUCED, crash(1_000, 1_000 + SESSION_MS + 500), session_timeout_ms=SESSION_MS) == []


def test_a_takeover_later_than_the_session_and_a_second_is_found() -> None:
    problems = check(PRODUCED, crash(1_000, 1_000 + SESSION_MS + 1_500), session_timeout_ms=SESSION_MS)
    assert any("after m1's crash" in p for p in problems)


def test_reprocessing_what_a_dead_member_had_committed_is_found() -> None:
    members = crash(1_000, 1_000 + SESSION_MS)
    members[0].events.insert(4, ev(14, "commit", offsets=[["t", 0, 3]]))  # m1 committed past c
    problems = check(PRODUCED, members, session_timeout_ms=SESSION_MS)
    assert any("more than one live member" in p for p in problems)


def pause(zombie_commit: str) -> list[Member]:
    """m1 is paused at 1,000 past its session, resumes at 6,000, reads and commits as a zombie."""
    m1 = Member(
        "m1",
        [
            ev(0, "assigned", epoch=1, tps=[P0]),
            ev(10, "record", tp=P0, offset=0, value="a"),
            ev(11, "commit", offsets=[["t", 0, 1]]),
            ev(6_001, "record", tp=P0, offset=1, value="b"),
            ev(6_002, zombie_commit, error="UNKNOWN_MEMBER_ID", offsets=[["t", 0, 2]]),
            ev(6_003, "lost", tps=[P0]),
        ],
        died_ms=1_000,
        paused=True,
        resumed_ms=6_000,
    )
    m2 = Member(
        "m2",
        [
            ev(4_500, "assigned", epoch=3, tps=[P0]),
            ev(4_501, "record", tp=P0, offset=1, value="b"),
            ev(4_502, "record", tp=P0, offset=2, value="c"),
        ],
    )
    return [m1, m2]


def test_a_fenced_zombie_passes() -> None:
    assert check(PRODUCED, pause("commit_refused"), session_timeout_ms=SESSION_MS) == []


def test_a_zombie_whose_commit_was_accepted_is_found() -> None:
    problems = check(PRODUCED, pause("commit"), session_timeout_ms=SESSION_MS)
    assert any("committed after it resumed" in p for p in problems)
