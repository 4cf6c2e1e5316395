"""What security costs: produce throughput with TLS off vs on, alternating runs in one invocation.

Two local clusters side by side (etcd, a controller, 3 brokers, a gateway each):

- plain:  today's default, plaintext everywhere, no interceptor;
- secure: --tls-dir (TLS on every listener, mutual TLS between services and to
          etcd) and, unless --no-acl, --authorizer acl with one Write ACL for the
          benchmark's client certificate: the configuration docs/SECURITY.md
          recommends, so the figure is the price of turning security on.

The workload is the same for both: raw Produce requests through the gateway,
acks=all, a topic of 3 partitions with RF 3 and min.insync.replicas 2 (so every
byte also crosses two follower fetches, mutual TLS in the secure cluster),
pre-encoded batches, `--in-flight` requests outstanding. Runs alternate
plain, secure, plain, secure... so the machine's drifting load (2 shared
cores) hits both alike; the figure is the ratio of the medians, with the CPU
seconds every process used per MB to show where the cost lands.

    python bench/tls_cost.py                  # 3 runs of 8 s per mode
    python bench/tls_cost.py --runs 5 --seconds 10 --batch-kib 64

Writes bench/results/tls_cost.json (tls_cost_no_acl.json with --no-acl); bench/RESULTS.md has the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common

if TYPE_CHECKING:
    from clients.tls import ClientTls
    from services.launcher.local_cluster import LocalCluster

TOPIC = "tls-cost"
PARTITIONS = 3
RECORD_BYTES = 1000
PRODUCE_TIMEOUT_MS = 10_000
BENCH_PRINCIPAL = "bench"


@contextlib.contextmanager
def clusters(base: Path, *, acl: bool) -> Iterator[dict[str, LocalCluster]]:
    """Both clusters started, the topic ready on each; every process stopped by pid on the way out."""
    from services.launcher.local_cluster import LocalCluster

    secure_args = ["--authorizer", "acl", "--super-users", "User:admin"] if acl else []
    plain = LocalCluster(base / "plain", brokers=3)
    secure = LocalCluster(base / "secure", brokers=3, tls=True, service_args=secure_args)
    try:
        plain.start()
        secure.start()
        secure.issue_client_certificate(BENCH_PRINCIPAL)
        if acl:
            _allow_write(secure)
        yield {"plain": plain, "secure": secure}
    finally:
        secure.stop()
        plain.stop()


def _allow_write(cluster: LocalCluster) -> None:
    from coordinator.acls import add_acls
    from coordinator.store import EtcdStore
    from services.security.authz import AclBinding

    async def add() -> None:
        store = await EtcdStore.connect(cluster.etcd_endpoint, tls=cluster.etcd_tls())
        try:
            await add_acls(
                store,
                [
                    AclBinding.of(f"User:{BENCH_PRINCIPAL}", op, "Topic", TOPIC).to_dict()
                    for op in ("Write", "Describe")
                ],
            )
        finally:
            await store.close()

    asyncio.run(add())


def _credentials(cluster: LocalCluster, name: str) -> ClientTls | None:
    from clients.tls import ClientTls

    s = cluster.client_settings(name)
    if not s:
        return None
    return ClientTls.from_settings(
        ssl_cafile=s["ssl_cafile"],
        ssl_certfile=s.get("ssl_certfile"),
        ssl_keyfile=s.get("ssl_keyfile"),
        auth_token=None,
    )


def create_topic(cluster: LocalCluster) -> None:
    """As the admin (a super user on the secure cluster); waits for a full ISR everywhere."""
    import grpc

    from protos.highwater.v1 import common_pb2, gateway_pb2_grpc

    creds = _credentials(cluster, "admin")
    address = cluster.gateway_addresses[0]
    channel = creds.channel(address) if creds is not None else grpc.insecure_channel(address)
    stub = gateway_pb2_grpc.GatewayServiceStub(channel)  # type: ignore[no-untyped-call]  # generated, unannotated
    resp = stub.CreateTopics(
        common.create_topics_request(TOPIC, num_partitions=PARTITIONS, replication_factor=3, min_insync=2),
        timeout=30,
    )
    if resp.topics[0].error_code not in (common_pb2.NONE, common_pb2.TOPIC_ALREADY_EXISTS):
        raise SystemExit(f"CreateTopics on {address}: {resp.topics[0].error_message}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        d = stub.DescribeCluster(common_pb2.DescribeClusterRequest(), timeout=10)
        states = [p for p in d.partitions if p.topic == TOPIC]
        if len(states) == PARTITIONS and all(p.leader >= 0 and len(p.isr) == 3 for p in states):
            channel.close()
            return
        time.sleep(0.1)
    raise SystemExit(f"{TOPIC} on {address}: no full ISR within 30 s")


async def produce_run(
    cluster: LocalCluster, seconds: float, batch_bytes: int, in_flight: int
) -> dict[str, float]:
    """Produce for `seconds`; acknowledged MB/s and requests/s."""
    import grpc

    from clients.common.records import encode_values
    from clients.connection import CHANNEL_OPTIONS
    from protos.highwater.v1 import common_pb2, gateway_pb2_grpc

    creds = _credentials(cluster, BENCH_PRINCIPAL)
    address = cluster.gateway_addresses[0]
    channel = (
        creds.aio_channel(address, CHANNEL_OPTIONS)
        if creds is not None
        else grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    )
    stub = gateway_pb2_grpc.GatewayServiceStub(channel)  # type: ignore[no-untyped-call]  # generated, unannotated
    values = [b"v" * RECORD_BYTES] * max(1, batch_bytes // (RECORD_BYTES + 10))
    totals = {"bytes": 0, "requests": 0, "errors": 0}
    next_partition = 0

    async def worker(stop_at: float) -> None:
        nonlocal next_partition
        while time.perf_counter() < stop_at:
            partition = next_partition % PARTITIONS
            next_partition += 1
            records = encode_values(values, timestamp_ms=time.time_ns() // 1_000_000, compression="none")
            request = common.produce_request(TOPIC, [(partition, records)], timeout_ms=PRODUCE_TIMEOUT_MS)
            try:
                resp = await stub.Produce(request, timeout=PRODUCE_TIMEOUT_MS / 1000 + 5)
            except grpc.aio.AioRpcError:
                totals["errors"] += 1
                continue
            if resp.topics[0].partitions[0].error_code == common_pb2.NONE:
                totals["bytes"] += len(records)
                totals["requests"] += 1
            else:
                totals["errors"] += 1

    try:
        await asyncio.wait_for(channel.channel_ready(), 10)
        await asyncio.gather(*(worker(time.perf_counter() + 1.0) for _ in range(in_flight)))  # warm-up
        totals.update(bytes=0, requests=0, errors=0)
        start = time.perf_counter()
        await asyncio.gather(*(worker(start + seconds) for _ in range(in_flight)))
        elapsed = time.perf_counter() - start
    finally:
        await channel.close()
    return {
        "mb_per_s": round(totals["bytes"] / elapsed / 1e6, 2),
        "requests_per_s": round(totals["requests"] / elapsed, 1),
        "errors": totals["errors"],
        "seconds": round(elapsed, 2),
        "mb": round(totals["bytes"] / 1e6, 2),
    }


def _pids(cluster: LocalCluster) -> dict[str, int]:
    pids = {name: p.pid for name, p in cluster.processes.items() if p.pid}
    if cluster.etcd.pid:
        pids["etcd"] = cluster.etcd.pid
    return pids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="Runs per mode (alternating).")
    parser.add_argument("--seconds", type=float, default=8.0, help="Length of each run.")
    parser.add_argument("--batch-kib", type=int, default=64, help="Bytes per produce request (one batch).")
    parser.add_argument("--in-flight", type=int, default=4, help="Produce requests outstanding at once.")
    parser.add_argument("--no-acl", action="store_true", help="Secure cluster without --authorizer acl.")
    parser.add_argument("--tmp-dir", default=None, help="Where the clusters' data goes (default: /tmp).")
    args = parser.parse_args()

    result: dict[str, object] = {
        **common.header(),
        "settings": vars(args)
        | {"record_bytes": RECORD_BYTES, "partitions": PARTITIONS, "replication_factor": 3, "acks": "all"},
    }
    result["load"] = common.wait_for_quiet()
    runs: dict[str, list[dict[str, object]]] = {"plain": [], "secure": []}
    mb_per_s: dict[str, list[float]] = {"plain": [], "secure": []}
    cpu_s_per_mb_total: dict[str, list[float]] = {"plain": [], "secure": []}
    with (
        tempfile.TemporaryDirectory(prefix="hw-tls-cost-", dir=args.tmp_dir) as tmp,
        clusters(Path(tmp), acl=not args.no_acl) as both,
    ):
        for cluster in both.values():
            create_topic(cluster)
        for i in range(args.runs):
            for mode, cluster in both.items():
                meter = common.CpuMeter(_pids(cluster)).start()
                figures = asyncio.run(
                    produce_run(cluster, args.seconds, args.batch_kib * 1024, args.in_flight)
                )
                cpu = meter.stop()
                mb = max(figures["mb"], 1e-9)
                cpu_s_per_mb = {name: round(v["cpu_s"] / mb, 4) for name, v in cpu.items()}
                load_1m = common.load_average()
                runs[mode].append({**figures, "cpu_s_per_mb": cpu_s_per_mb, "load_1m": load_1m})
                mb_per_s[mode].append(figures["mb_per_s"])
                cpu_s_per_mb_total[mode].append(cpu_s_per_mb["total"])
                print(
                    f"run {i + 1} {mode:>6}: {figures['mb_per_s']:7.2f} MB/s, "
                    f"{figures['requests_per_s']:6.1f} req/s, "
                    f"errors {figures['errors']}, CPU s/MB total {cpu_s_per_mb['total']:.3f}, "
                    f"load {load_1m}",
                    flush=True,
                )
    med = {mode: statistics.median(values) for mode, values in mb_per_s.items()}
    cpu_med = {mode: statistics.median(values) for mode, values in cpu_s_per_mb_total.items()}
    ratio = med["secure"] / med["plain"] if med["plain"] else 0.0
    result.update(
        runs=runs,
        median_mb_per_s=med,
        median_cpu_s_per_mb=cpu_med,
        ratio_secure_to_plain=round(ratio, 3),
        cpu_ratio_secure_to_plain=round(cpu_med["secure"] / cpu_med["plain"], 3)
        if cpu_med["plain"]
        else None,
    )
    label = "TLS + mTLS + ACL" if not args.no_acl else "TLS + mTLS"
    print(
        f"median plain {med['plain']:.2f} MB/s, {label} {med['secure']:.2f} MB/s: ratio {ratio:.3f} "
        f"({(1 - ratio) * 100:.1f}% less throughput); CPU s per MB plain {cpu_med['plain']:.3f}, "
        f"secure {cpu_med['secure']:.3f}"
    )
    path = common.write_result("tls_cost_no_acl" if args.no_acl else "tls_cost", result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
