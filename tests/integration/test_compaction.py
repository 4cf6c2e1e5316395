"""Compacted topics on a real cluster (issue 39): the log cleaner of every replica, under load.

A compacted topic with small segments takes the issue's load (100,000 updates over 1,000 keys,
then tombstones for 100 of them) while the cleaner runs (every 200 ms, throttled so passes take a
while) and a consumer reads, and while brokers are SIGKILLed and restarted at random moments.
Afterwards, read from the brokers' data directories: below each replica's cleaning point the
segment files hold at most one record per key, every replica gives the same key -> (offset,
value) map, the deleted keys are gone once delete.retention.ms has passed, and a consumer reads
every live key's latest acknowledged value.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from clients.common.record_batch import iter_batch_headers
from clients.common.records import Record, decode_batches, encode_batch
from protos.highwater.v1 import common_pb2, gateway_pb2_grpc
from services.broker.log import checkpoints

from .conftest import TestCluster
from .helpers import consumer_fetch, create_topic, gateway_stub, produce_batch, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "compacted"
KEYS = 1_000
UPDATES = 100_000
DELETED = 100
BATCH = 200
DELETE_RETENTION_MS = 3_000
SEGMENT_BYTES = 16 * 1024
KILL_ROUNDS = 4
# Throttled hard, so a pass over these small segments takes about a second and a kill at a random
# moment often lands inside one (the test counts the kills that left a cleaned file behind).
CLEANER_BYTES_PER_SECOND = 64 * 1024


def key(i: int) -> bytes:
    return b"k%04d" % i


def produce_acked(
    gw: gateway_pb2_grpc.GatewayServiceStub, records: Sequence[tuple[bytes, bytes | None]]
) -> None:
    """Produce one batch with acks=all, retrying until acknowledged (a retry may write it twice: the
    same values at later offsets, so each key's latest value is still the last acknowledged one)."""
    now = int(time.time() * 1000)
    batch = encode_batch([Record(k, v, [], now) for k, v in records])
    deadline = time.monotonic() + 60
    while True:
        try:
            result = produce_batch(gw, TOPIC, 0, batch, timeout_ms=5_000, timeout=10)
            if result.error_code == common_pb2.NONE:
                return
        except Exception:  # the gateway or a leader is moving: retried
            pass
        if time.monotonic() > deadline:
            raise AssertionError("a produce was not acknowledged within 60 s")
        time.sleep(0.2)


def read_partition(gw: gateway_pb2_grpc.GatewayServiceStub, *, timeout_s: float = 30) -> list[Record]:
    """Every record of the partition below the HW, read through holes (by batch ends, not record counts)."""
    out: list[Record] = []
    offset = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            resp = gw.Fetch(
                consumer_fetch(TOPIC, 0, offset, min_bytes=1, max_bytes=8 << 20, partition_max_bytes=4 << 20)
            )
        except Exception:
            time.sleep(0.2)
            continue
        pr = resp.topics[0].partitions[0]
        if pr.error_code != common_pb2.NONE:
            time.sleep(0.2)
            continue
        if offset < pr.log_start_offset:
            offset = pr.log_start_offset
        headers = list(iter_batch_headers(pr.records))
        out += [r for r in decode_batches(pr.records) if r.offset >= offset]
        if headers:
            offset = max(offset, headers[-1].next_offset)
        if offset >= pr.high_watermark:
            return out
    raise AssertionError(f"could not read {TOPIC}-0 up to its high watermark within {timeout_s} s")


def latest(records: list[Record]) -> dict[bytes, tuple[int, bytes | None]]:
    out: dict[bytes, tuple[int, bytes | None]] = {}
    for r in records:
        assert r.key is not None
        out[r.key] = (r.offset, r.value)
    return out


def replica_files(cluster: TestCluster, broker_id: int) -> tuple[list[tuple[int, list[Record]]], int | None]:
    """The replica's segments (base offset, records) from its data directory, and its cleaning point."""
    directory = Path(cluster.base_dir) / f"broker-{broker_id}" / f"{TOPIC}-0"
    segments: list[tuple[int, list[Record]]] = []
    for name in sorted(os.listdir(directory)):
        stem, _, suffix = name.partition(".")
        if suffix != "log" or not stem.isdigit():
            continue
        try:
            data = (directory / name).read_bytes()
        except FileNotFoundError:  # swapped away meanwhile: the caller reads again
            continue
        segments.append((int(stem), list(decode_batches(data))))
    point: int | None = None
    try:
        lines = (directory / checkpoints.CLEANER_OFFSET_CHECKPOINT).read_text().split()
        point = int(lines[2])
    except (FileNotFoundError, IndexError, ValueError):
        point = None
    return segments, point


def test_compacted_topic_cleaned_under_load_and_kills(make_cluster: Callable[..., TestCluster]) -> None:
    rng = random.Random(39)
    cluster = make_cluster(
        brokers=3,
        broker_args=[
            "--log-cleaner-backoff-ms",
            "200",
            "--log-cleaner-io-max-bytes-per-second",
            str(CLEANER_BYTES_PER_SECOND),
        ],
    )
    gw = gateway_stub(cluster.gateway_address)
    result = create_topic(
        gw,
        TOPIC,
        partitions=1,
        replication_factor=3,
        configs={
            "cleanup.policy": "compact",
            "segment.bytes": str(SEGMENT_BYTES),
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": str(DELETE_RETENTION_MS),
        },
    )
    assert result.error_code == common_pb2.NONE, result.error_message
    wait_for(lambda: _leader_known(gw), timeout_s=30, what="a leader for the compacted partition")

    expected: dict[bytes, bytes | None] = {}
    kills_mid_cleaning = 0
    version = 0

    # A consumer reads while the cleaner works: offsets only grow and every batch decodes.
    stop_reading = threading.Event()
    reader_errors: list[str] = []
    reads = [0]

    def reader() -> None:
        rgw = gateway_stub(cluster.gateway_address)
        while not stop_reading.is_set():
            try:
                records = read_partition(rgw, timeout_s=20)
            except AssertionError as error:
                reader_errors.append(str(error))
                return
            offsets = [r.offset for r in records]
            if offsets != sorted(set(offsets)):
                reader_errors.append("offsets not strictly increasing in one read")
                return
            reads[0] += 1

    reading = threading.Thread(target=reader, daemon=True)
    reading.start()

    kill_at = sorted(rng.sample(range(UPDATES // BATCH // 4, UPDATES // BATCH), KILL_ROUNDS))
    try:
        for n in range(UPDATES // BATCH):
            records = []
            for _ in range(BATCH):
                k = key(rng.randrange(KEYS))
                version += 1
                records.append((k, b"%s=%d" % (k, version)))
            produce_acked(gw, records)
            expected.update(records)
            if n in kill_at:
                victim = rng.choice(cluster.broker_ids)
                cluster.kill_broker(victim)  # SIGKILL, whatever the cleaner is doing
                if _mid_cleaning(cluster, victim):
                    kills_mid_cleaning += 1
                time.sleep(rng.uniform(0.2, 1.5))
                cluster.start_broker(victim)
        deleted = [key(i) for i in rng.sample(range(KEYS), DELETED)]
        produce_acked(gw, [(k, None) for k in deleted])
        for k in deleted:
            expected[k] = None
        live = [k for k in expected if expected[k] is not None]
        # More updates of live keys, so the tombstones leave the active segment and get cleaned.
        for _ in range(40):
            records = []
            for _ in range(BATCH):
                k = rng.choice(live)
                version += 1
                records.append((k, b"%s=%d" % (k, version)))
            produce_acked(gw, records)
            expected.update(records)
    finally:
        stop_reading.set()
        reading.join(timeout=30)
    assert not reader_errors, reader_errors
    print(f"{kills_mid_cleaning} of {KILL_ROUNDS} kills left a cleaning pass's file behind")
    assert reads[0] > 0

    want = {k: v for k, v in expected.items() if v is not None}

    def replicas_cleaned() -> dict[int, dict[bytes, tuple[int, bytes | None]]] | None:
        maps: dict[int, dict[bytes, tuple[int, bytes | None]]] = {}
        for broker_id in cluster.broker_ids:
            segments, point = replica_files(cluster, broker_id)
            if point is None or len(segments) < 2 or point < segments[-1][0]:
                return None  # not every inactive segment cleaned yet
            below = [r for _, records in segments for r in records if r.offset < point]
            keys_below = [r.key for r in below]
            if len(keys_below) != len(set(keys_below)):
                return None
            if any(r.value is None for r in below):
                return None  # tombstones still inside delete.retention.ms
            maps[broker_id] = latest([r for _, records in segments for r in records])
        return maps

    maps = wait_for(
        replicas_cleaned, timeout_s=90, interval_s=0.5, what="every replica cleaned, tombstones gone"
    )
    assert maps is not None
    # Every replica's files give the same key -> (offset, value) map: the acknowledged latest values.
    first = maps[cluster.broker_ids[0]]
    assert all(m == first for m in maps.values()), "replicas disagree on the latest value per key"
    assert {k: v for k, (_, v) in first.items()} == want
    # A consumer reads every key's latest value (and no deleted key) through the holes.
    consumed = latest(read_partition(gw))
    assert {k: v for k, (_, v) in consumed.items()} == want
    assert {k: o for k, (o, _) in consumed.items()} == {k: o for k, (o, _) in first.items()}
    # And the log shrank: the cleaned part holds one record per key, not the updates.
    segments, point = replica_files(cluster, cluster.broker_ids[0])
    assert point is not None and sum(len(r) for _, r in segments) < UPDATES // 4


def _mid_cleaning(cluster: TestCluster, broker_id: int) -> bool:
    """Whether the killed broker's log directory holds a cleaned segment or a swap in progress."""
    directory = Path(cluster.base_dir) / f"broker-{broker_id}" / f"{TOPIC}-0"
    return any(".cleaned" in name or name.endswith(".swap") for name in os.listdir(directory))


def _leader_known(gw: gateway_pb2_grpc.GatewayServiceStub) -> bool:
    try:
        md = gw.Metadata(common_pb2.MetadataRequest(topics=[TOPIC]))
    except Exception:
        return False
    return bool(md.topics) and bool(md.topics[0].partitions) and md.topics[0].partitions[0].leader >= 0
