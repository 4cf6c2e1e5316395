"""The cluster metadata a broker or gateway knows: fed by the controller's UpdateMetadata.

A gateway may also fill it from DescribeCluster when it starts or when a
request finds it stale. Plain data, owned by the process's event loop.
"""

from __future__ import annotations

from collections.abc import KeysView, Sequence

from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import broker_pb2, common_pb2


class MetadataCache:
    """Brokers, gateways, partition states and topic configs as the controller last said them.

    A full update (a new controller's: every partition of the cluster) is kept as received and
    indexed into `partitions` only when something asks for it: a broker at 100,000 partitions
    otherwise spent 0.1 s of CPU per takeover building a dict that, on a broker, only Metadata
    requests and requests for partitions it does not host read.
    """

    def __init__(
        self,
        controller_id: int = -1,
        controller_epoch: int = -1,
        brokers: dict[int, common_pb2.BrokerNode] | None = None,
        gateways: dict[int, common_pb2.GatewayNode] | None = None,
        partitions: dict[TopicPartitionKey, common_pb2.PartitionState] | None = None,
        topic_configs: dict[str, common_pb2.TopicConfig] | None = None,
        topic_ids: dict[str, str] | None = None,
    ) -> None:
        self.controller_id = controller_id
        self.controller_epoch = controller_epoch
        self.brokers = brokers if brokers is not None else {}
        self.gateways = gateways if gateways is not None else {}
        self._partitions = partitions if partitions is not None else {}
        self._unindexed: Sequence[common_pb2.PartitionState] | None = None
        # Partition states by topic in partition order, kept until the partitions change:
        # routing asks for each partition of a request, and a scan of every partition each
        # time made a request's cost grow with the cluster (100,000 partitions: ~10 ms).
        self._by_topic: dict[str, list[common_pb2.PartitionState]] | None = None
        self.topic_configs = topic_configs if topic_configs is not None else {}
        self.topic_ids = topic_ids if topic_ids is not None else {}

    @property
    def partitions(self) -> dict[TopicPartitionKey, common_pb2.PartitionState]:
        if self._unindexed is not None:
            self._partitions = {(state.topic, state.partition): state for state in self._unindexed}
            self._unindexed = None
        return self._partitions

    @partitions.setter
    def partitions(self, value: dict[TopicPartitionKey, common_pb2.PartitionState]) -> None:
        self._partitions, self._unindexed = value, None
        self._by_topic = None

    def apply(self, req: broker_pb2.UpdateMetadataRequest) -> None:
        self.controller_id = req.header.controller_id
        self.controller_epoch = max(self.controller_epoch, req.header.controller_epoch)
        self.brokers = {b.broker_id: b for b in req.live_brokers}
        self.gateways = {g.gateway_id: g for g in req.live_gateways}
        self._by_topic = None
        if req.full:
            self._partitions, self._unindexed = {}, req.partitions
            self.topic_configs = {}
            self.topic_ids = {}
        else:
            for topic in req.deleted_topics:
                self._drop_topic(topic)
            partitions = self.partitions
            for state in req.partitions:
                partitions[(state.topic, state.partition)] = state
        self.topic_configs.update(req.topic_configs)
        self.topic_ids.update(req.topic_ids)

    def apply_describe(self, resp: common_pb2.DescribeClusterResponse) -> None:
        """Replace everything with the active controller's answer to DescribeCluster."""
        self.controller_id = resp.controller_id
        self.controller_epoch = max(self.controller_epoch, resp.controller_epoch)
        self.brokers = {b.broker_id: b for b in resp.brokers}
        self.gateways = {g.gateway_id: g for g in resp.gateways}
        self.partitions = {(s.topic, s.partition): s for s in resp.partitions}
        self.topic_configs = dict(resp.topic_configs)
        self.topic_ids = {s.topic: s.topic_id for s in resp.partitions}

    def _drop_topic(self, topic: str) -> None:
        self.partitions = {tp: s for tp, s in self.partitions.items() if tp[0] != topic}
        self.topic_configs.pop(topic, None)
        self.topic_ids.pop(topic, None)

    def _topic_index(self) -> dict[str, list[common_pb2.PartitionState]]:
        if self._by_topic is None:
            by_topic: dict[str, list[common_pb2.PartitionState]] = {}
            for (topic, _), state in self.partitions.items():
                by_topic.setdefault(topic, []).append(state)
            for states in by_topic.values():
                states.sort(key=lambda s: s.partition)
            self._by_topic = by_topic
        return self._by_topic

    def topics(self) -> KeysView[str]:
        return self._topic_index().keys()

    def partitions_of(self, topic: str) -> list[common_pb2.PartitionState]:
        return list(self._topic_index().get(topic, ()))

    def leader_address(self, tp: TopicPartitionKey) -> str | None:
        state = self.partitions.get(tp)
        if state is None or state.leader < 0:
            return None
        broker = self.brokers.get(state.leader)
        return f"{broker.host}:{broker.port}" if broker is not None else None

    def metadata_response(self, topics: list[str]) -> common_pb2.MetadataResponse:
        wanted = topics or sorted(self.topics())
        out = []
        for name in wanted:
            parts = self.partitions_of(name)
            if not parts:
                out.append(
                    common_pb2.TopicMetadata(
                        name=name,
                        error_code=common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
                        error_message=f"topic {name!r} does not exist",
                    )
                )
                continue
            out.append(
                common_pb2.TopicMetadata(
                    name=name,
                    topic_id=self.topic_ids.get(name, ""),
                    config=self.topic_configs.get(name),
                    partitions=[
                        common_pb2.PartitionMetadata(
                            partition=s.partition,
                            leader=s.leader,
                            leader_epoch=s.leader_epoch,
                            replicas=s.replicas,
                            isr=s.isr,
                            offline_replicas=[r for r in s.replicas if r not in self.brokers],
                            error_code=common_pb2.NONE if s.leader >= 0 else common_pb2.LEADER_NOT_AVAILABLE,
                        )
                        for s in parts
                    ],
                )
            )
        return common_pb2.MetadataResponse(
            brokers=list(self.brokers.values()),
            controller_id=self.controller_id,
            topics=out,
            gateways=list(self.gateways.values()),
        )
