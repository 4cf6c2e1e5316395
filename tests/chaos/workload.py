"""What every chaos scenario shares: the acks=all load, reading logs back, bounded waits on cluster state.

Used by the pytest chaos tests (test_chaos.py, test_reassignment_chaos.py) and
by the network-partition scenarios, which run inside a network namespace
(partition_scenarios.py). Everything talks to the gateway through raw gRPC,
as the integration tests do; nothing here mocks anything.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

import grpc

from clients.common.records import decode_batches
from protos.highwater.v1 import common_pb2
from services.launcher.local_cluster import LocalCluster
from tests.chaos.history import ACKNOWLEDGED, RPC_FAILED, History
from tests.integration.helpers import consumer_fetch, gateway_stub, produce

RECOVERY_TIMEOUT_S = 60.0
WRITE_TIMEOUT_MS = 10_000
# Poll interval of every bounded wait on cluster state (DescribeCluster through the gateway).
STATE_POLL_INTERVAL_S = 0.1
# How long read_logs may take to read one partition up to its high watermark.
READ_BACK_TIMEOUT_S = 30.0
# A writer whose gateway call failed waits this long before the next, so a dead gateway is not spun on.
WRITE_RETRY_PAUSE_S = 0.05


def cluster_state(c: LocalCluster, topic: str) -> dict[int, common_pb2.PartitionState] | None:
    """partition -> state of topic, as the active controller sees it (None while it cannot be asked)."""
    try:
        resp = gateway_stub(c.gateway_address).DescribeCluster(common_pb2.DescribeClusterRequest(), timeout=5)
    except grpc.RpcError:
        return None
    if resp.error_code:
        return None
    return {p.partition: p for p in resp.partitions if p.topic == topic}


def wait_for_state(
    c: LocalCluster,
    topic: str,
    partitions: int,
    what: str,
    ok: Callable[[common_pb2.PartitionState], bool],
    timeout_s: float = RECOVERY_TIMEOUT_S,
) -> dict[int, common_pb2.PartitionState]:
    """Poll until every partition of topic satisfies ok; fail with the last state seen after timeout_s."""
    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
        state = cluster_state(c, topic)
        if state and len(state) == partitions and all(ok(p) for p in state.values()):
            return state
        time.sleep(STATE_POLL_INTERVAL_S)
    raise AssertionError(
        f"timed out after {timeout_s} s waiting for {what}; last state: {describe_state(state)}"
    )


def wait_healthy(
    c: LocalCluster,
    topic: str,
    partitions: int,
    what: str,
    *,
    replicas: int = 3,
    timeout_s: float = RECOVERY_TIMEOUT_S,
) -> dict[int, common_pb2.PartitionState]:
    """Every partition led by a live broker with a full ISR (bounded)."""
    return wait_for_state(
        c,
        topic,
        partitions,
        f"a leader and a full ISR on every partition after {what}",
        lambda p: p.leader > 0 and len(p.isr) == replicas,
        timeout_s,
    )


def describe_state(state: dict[int, common_pb2.PartitionState] | None) -> str:
    if state is None:
        return "unknown (no answer from the gateway)"
    return "; ".join(
        f"p{p}: leader {s.leader} epoch {s.leader_epoch} isr {list(s.isr)} replicas {list(s.replicas)}"
        for p, s in sorted(state.items())
    )


class Workload:
    """acks=all writers and one reader, all against the gateway, until stopped.

    Each writer sends one record per request, cycling over the partitions, and
    records every attempt (History.attempt) and every acknowledgement
    (History.ack). The reader long-polls every partition from offset 0 and
    records what it consumed in order.
    """

    def __init__(
        self, c: LocalCluster, history: History, topic: str, partitions: int, writers: int = 2
    ) -> None:
        self.c = c
        self.history = history
        self.topic = topic
        self.partitions = partitions
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._write, args=(w,), daemon=True) for w in range(writers)]
        self.threads.append(threading.Thread(target=self._read, daemon=True))

    def __enter__(self) -> Workload:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=WRITE_TIMEOUT_MS / 1000 + 10)

    def _write(self, writer: int) -> None:
        gw = gateway_stub(self.c.gateway_address)
        seq = 0
        while not self.stop.is_set():
            partition = seq % self.partitions
            tp = (self.topic, partition)
            value = f"w{writer}-{seq}".encode()
            seq += 1
            started = time.monotonic()
            try:
                res = produce(gw, self.topic, partition, [value], timeout_ms=WRITE_TIMEOUT_MS)
            except grpc.RpcError:
                self.history.attempt(tp, started, time.monotonic(), RPC_FAILED)
                self.history.fail()
                time.sleep(WRITE_RETRY_PAUSE_S)
                continue
            finished = time.monotonic()
            if res.error_code == common_pb2.NONE:
                self.history.ack(tp, res.base_offset, value)
                self.history.attempt(tp, started, finished, ACKNOWLEDGED)
            else:
                self.history.attempt(tp, started, finished, common_pb2.ErrorCode.Name(res.error_code))
                self.history.fail()

    def _read(self) -> None:
        gw = gateway_stub(self.c.gateway_address)
        positions = dict.fromkeys(range(self.partitions), 0)
        while not self.stop.is_set():
            for p in range(self.partitions):
                try:
                    request = consumer_fetch(
                        self.topic,
                        p,
                        positions[p],
                        max_wait_ms=100,
                        min_bytes=1,
                        max_bytes=1 << 20,
                        partition_max_bytes=1 << 20,
                    )
                    resp = gw.Fetch(request, timeout=10)
                except grpc.RpcError:
                    time.sleep(WRITE_RETRY_PAUSE_S)
                    continue
                pr = resp.topics[0].partitions[0]
                if pr.error_code:
                    continue
                for r in decode_batches(pr.records):
                    if r.offset >= positions[p]:
                        self.history.consume("reader", (self.topic, p), r.offset, r.value or b"")
                        positions[p] = r.offset + 1


def read_logs(c: LocalCluster, topic: str, partitions: int) -> dict[tuple[str, int], list[tuple[int, bytes]]]:
    """Every partition of topic read back through the gateway up to its high watermark."""
    gw = gateway_stub(c.gateway_address)
    out: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for p in range(partitions):
        records: list[tuple[int, bytes]] = []
        offset = 0
        deadline = time.monotonic() + READ_BACK_TIMEOUT_S
        while time.monotonic() < deadline:
            resp = gw.Fetch(
                consumer_fetch(topic, p, offset, max_bytes=8 << 20, partition_max_bytes=8 << 20), timeout=10
            )
            pr = resp.topics[0].partitions[0]
            if pr.error_code:
                time.sleep(STATE_POLL_INTERVAL_S)
                continue
            batch = [(r.offset, r.value or b"") for r in decode_batches(pr.records) if r.offset >= offset]
            records.extend(batch)
            if batch:
                offset = batch[-1][0] + 1
            if offset >= pr.high_watermark:
                break
        out[(topic, p)] = records
    return out


def wait_for_acks(history: History, count: int, timeout_s: float) -> bool:
    """Wait (bounded) until history holds count acknowledged writes; whether it does."""
    deadline = time.monotonic() + timeout_s
    while history.acked_count < count and time.monotonic() < deadline:
        time.sleep(WRITE_RETRY_PAUSE_S)
    return history.acked_count >= count


def acks_per_partition(
    history: History, tps: Iterable[tuple[str, int]], start_s: float, end_s: float
) -> dict[tuple[str, int], int]:
    """How many writes to each of tps were sent at or after start_s and acknowledged by end_s."""
    wanted = set(tps)
    counts = dict.fromkeys(wanted, 0)
    for a in history.attempts_within(wanted, start_s, end_s):
        if a.outcome == ACKNOWLEDGED:
            counts[a.tp] += 1
    return counts


def read_replica_logs(
    c: LocalCluster, topic: str, partitions: int
) -> dict[int, dict[tuple[str, int], list[tuple[int, bytes]]]]:
    """broker -> partition -> every record of its replica's segment files, read from disk.

    Meant for a stopped cluster (or a broker cut off from everyone): files being
    appended to are read only up to their last whole batch.
    """
    out: dict[int, dict[tuple[str, int], list[tuple[int, bytes]]]] = {}
    for broker in c.broker_ids:
        out[broker] = {}
        for p in range(partitions):
            records = replica_log(c, broker, topic, p)
            if records is not None:
                out[broker][(topic, p)] = records
    return out


def replica_log(c: LocalCluster, broker: int, topic: str, partition: int) -> list[tuple[int, bytes]] | None:
    """The records of one replica's segment files in offset order (None: the broker has no such replica)."""
    directory = c.base_dir / f"broker-{broker}" / f"{topic}-{partition}"
    if not directory.is_dir():
        return None
    records: list[tuple[int, bytes]] = []
    # Segment files are named by their zero-padded base offset, so name order is offset order.
    for segment in sorted(directory.glob("*.log")):
        records.extend((r.offset, r.value or b"") for r in decode_batches(segment.read_bytes()))
    return records
