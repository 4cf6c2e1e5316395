"""The controller's in-memory picture of the cluster (Kafka's ControllerContext).

Everything here is rebuilt from etcd by a new controller (`ControllerContext`
is filled by the event loop's load step), so nothing the controller knows is
lost with it. Pure data: no I/O.

The etcd value formats are spelled in coordinator/values.py, and the controller's
event loop converts them to these types (event_loop.broker_info, topic_info,
partition_state): this pure module imports nothing from coordinator/.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from clients.common.errors import check
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from services.common import limits
from services.controller.wire import length_prefixed

NO_LEADER = -1


@dataclass(frozen=True)
class BrokerInfo:
    broker_id: int
    host: str
    port: int
    rack: str
    metrics_port: int
    broker_epoch: int
    # The broker's last run did not stop cleanly and its host rebooted since: records it
    # had acknowledged but not flushed may be gone (section 7 of docs/ARCHITECTURE.md).
    unclean_shutdown: bool = False
    # The replicas this broker said it is prepared to hold (--replicas-max; 0: not stated, so
    # limits.REPLICAS_PER_BROKER_MAX). CreateTopics and CreatePartitions keep within it.
    replicas_max: int = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def to_proto(self) -> common_pb2.BrokerNode:
        return common_pb2.BrokerNode(
            broker_id=self.broker_id,
            host=self.host,
            port=self.port,
            rack=self.rack,
            metrics_port=self.metrics_port,
            broker_epoch=self.broker_epoch,
        )


@dataclass(frozen=True)
class GatewayInfo:
    gateway_id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class LeaderAndIsr:
    """One partition's state key. partition_epoch is the etcd version of the key (0: not written yet)."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    partition_epoch: int = 0

    def next(
        self, *, leader: int, isr: tuple[int, ...], controller_epoch: int, bump_epoch: bool = True
    ) -> LeaderAndIsr:
        """The state after a change: leader_epoch + 1 (never decreasing), partition_epoch + 1."""
        return LeaderAndIsr(
            leader,
            self.leader_epoch + 1 if bump_epoch else self.leader_epoch,
            isr,
            controller_epoch,
            self.partition_epoch + 1,
        )


@dataclass
class TopicInfo:
    name: str
    topic_id: str
    assignment: dict[int, tuple[int, ...]]
    configs: dict[str, str] = field(default_factory=dict)
    adding_replicas: dict[int, tuple[int, ...]] = field(default_factory=dict)
    removing_replicas: dict[int, tuple[int, ...]] = field(default_factory=dict)

    @property
    def min_insync_replicas(self) -> int:
        return int(self.configs.get("min.insync.replicas", limits.DEFAULT_MIN_INSYNC_REPLICAS))

    @property
    def unclean_leader_election(self) -> bool:
        return self.configs.get("unclean.leader.election.enable", "false") == "true"


def state_proto(tp: TopicPartitionKey, s: LeaderAndIsr, topic: TopicInfo) -> common_pb2.PartitionState:
    return common_pb2.PartitionState(
        topic=tp[0],
        partition=tp[1],
        leader=s.leader,
        leader_epoch=s.leader_epoch,
        isr=list(s.isr),
        replicas=list(topic.assignment[tp[1]]),
        controller_epoch=s.controller_epoch,
        partition_epoch=s.partition_epoch,
        adding_replicas=list(topic.adding_replicas.get(tp[1], ())),
        removing_replicas=list(topic.removing_replicas.get(tp[1], ())),
        topic_id=topic.topic_id,
    )


# What StateProtos keeps per partition: the state and the topic's replicas, adding and removing
# replicas and id it was built from, then the proto and its length-prefixed encoding.
_Built = tuple[
    "LeaderAndIsr", tuple[int, ...], tuple[int, ...], tuple[int, ...], str, common_pb2.PartitionState, bytes
]


class StateProtos:
    """Built PartitionState protos and their encodings, each kept with what it was built from.

    A controller at 100,000 partitions would otherwise build every partition's proto (7 µs
    each in Python) for each of its failover's LeaderAndIsr, UpdateMetadata and DescribeCluster
    answers. An entry is used only while the state is the same object (replay replaces a
    state, never changes it) and the topic's replicas, reassignment and id are equal, so it
    is right whatever context asks; a standby builds them ahead (metadata_image.py). Callers
    copy the proto (a protobuf field assignment copies) and never change it; the large
    requests are assembled from the encodings instead (wire.py). Pure: no I/O.
    """

    def __init__(self) -> None:
        self._built: dict[TopicPartitionKey, _Built] = {}

    def get(self, tp: TopicPartitionKey, s: LeaderAndIsr, topic: TopicInfo) -> common_pb2.PartitionState:
        return self._entry(tp, s, topic)[5]

    def wire(self, tp: TopicPartitionKey, s: LeaderAndIsr, topic: TopicInfo) -> bytes:
        """The state's encoding, length-prefixed (wire.length_prefixed), as a repeated field holds it."""
        return self._entry(tp, s, topic)[6]

    def wires(
        self,
        tps: Iterable[TopicPartitionKey],
        states: dict[TopicPartitionKey, LeaderAndIsr],
        topics: dict[str, TopicInfo],
    ) -> list[bytes]:
        """wire() of each of tps that has a state, in order: the bulk path of the takeover's large
        messages (0.6 µs a partition here against 1.7 through wire(), at 100,000 partitions)."""
        built = self._built
        out = []
        name = ""
        topic: TopicInfo | None = None
        for tp in tps:
            s = states.get(tp)
            if s is None:
                continue
            if topic is None or tp[0] != name:
                name, topic = tp[0], topics[tp[0]]
            p = tp[1]
            e = built.get(tp)
            if (
                e is None
                or e[0] is not s
                or e[1] != topic.assignment[p]
                or e[2] != topic.adding_replicas.get(p, ())
                or e[3] != topic.removing_replicas.get(p, ())
                or e[4] != topic.topic_id
            ):
                e = self._build(tp, s, topic)
            out.append(e[6])
        return out

    def _entry(self, tp: TopicPartitionKey, s: LeaderAndIsr, topic: TopicInfo) -> _Built:
        e = self._built.get(tp)
        if (
            e is not None
            and e[0] is s
            and e[1] == topic.assignment[tp[1]]
            and e[2] == topic.adding_replicas.get(tp[1], ())
            and e[3] == topic.removing_replicas.get(tp[1], ())
            and e[4] == topic.topic_id
        ):
            return e
        return self._build(tp, s, topic)

    def _build(self, tp: TopicPartitionKey, s: LeaderAndIsr, topic: TopicInfo) -> _Built:
        proto = state_proto(tp, s, topic)
        e = (
            s,
            topic.assignment[tp[1]],
            topic.adding_replicas.get(tp[1], ()),
            topic.removing_replicas.get(tp[1], ()),
            topic.topic_id,
            proto,
            length_prefixed(proto.SerializeToString()),
        )
        self._built[tp] = e
        return e

    def forget_topic(self, topic: str) -> None:
        for tp in [tp for tp in self._built if tp[0] == topic]:
            del self._built[tp]

    def forget(self, tp: TopicPartitionKey) -> None:
        self._built.pop(tp, None)

    def __len__(self) -> int:
        return len(self._built)


@dataclass
class ControllerContext:
    controller_id: int
    epoch: int = 0
    live_brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    live_gateways: dict[int, GatewayInfo] = field(default_factory=dict)
    topics: dict[str, TopicInfo] = field(default_factory=dict)
    states: dict[TopicPartitionKey, LeaderAndIsr] = field(default_factory=dict)
    topics_to_delete: set[str] = field(default_factory=set)
    shutting_down: set[int] = field(default_factory=set)
    # etcd mod_revision of each state key as loaded at failover: a broker whose registration
    # (broker epoch) is newer restarted after its ISR membership was written.
    state_revisions: dict[TopicPartitionKey, int] = field(default_factory=dict)
    # Replicas of topics being deleted: (tp, broker) -> ReplicaDeletionStarted/Successful/Ineligible
    # (a ReplicaState); changed only by replaying a handler's ReplicaStatesWrite.
    replica_deletion: dict[tuple[TopicPartitionKey, int], Any] = field(default_factory=dict)

    def replicas(self, tp: TopicPartitionKey) -> tuple[int, ...]:
        return self.topics[tp[0]].assignment[tp[1]]

    def partitions(self) -> list[TopicPartitionKey]:
        """Every partition, sorted (topic by topic: a sort of 100,000 pairs costs twice as much)."""
        topics = self.topics
        return [(name, p) for name in sorted(topics) for p in sorted(topics[name].assignment)]

    def partitions_of(self, topic: str) -> list[TopicPartitionKey]:
        return sorted((topic, p) for p in self.topics[topic].assignment)

    def is_live(self, broker_id: int) -> bool:
        return broker_id in self.live_brokers and broker_id not in self.shutting_down

    def apply_state(self, tp: TopicPartitionKey, state: LeaderAndIsr) -> None:
        """Replay a committed partition state (invariant: leader_epoch never decreases)."""
        old = self.states.get(tp)
        if old is not None:
            check(
                state.leader_epoch >= old.leader_epoch,
                "leader_epoch of %s-%d would go back from %d to %d",
                tp[0],
                tp[1],
                old.leader_epoch,
                state.leader_epoch,
            )
        self.states[tp] = state

    def partition_state_proto(self, tp: TopicPartitionKey) -> common_pb2.PartitionState:
        s = self.states.get(tp) or LeaderAndIsr(NO_LEADER, -1, (), self.epoch, 0)
        return state_proto(tp, s, self.topics[tp[0]])

    def with_broker_epoch(self, broker_id: int) -> int:
        b = self.live_brokers.get(broker_id)
        return b.broker_epoch if b is not None else -1

    def offline_partitions(self) -> list[TopicPartitionKey]:
        return [
            tp
            for tp in self.partitions()
            if (s := self.states.get(tp)) is None
            or s.leader == NO_LEADER
            or s.leader not in self.live_brokers
        ]
