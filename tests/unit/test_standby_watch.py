"""The standby controller's decision on its stream to the active one (standby_watch.BrokenLink)."""

from __future__ import annotations

from services.controller.standby_watch import BrokenLink


def test_unreachable_for_the_whole_grace_period_is_due_once() -> None:
    link = BrokenLink(grace_ms=300)
    link.observe(epoch=7, outcome="ended", now_ms=1_000)  # the stream broke
    link.observe(epoch=7, outcome="unreachable", now_ms=1_050)  # refused: the clock keeps running
    assert link.due(1_299) is None
    assert link.remaining_ms(1_299) == 1
    assert link.due(1_300) == 7
    assert link.due(1_400) is None, "returned once"


def test_an_answer_from_the_named_controller_clears_the_clock() -> None:
    link = BrokenLink(grace_ms=300)
    link.observe(epoch=7, outcome="unreachable", now_ms=0)
    link.observe(epoch=7, outcome="not_acting", now_ms=200)  # alive (loading, or standing down)
    assert link.due(10_000) is None
    assert link.remaining_ms(10_000) is None


def test_another_controller_named_forgets_the_broken_link() -> None:
    link = BrokenLink(grace_ms=300)
    link.observe(epoch=7, outcome="unreachable", now_ms=0)
    link.named(8)  # a newer epoch won (or the old lease expired): epoch 8 is never revoked for 7's silence
    assert link.due(1_000) is None
    link.observe(epoch=8, outcome="unreachable", now_ms=1_000)
    assert link.due(1_200) is None
    assert link.due(1_300) == 8


def test_no_controller_named_forgets_the_broken_link() -> None:
    link = BrokenLink(grace_ms=300)
    link.observe(epoch=7, outcome="ended", now_ms=0)
    link.named(None)
    assert link.due(1_000) is None


def test_the_clock_starts_at_the_first_sign_and_repeated_failures_do_not_restart_it() -> None:
    link = BrokenLink(grace_ms=300)
    for t in range(0, 300, 50):
        link.observe(epoch=3, outcome="unreachable", now_ms=t)
    assert link.due(300) == 3
