"""What a controller handler decides: the writes it asks for, the RPCs, and how writes replay.

Kept apart from the handlers so that handlers.py, deletion.py, reassignment.py and
admin_requests.py can all build a `ControllerResult` without importing each other:
every write kind is listed here because `apply_write` (the only code that changes the
context for a write) and the event loop's commit must know all of them in one place.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from clients.common.errors import UnknownTopicOrPartition
from clients.common.types import TopicPartitionKey
from services.controller.context import ControllerContext, LeaderAndIsr, TopicInfo
from services.controller.state_machines import ReplicaState

# ---- what a handler asks for ----------------------------------------------------------


@dataclass(frozen=True)
class StateWrite:
    """Write a partition state key; expected_version is the key's version now (0: absent)."""

    tp: TopicPartitionKey
    state: LeaderAndIsr
    expected_version: int


@dataclass(frozen=True)
class TopicWrite:
    topic: TopicInfo
    create: bool


@dataclass(frozen=True)
class ConfigWrite:
    topic: str
    configs: dict[str, str]


@dataclass(frozen=True)
class TopicDelete:
    """Remove every key of a topic (assignment, states, config, deletion marker)."""

    topic: str


@dataclass(frozen=True)
class ReplicaStatesWrite:
    """Replica state machine moves of replicas being deleted (kept in memory only, not in etcd)."""

    states: tuple[tuple[tuple[TopicPartitionKey, int], ReplicaState], ...]


@dataclass(frozen=True)
class ShuttingDownWrite:
    """Brokers that started (add) or ended (remove) a controlled shutdown (kept in memory only)."""

    add: frozenset[int] = frozenset()
    remove: frozenset[int] = frozenset()


@dataclass(frozen=True)
class DeletionMark:
    """Put /admin/delete_topics/{topic}: deletion survives a controller failover."""

    topic: str


@dataclass(frozen=True)
class AdminKeyDelete:
    """Remove a handled (or malformed) /admin request key."""

    key: str


Write = (
    StateWrite
    | TopicWrite
    | ConfigWrite
    | TopicDelete
    | DeletionMark
    | AdminKeyDelete
    | ReplicaStatesWrite
    | ShuttingDownWrite
)


@dataclass
class ControlRpcs:
    """Control RPCs to send after the writes commit, built from the committed context."""

    leader_and_isr: dict[int, set[TopicPartitionKey]] = field(default_factory=dict)
    new_replicas: set[tuple[int, TopicPartitionKey]] = field(default_factory=set)
    update_metadata: set[TopicPartitionKey] = field(default_factory=set)
    full_metadata: bool = False
    # A failover's: besides `leader_and_isr`, every partition not being deleted goes to each of its
    # live replicas. Expanded when sent (ControllerEventLoop._send_steps, between other work), so
    # that a new controller answers before it has built 100,000 partitions' fan-out.
    leader_and_isr_everywhere: bool = False
    stop_replica: dict[int, dict[TopicPartitionKey, bool]] = field(default_factory=dict)
    deleted_topics: set[str] = field(default_factory=set)

    def add_leader_and_isr(
        self, brokers: Iterable[int], tp: TopicPartitionKey, *, is_new: bool = False
    ) -> None:
        for b in brokers:
            self.leader_and_isr.setdefault(b, set()).add(tp)
            if is_new:
                self.new_replicas.add((b, tp))
        self.update_metadata.add(tp)

    def is_empty(self) -> bool:
        return not (
            self.leader_and_isr
            or self.leader_and_isr_everywhere
            or self.update_metadata
            or self.full_metadata
            or self.stop_replica
            or self.deleted_topics
        )


@dataclass
class ControllerResult:
    writes: list[Write] = field(default_factory=list)
    rpcs: ControlRpcs = field(default_factory=ControlRpcs)
    response: Any = None
    # Count of elections that picked a leader from outside the ISR (potential data loss).
    unclean_elections: int = 0
    # Filled by the event loop: one future per control RPC queued for this result.
    rpc_futures: list[Any] = field(default_factory=list)


# ---- shared helpers --------------------------------------------------------------------------


def require_topic(ctx: ControllerContext, name: str) -> TopicInfo:
    topic = ctx.topics.get(name)
    if topic is None:
        raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
    return topic


# ---- replay -----------------------------------------------------------------------------------


def apply_write(ctx: ControllerContext, write: Write) -> None:
    """Replay one committed write into the context (the only way handler writes change it)."""
    if isinstance(write, StateWrite):
        ctx.apply_state(write.tp, write.state)
    elif isinstance(write, TopicWrite):
        old = ctx.topics.get(write.topic.name)
        configs = old.configs if old is not None else write.topic.configs
        ctx.topics[write.topic.name] = TopicInfo(
            write.topic.name,
            write.topic.topic_id,
            dict(write.topic.assignment),
            dict(configs or {}),
            dict(write.topic.adding_replicas),
            dict(write.topic.removing_replicas),
        )
    elif isinstance(write, ConfigWrite):
        topic = ctx.topics.get(write.topic)
        if topic is not None:
            topic.configs = dict(write.configs)
    elif isinstance(write, DeletionMark):
        ctx.topics_to_delete.add(write.topic)
    elif isinstance(write, ReplicaStatesWrite):
        for key, state in write.states:
            if key[0][0] in ctx.topics_to_delete:
                ctx.replica_deletion[key] = state
    elif isinstance(write, ShuttingDownWrite):
        ctx.shutting_down = (ctx.shutting_down | write.add) - write.remove
    elif isinstance(write, TopicDelete):
        ctx.replica_deletion = {k: v for k, v in ctx.replica_deletion.items() if k[0][0] != write.topic}
        ctx.topics.pop(write.topic, None)
        ctx.topics_to_delete.discard(write.topic)
        for tp in [tp for tp in ctx.states if tp[0] == write.topic]:
            del ctx.states[tp]
