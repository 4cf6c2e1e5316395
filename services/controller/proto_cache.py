"""The protos and encodings the active controller's requests and answers are assembled from,
each built once and kept while what it was built from is unchanged.

Partition states go through context.StateProtos (a warm standby hands over the ones it
built, metadata_image.py); topic configs are kept per configs dict (replay replaces the
dict on a change, never changes it); and the encodings of every partition (a DescribeCluster
answer or a full UpdateMetadata: 0.1 s of lookups at 100,000 partitions, on a machine busy
with the takeover) are kept for one context until its next write. Owned by the event loop's
task; pure: no I/O, no clock.
"""

from __future__ import annotations

from clients.common.topics import topic_config_proto
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from services.controller import wire
from services.controller.context import ControllerContext, StateProtos


class ProtoCache:
    """Built PartitionState and TopicConfig protos and their encodings (wire.py)."""

    def __init__(self) -> None:
        self.states = StateProtos()
        self._configs: dict[str, tuple[dict[str, str], common_pb2.TopicConfig, bytes]] = {}
        # partition_wires() kept for a context and the count of write replays it has seen.
        self._states_generation = 0
        self._partition_wires: tuple[ControllerContext, int, list[bytes]] | None = None

    def take(self, states: StateProtos) -> None:
        """Use the states a warm standby built (metadata_image.MetadataImage.protos)."""
        self.states = states
        self._configs.clear()

    def states_written(self) -> None:
        """Writes are being replayed: partition_wires() of before them is stale."""
        self._states_generation += 1

    def forget_topic(self, topic: str) -> None:
        """The topic was deleted: drop what was built for it."""
        self._configs.pop(topic, None)
        self.states.forget_topic(topic)

    def state_proto(self, ctx: ControllerContext, tp: TopicPartitionKey) -> common_pb2.PartitionState:
        """ctx.partition_state_proto(tp), built once per state (context.StateProtos)."""
        state = ctx.states.get(tp)
        if state is None:
            return ctx.partition_state_proto(tp)
        return self.states.get(tp, state, ctx.topics[tp[0]])

    def state_wire(self, ctx: ControllerContext, tp: TopicPartitionKey) -> bytes:
        """state_proto(tp)'s encoding, length-prefixed (wire.py), built once per state."""
        state = ctx.states.get(tp)
        if state is None:
            return wire.length_prefixed(ctx.partition_state_proto(tp).SerializeToString())
        return self.states.wire(tp, state, ctx.topics[tp[0]])

    def partition_wires(self, ctx: ControllerContext) -> list[bytes]:
        """The encodings of every partition with a state, in ctx.partitions() order (wire.py)."""
        kept = self._partition_wires
        if kept is not None and kept[0] is ctx and kept[1] == self._states_generation:
            return kept[2]
        wires = self.states.wires(ctx.partitions(), ctx.states, ctx.topics)
        self._partition_wires = (ctx, self._states_generation, wires)
        return wires

    def config_proto(self, ctx: ControllerContext, topic: str) -> common_pb2.TopicConfig:
        """topic_config_proto of the topic's configs, built once per configs dict (replaced on change)."""
        return self._config(ctx, topic)[1]

    def config_wire(self, ctx: ControllerContext, topic: str) -> bytes:
        """config_proto(topic)'s encoding, length-prefixed (wire.py)."""
        return self._config(ctx, topic)[2]

    def _config(
        self, ctx: ControllerContext, topic: str
    ) -> tuple[dict[str, str], common_pb2.TopicConfig, bytes]:
        configs = ctx.topics[topic].configs
        cached = self._configs.get(topic)
        if cached is not None and cached[0] is configs:
            return cached
        proto = topic_config_proto(configs)
        built = (configs, proto, wire.length_prefixed(proto.SerializeToString()))
        self._configs[topic] = built
        return built
