"""The asyncio side of the classic groups (classic_groups.py): futures for the requests that
wait, the clock, and the timer that expires sessions and rebalance deadlines.

Owned by the broker's event loop; start() once the loop runs, close() at the broker's stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any

from services.groups.errors import GroupError
from services.kafka.classic_groups import ClassicGroups, Completion, Group, JoinAnswer, SyncAnswer

log = logging.getLogger("highwater.kafka")

# How often sessions and rebalance deadlines are checked: a dead member is noticed within its
# session timeout plus this.
EXPIRE_INTERVAL_MS = 100


class ClassicGroupDriver:
    def __init__(self, broker_id: int) -> None:
        self.core = ClassicGroups(broker_id)
        self._tickets = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._timer: asyncio.Task[None] | None = None

    @staticmethod
    def _now_ms() -> int:
        return int(time.monotonic() * 1000)

    def start(self) -> None:
        self._timer = asyncio.create_task(self._expire_forever(), name="kafka-classic-groups")

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        for fut in self._waiting.values():
            fut.cancel()
        self._waiting.clear()

    async def _expire_forever(self) -> None:
        while True:
            await asyncio.sleep(EXPIRE_INTERVAL_MS / 1000)
            try:
                self._deliver(self.core.expire(self._now_ms()))
            except Exception:
                log.exception("classic group expiry failed")
                raise

    def _deliver(self, completions: list[Completion]) -> None:
        for ticket, answer in completions:
            fut = self._waiting.pop(ticket, None)
            if fut is not None and not fut.done():  # its connection may be gone
                fut.set_result(answer)

    def _wait(self) -> tuple[int, asyncio.Future[Any]]:
        ticket = next(self._tickets)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[ticket] = fut
        return ticket, fut

    async def join(self, **request: Any) -> JoinAnswer:
        ticket, fut = self._wait()
        self._deliver(self.core.join(self._now_ms(), ticket, **request))
        answer: JoinAnswer = await fut
        return answer

    async def sync(
        self, *, group_id: str, member_id: str, generation: int, assignments: dict[str, bytes]
    ) -> SyncAnswer:
        ticket, fut = self._wait()
        self._deliver(
            self.core.sync(
                ticket, group_id=group_id, member_id=member_id, generation=generation, assignments=assignments
            )
        )
        answer: SyncAnswer = await fut
        return answer

    def heartbeat(self, *, group_id: str, member_id: str, generation: int) -> GroupError:
        return self.core.heartbeat(
            self._now_ms(), group_id=group_id, member_id=member_id, generation=generation
        )

    def leave(self, *, group_id: str, member_ids: Sequence[str]) -> list[GroupError]:
        errors, completions = self.core.leave(self._now_ms(), group_id=group_id, member_ids=member_ids)
        self._deliver(completions)
        return errors

    def commit_check(self, group_id: str, member_id: str, generation: int) -> GroupError:
        return self.core.commit_check(group_id, member_id, generation)

    def delete(self, group_id: str) -> GroupError:
        return self.core.delete(group_id)

    def groups(self) -> list[Group]:
        return list(self.core.groups.values())

    def group(self, group_id: str) -> Group | None:
        return self.core.groups.get(group_id)
