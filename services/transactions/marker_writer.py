"""The driver's MarkerWriter over the brokers' WriteTxnMarkers: a thin gRPC adapter, not pure.

A transaction's partitions are grouped by their leader as the coordinator's broker knows it (its
metadata cache, kept by the controller's UpdateMetadata), and each leader gets one call for all
of its partitions, the leaders at once. A leader answers per partition once its ISR has the
marker (services/broker/core.py write_txn_markers). What cannot be routed or reached comes back
as an error name for its partitions, never as an exception: the driver writes those again in its
next round (services/transactions/driver.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import grpc

from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import broker_pb2, common_pb2
from services.common import limits
from services.common.metadata_cache import MetadataCache
from services.common.peers import PeerChannels
from services.transactions.coordinator import TopicPartitions

# A partition whose leader the cache does not know (an election under way, a topic it has not
# heard of yet), and one whose leader did not answer: both are retried by the driver's next round.
NO_LEADER = common_pb2.ErrorCode.Name(common_pb2.LEADER_NOT_AVAILABLE)
LEADER_UNREACHABLE = common_pb2.ErrorCode.Name(common_pb2.REQUEST_TIMED_OUT)
# The RPC's own deadline beyond the wait the leader is asked for (its answer must travel back).
MARKER_CALL_SLACK_S = 2.0


class GrpcMarkerWriter:
    def __init__(
        self,
        metadata: MetadataCache,
        peers: PeerChannels,
        *,
        coordinator_epoch: int = 0,
        timeout_ms: int = limits.PRODUCE_TIMEOUT_MS_DEFAULT,
    ) -> None:
        self._metadata = metadata
        self._peers = peers
        self._coordinator_epoch = coordinator_epoch
        self._timeout_ms = timeout_ms

    async def write_markers(
        self, producer_id: int, producer_epoch: int, commit: bool, partitions: TopicPartitions
    ) -> Mapping[TopicPartitionKey, str]:
        answers: dict[TopicPartitionKey, str] = {}
        by_leader: dict[str, list[TopicPartitionKey]] = {}
        for tp in sorted(partitions):
            address = self._metadata.leader_address(tp)
            if address is None:
                answers[tp] = NO_LEADER
            else:
                by_leader.setdefault(address, []).append(tp)
        calls = [
            self._write(address, tps, producer_id, producer_epoch, commit)
            for address, tps in by_leader.items()
        ]
        for answered in await asyncio.gather(*calls):
            answers.update(answered)
        return answers

    async def _write(
        self, address: str, tps: list[TopicPartitionKey], producer_id: int, producer_epoch: int, commit: bool
    ) -> dict[TopicPartitionKey, str]:
        request = marker_request(
            tps,
            producer_id,
            producer_epoch,
            commit,
            coordinator_epoch=self._coordinator_epoch,
            timeout_ms=self._timeout_ms,
        )
        try:
            response = await self._peers.broker(address).WriteTxnMarkers(
                request, timeout=self._timeout_ms / 1000 + MARKER_CALL_SLACK_S
            )
        except grpc.aio.AioRpcError:
            return dict.fromkeys(tps, LEADER_UNREACHABLE)
        answered = {
            (topic.topic, p.partition): _error_name(p.error_code)
            for marker in response.markers
            for topic in marker.topics
            for p in topic.partitions
        }
        # A partition the leader left out of its answer was not written.
        return {tp: answered.get(tp, LEADER_UNREACHABLE) for tp in tps}


def marker_request(
    tps: list[TopicPartitionKey],
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    *,
    coordinator_epoch: int,
    timeout_ms: int,
) -> broker_pb2.WriteTxnMarkersRequest:
    """One leader's WriteTxnMarkers: a COMMIT (commit) or ABORT marker of (producer_id,
    producer_epoch) for each of `tps`."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in tps:
        by_topic.setdefault(topic, []).append(partition)
    return broker_pb2.WriteTxnMarkersRequest(
        markers=[
            broker_pb2.TxnMarker(
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                committed=commit,
                coordinator_epoch=coordinator_epoch,
                topics=[broker_pb2.TxnMarkerTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
            )
        ],
        timeout_ms=timeout_ms,
    )


def _error_name(code: int) -> str:
    """The code's name; a code this release does not know (a newer broker's) as a server error."""
    known = code in common_pb2.ErrorCode.values()
    name: str = common_pb2.ErrorCode.Name(code if known else common_pb2.UNKNOWN_SERVER_ERROR)
    return name
