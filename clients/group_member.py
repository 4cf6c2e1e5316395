"""A consumer's membership of its group: the member side of KIP-848's heartbeat protocol.

The coordinator (any gateway; services/gateway/groups.py) decides the assignment; the
member only reports what it owns and takes what it is given. This class runs the heartbeat
loop as an asyncio task beside the consumer and keeps three facts the consumer acts on in
poll() (services/groups/coordinator.py explains the protocol):

- `target`: the partitions the latest answer says this member may own now. Partitions the
  consumer owns that are not in it must be revoked (committed first, on_partitions_revoked)
  before the coordinator gives them to anyone else; partitions in it that the consumer does
  not own yet are its to take (on_partitions_assigned).
- `lost`: the member was fenced (its epoch is not the group's, or its session expired while
  it was paused): its partitions may already be someone else's, so the consumer drops them
  without committing (on_partitions_lost) and `rejoin()` starts over with epoch 0.
- `error`: a refusal no retry fixes (an unknown assignor, a full group), raised by poll().

Heartbeats long-poll at the gateway: an answer with nothing new comes back after ~0.5 s or
as soon as the group changes, and the next heartbeat follows at once. While the consumer
still has to act on an answer (revoke or take partitions), the loop waits for it to report
what it owns instead of asking again.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable

from clients.common.types import TopicPartition
from clients.config import (
    GROUP_HEARTBEAT_WHILE_RECONCILING_MS,
    GROUP_LEAVE_TIMEOUT_MS,
    RETRY_BACKOFF_MAX_MS_DEFAULT,
)
from clients.connection import GatewayConnection
from clients.errors import HighwaterError, error_for_code
from protos.highwater.v1 import common_pb2, gateway_pb2

log = logging.getLogger("highwater.client.group")

EPOCH_JOIN = 0
EPOCH_LEAVE = -1
EPOCH_LEAVE_STATIC = -2  # a static member restarting: keeps its partitions for its session
# Answers after which the member must start over (drop its partitions, rejoin with epoch 0).
FENCED_CODES = frozenset({common_pb2.UNKNOWN_MEMBER_ID, common_pb2.FENCED_MEMBER_EPOCH})


class GroupMember:
    def __init__(
        self,
        connection: Callable[[], GatewayConnection],
        group_id: str,
        topics: tuple[str, ...],
        *,
        instance_id: str | None,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        assignor: str | None,
        client_id: str,
    ) -> None:
        self._connection = connection
        self.group_id = group_id
        self.topics = topics
        self.instance_id = instance_id
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.assignor = assignor
        self.client_id = client_id
        self.member_id = ""
        self.epoch = EPOCH_JOIN
        self.target: frozenset[TopicPartition] | None = None  # None: no answer yet
        self.lost = False
        self._keep_id_on_rejoin = False
        self.error: HighwaterError | None = None
        self._owned: frozenset[TopicPartition] = frozenset()
        self._subscription_sent = False
        self._wake = asyncio.Event()  # the consumer reported what it owns, or the topics changed
        self.changed = asyncio.Event()  # a new target, a fence or an error: poll() acts on it
        self._task: asyncio.Task[None] | None = None

    # --- what the consumer tells the member ------------------------------------------

    def start(self) -> None:
        if self._task is None:
            # A clean context: the member is started inside a poll(), whose call deadline
            # (clients/connection.py, call_deadline) must not bound the heartbeats that outlive it.
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"group-{self.group_id}", context=contextvars.Context()
            )

    def report_owned(self, owned: frozenset[TopicPartition]) -> None:
        """What the consumer owns now (after revoking and taking what the last answer said)."""
        if owned != self._owned:
            self._owned = owned
            self._wake.set()

    def resubscribe(self, topics: tuple[str, ...]) -> None:
        if topics != self.topics:
            self.topics = topics
            self._subscription_sent = False
            self._wake.set()

    def rejoin(self) -> None:
        """After `lost` was handled (the consumer owns nothing): join again with epoch 0,
        under the same member id when the group still knows it (fenced epoch), else as a new
        member (its session expired: the old id is gone)."""
        self.lost = False
        if not self._keep_id_on_rejoin:
            self.member_id = ""
        self.epoch = EPOCH_JOIN
        self.target = None
        self._owned = frozenset()
        self._subscription_sent = False
        self._wake.set()

    def fence(self, code: int) -> None:
        """A commit was refused as from a fenced member: act as a fenced heartbeat would."""
        if not self.lost:
            self.lost = True
            self._keep_id_on_rejoin = code == common_pb2.FENCED_MEMBER_EPOCH
            self.changed.set()

    def was_fenced(self) -> bool:
        """Whether the member is fenced now (a heartbeat or a commit may have found out)."""
        return self.lost

    @property
    def active(self) -> bool:
        """Whether commits should carry this member's id and epoch."""
        return bool(self.member_id) and self.epoch > 0 and not self.lost

    # --- the heartbeat loop ----------------------------------------------------------

    async def _run(self) -> None:
        backoff_ms = 0
        while True:
            if backoff_ms:
                await self._wait_for_wake(backoff_ms)
            if self.lost:
                await self._wake.wait()  # the consumer drops its partitions, then rejoin()
                self._wake.clear()
                continue
            request = self._request()
            try:
                response = await self._connection().call("ConsumerGroupHeartbeat", request)
            except HighwaterError as exc:
                if not exc.retriable:
                    self._fail(exc)
                    return
                log.warning("group %s: heartbeat failed (%s); retrying", self.group_id, exc)
                backoff_ms = RETRY_BACKOFF_MAX_MS_DEFAULT
                continue
            backoff_ms = 0
            code = response.error_code
            if code in FENCED_CODES:
                log.warning(
                    "group %s: member %s fenced: %s", self.group_id, self.member_id, response.error_message
                )
                self.fence(code)
                continue
            if code != common_pb2.NONE:
                error = error_for_code(code, response.error_message or "ConsumerGroupHeartbeat")
                if not error.retriable:
                    self._fail(error)
                    return
                backoff_ms = RETRY_BACKOFF_MAX_MS_DEFAULT
                continue
            self._subscription_sent = True
            self.member_id, self.epoch = response.member_id, response.member_epoch
            target = frozenset(TopicPartition(p.topic, p.partition) for p in response.assignment)
            if target != self.target:
                self.target = target
                self.changed.set()
            if target != self._owned:
                # The consumer must act first (in poll): ask again once it has, or soon anyway
                # so the session stays alive while it works.
                await self._wait_for_wake(GROUP_HEARTBEAT_WHILE_RECONCILING_MS)
            elif response.heartbeat_interval_ms:
                await self._wait_for_wake(response.heartbeat_interval_ms)

    def _request(self) -> gateway_pb2.ConsumerGroupHeartbeatRequest:
        owned = sorted(self._owned)
        return gateway_pb2.ConsumerGroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=self.epoch,
            instance_id=self.instance_id or "",
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            subscribed_topics=list(self.topics),
            subscription_unchanged=self._subscription_sent and self.epoch != EPOCH_JOIN,
            server_assignor=self.assignor or "",
            owned=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in owned],
            session_timeout_ms=self.session_timeout_ms,
            client_id=self.client_id,
        )

    async def _wait_for_wake(self, timeout_ms: int) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout_ms / 1000)
        self._wake.clear()

    def _fail(self, error: HighwaterError) -> None:
        log.error("group %s: heartbeats stopped: %s", self.group_id, error)
        self.error = error
        self.changed.set()

    # --- leaving ---------------------------------------------------------------------

    async def leave(self) -> None:
        """Stop heartbeating and leave the group at once (a static member: for its session)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if not self.member_id or self.lost:
            return
        epoch = EPOCH_LEAVE if self.instance_id is None else EPOCH_LEAVE_STATIC
        request = gateway_pb2.ConsumerGroupHeartbeatRequest(
            group_id=self.group_id,
            member_id=self.member_id,
            member_epoch=epoch,
            instance_id=self.instance_id or "",
            subscription_unchanged=True,
        )
        try:
            async with asyncio.timeout(GROUP_LEAVE_TIMEOUT_MS / 1000):
                await self._connection().call("ConsumerGroupHeartbeat", request)
        except (HighwaterError, TimeoutError) as exc:
            # Its session expires instead; the partitions move a session timeout later.
            log.warning("group %s: leaving failed (%s); the session will expire", self.group_id, exc)
