"""When the gateway routes a Produce again (services/gateway/cluster_view.py `await_routing_retry`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from coordinator.memory_store import MemoryStore
from services.gateway.cluster_view import ROUTING_RETRY_BACKOFF_MS, ClusterView


class Recorder:
    def __init__(self) -> None:
        self.forced = 0
        self.rate_limited = 0

    async def refresh(self, *, force: bool = False) -> None:
        if force:
            self.forced += 1
        else:
            self.rate_limited += 1


def gateway() -> tuple[ClusterView, Recorder]:
    gw = ClusterView(MemoryStore(), None)  # type: ignore[arg-type]  # no peer is called here
    recorder = Recorder()
    gw.refresh_metadata = recorder.refresh  # type: ignore[method-assign]
    return gw, recorder


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 5))


def test_news_during_the_attempt_routes_again_at_once_without_asking_the_controller() -> None:
    async def scenario() -> tuple[float, int]:
        gw, recorder = gateway()
        news = gw.metadata_changed
        gw.announce_metadata()  # the controller's push arrived while the attempt was out
        started = time.monotonic()
        await gw.await_routing_retry(news, ROUTING_RETRY_BACKOFF_MS, force=True)
        return time.monotonic() - started, recorder.forced

    waited_s, forced = run(scenario())
    assert waited_s < ROUTING_RETRY_BACKOFF_MS / 1000 / 2 and forced == 0


def test_news_while_waiting_ends_the_wait() -> None:
    async def scenario() -> tuple[float, int]:
        gw, recorder = gateway()
        news = gw.metadata_changed
        asyncio.get_running_loop().call_later(0.01, gw.announce_metadata)
        started = time.monotonic()
        await gw.await_routing_retry(news, 10_000, force=True)
        return time.monotonic() - started, recorder.forced

    waited_s, forced = run(scenario())
    assert waited_s < 2 and forced == 0, "woken by the push, long before the 10 s back-off"


def test_no_news_waits_the_back_off_then_asks_the_controller() -> None:
    async def scenario() -> tuple[float, int]:
        gw, recorder = gateway()
        started = time.monotonic()
        await gw.await_routing_retry(gw.metadata_changed, 50, force=True)
        return time.monotonic() - started, recorder.forced

    waited_s, forced = run(scenario())
    assert waited_s >= 0.05 and forced == 1


def test_a_leader_behind_wait_asks_the_controller_only_within_the_refresh_rate_limit() -> None:
    async def scenario() -> Recorder:
        gw, recorder = gateway()
        await gw.await_routing_retry(gw.metadata_changed, 20, force=False)
        return recorder

    recorder = run(scenario())
    assert recorder.forced == 0 and recorder.rate_limited == 1
