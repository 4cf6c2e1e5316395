"""The transaction coordinator's MarkerWriter over the brokers' WriteTxnMarkers
(services/transactions/marker_writer.py; issue 41) on a real cluster: partitions grouped by leader,
markers appended where they lead and answered once their ISR has them, a partition without a
known leader named as such; a read_committed Fetch then names the aborted transactions."""

from __future__ import annotations

import asyncio

import pytest

from clients import Admin
from protos.highwater.v1 import common_pb2
from services.common.metadata_cache import MetadataCache
from services.common.peers import PeerChannels
from services.transactions.driver import MARKER_WRITTEN
from services.transactions.marker_writer import NO_LEADER, GrpcMarkerWriter
from tests.integration.helpers import consumer_fetch, gateway_stub

pytestmark = pytest.mark.integration

TOPIC = "txn-marker-writer"
FAST = {"request_timeout_ms": 10_000, "connect_timeout_ms": 5_000, "retry_backoff_ms": 50}
CALL_TIMEOUT_S = 10.0
PRODUCER_ID = 77


def test_markers_reach_every_partitions_leader_and_a_partition_without_one_is_named(cluster):
    with Admin(cluster.gateway_address, **FAST) as admin:
        admin.create_topics(TOPIC, 3, 3, {"min.insync.replicas": "2"})
    gw = gateway_stub(cluster.gateway_address.split(",")[0])
    metadata = MetadataCache()
    metadata.apply_describe(gw.DescribeCluster(common_pb2.DescribeClusterRequest(), timeout=CALL_TIMEOUT_S))
    assert {tp for tp in metadata.partitions if tp[0] == TOPIC} == {(TOPIC, 0), (TOPIC, 1), (TOPIC, 2)}

    async def write() -> dict[tuple[str, int], str]:
        peers = PeerChannels()
        try:
            writer = GrpcMarkerWriter(metadata, peers, coordinator_epoch=1, timeout_ms=5_000)
            answers = writer.write_markers(
                PRODUCER_ID, 0, False, frozenset({(TOPIC, 0), (TOPIC, 2), (TOPIC, 9)})
            )
            return dict(await asyncio.wait_for(answers, CALL_TIMEOUT_S * 2))
        finally:
            await peers.close()

    answers = asyncio.run(write())
    assert answers == {(TOPIC, 0): MARKER_WRITTEN, (TOPIC, 2): MARKER_WRITTEN, (TOPIC, 9): NO_LEADER}
    for partition, aborted in ((0, [(PRODUCER_ID, 0)]), (1, []), (2, [(PRODUCER_ID, 0)])):
        request = consumer_fetch(TOPIC, partition, 0, max_bytes=1 << 20, partition_max_bytes=1 << 20)
        request.isolation_level = 1
        part = gw.Fetch(request, timeout=CALL_TIMEOUT_S).topics[0].partitions[0]
        assert part.error_code == common_pb2.NONE
        assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == aborted, partition
        assert part.high_watermark == part.last_stable_offset == len(aborted)
