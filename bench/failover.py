"""Recovery figures of the controller (issue: Controller), on a real local cluster.

1. broker failure: a broker leading N partitions (default 1,000) is killed with
   SIGKILL; the figure is the time from the kill until every one of those
   partitions accepts an acks=all write again, for each lease TTL given
   (default 2 s and 6 s). Target: within the lease TTL + 1 s.
2. controller takeover: with P partitions (default 10,000, replication factor
   1 to keep 2 cores sane), the active controller is stopped and the figure is
   the time from its stop until the standby answers DescribeCluster with every
   partition (load from etcd + LeaderAndIsr/UpdateMetadata queued). Measured
   after a clean stop (lease revoked at once) so the lease TTL is not counted.
   Target: under 2 s.
3. controlled shutdown: SIGTERM to a broker leading N partitions until its
   process exits, all leaderships moved. Target: under 2 s.

Prints each figure, its target and the ratio, and writes JSON to
bench/results/failover.json. Usage: python bench/failover.py --help
"""

from __future__ import annotations

import argparse
import datetime
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/failover.py` from anywhere

from bench import common
from clients.common.records import Record, encode_batch
from clients.tools.local_cluster import LocalCluster
from protos.highwater.v1 import common_pb2, controller_pb2_grpc, gateway_pb2_grpc

RESULTS = Path(__file__).resolve().parent / "results"


def gateway(cluster: LocalCluster) -> gateway_pb2_grpc.GatewayServiceStub:
    return gateway_pb2_grpc.GatewayServiceStub(
        grpc.insecure_channel(
            cluster.gateway_addresses[0], options=[("grpc.max_receive_message_length", 64 << 20)]
        )
    )


def create_led_by(
    gw: gateway_pb2_grpc.GatewayServiceStub, topic: str, partitions: int, replicas: list[int], min_isr: int
) -> None:
    """A topic whose every partition has the same replica list, so replicas[0] leads them all."""
    assignments = {p: common_pb2.ReplicaList(replicas=replicas) for p in range(partitions)}
    resp = gw.CreateTopics(
        common.create_topics_request(
            topic,
            num_partitions=-1,
            replication_factor=-1,
            assignments=assignments,
            min_insync=min_isr,
            timeout_ms=120_000,
        ),
        timeout=300,
    )
    if resp.topics[0].error_code:
        raise SystemExit(f"CreateTopics failed: {resp.topics[0].error_message}")


def produce_all(
    gw: gateway_pb2_grpc.GatewayServiceStub, topic: str, partitions: list[int], timeout_ms: int
) -> set[int]:
    """One acks=all Produce for all partitions; returns those that succeeded."""
    batch = encode_batch([Record(None, b"x" * 100, [], int(time.time() * 1000))])
    req = common.produce_request(topic, ((p, batch) for p in partitions), timeout_ms=timeout_ms)
    try:
        resp = gw.Produce(req, timeout=timeout_ms / 1000 + 5)
    except grpc.RpcError:
        return set()
    return {p.partition for t in resp.topics for p in t.partitions if p.error_code == 0}


def wait_all_ok(
    gw: gateway_pb2_grpc.GatewayServiceStub, topic: str, partitions: int, deadline_s: float
) -> float:
    """Seconds until every partition accepted an acks=all write (inf if never within deadline)."""
    start = time.monotonic()
    pending = set(range(partitions))
    while pending and time.monotonic() - start < deadline_s:
        pending -= produce_all(gw, topic, sorted(pending), timeout_ms=1000)
        if pending:
            time.sleep(0.05)
    return time.monotonic() - start if not pending else float("inf")


def bench_broker_failure(partitions: int, ttl_s: int, base: Path, run: int) -> dict[str, object]:
    with LocalCluster(base / f"broker-failure-ttl{ttl_s}-run{run}", brokers=3, lease_ttl_s=ttl_s) as cluster:
        gw = gateway(cluster)
        create_led_by(gw, "led", partitions, [1, 2, 3], min_isr=2)
        warm = wait_all_ok(gw, "led", partitions, deadline_s=120)
        if warm == float("inf"):
            raise SystemExit("the topic never accepted writes before the kill")
        killed_wall = time.time()
        cluster.kill("broker-1")
        recovered = wait_all_ok(gw, "led", partitions, deadline_s=ttl_s * 10 + 30)
        # wait_all_ok started right after the kill, so its time is the time since the kill.
        detected = detection_time(cluster.processes["controller-1"].log_path, killed_wall)
        return {
            "partitions": partitions,
            "lease_ttl_s": ttl_s,
            "recovery_s": round(recovered, 3),
            "lease_expiry_seen_s": detected,
            "target_s": ttl_s + 1,
            "ratio_to_target": round(recovered / (ttl_s + 1), 3),
        }


def detection_time(controller_log: Path, killed_wall: float) -> float | None:
    """Seconds from the kill until the controller logged broker 1 leaving (its lease expired)."""
    for line in controller_log.read_text(errors="replace").splitlines():
        if "brokers [1" not in line or " left " not in line:
            continue
        try:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        if stamp >= killed_wall:
            return round(stamp - killed_wall, 3)
    return None


def bench_controller_takeover(partitions: int, base: Path) -> dict[str, object]:
    topics = max(1, partitions // 1000)
    per_topic = partitions // topics
    with LocalCluster(base / "takeover", brokers=3, controllers=2, lease_ttl_s=6) as cluster:
        gw = gateway(cluster)
        for i in range(topics):
            assignments = {p: common_pb2.ReplicaList(replicas=[1 + (p + i) % 3]) for p in range(per_topic)}
            resp = gw.CreateTopics(
                common.create_topics_request(
                    f"t{i}",
                    num_partitions=-1,
                    replication_factor=-1,
                    assignments=assignments,
                    timeout_ms=120_000,
                ),
                timeout=300,
            )
            if resp.topics[0].error_code:
                raise SystemExit(resp.topics[0].error_message)
        active = next(
            p
            for p in cluster.by_kind("controller")
            if gateway(cluster).DescribeCluster(common_pb2.DescribeClusterRequest()).controller_id
            == int(p.name.split("-")[1])
        )
        standby = next(p for p in cluster.by_kind("controller") if p is not active)
        stub = controller_pb2_grpc.ControllerServiceStub(
            grpc.insecure_channel(standby.address, options=[("grpc.max_receive_message_length", 64 << 20)])
        )
        stopped = time.monotonic()
        cluster.terminate(active.name)
        stop_s = time.monotonic() - stopped
        while time.monotonic() - stopped < 120:
            resp = stub.DescribeCluster(common_pb2.DescribeClusterRequest(), timeout=30)
            if resp.error_code == 0 and len(resp.partitions) >= topics * per_topic:
                break
            time.sleep(0.02)
        takeover = time.monotonic() - stopped
        return {
            "partitions": topics * per_topic,
            "takeover_s": round(takeover, 3),
            "old_controller_stop_s": round(stop_s, 3),
            "target_s": 2.0,
            "ratio_to_target": round(takeover / 2, 3),
        }


def bench_controlled_shutdown(partitions: int, base: Path) -> dict[str, object]:
    with LocalCluster(base / "controlled-shutdown", brokers=3, lease_ttl_s=6) as cluster:
        gw = gateway(cluster)
        create_led_by(gw, "led", partitions, [1, 2, 3], min_isr=2)
        if wait_all_ok(gw, "led", partitions, deadline_s=120) == float("inf"):
            raise SystemExit("the topic never accepted writes")
        proc = cluster.processes["broker-1"].proc
        assert proc is not None
        before = gw.DescribeCluster(common_pb2.DescribeClusterRequest())
        led_before = sum(1 for p in before.partitions if p.topic == "led" and p.leader == 1)
        if led_before != partitions:
            raise SystemExit(f"broker 1 leads {led_before} of {partitions} partitions before the shutdown")
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        moved = float("inf")
        while time.monotonic() - started < 60:
            resp = gw.DescribeCluster(common_pb2.DescribeClusterRequest())
            if not any(p.topic == "led" and p.leader == 1 for p in resp.partitions):
                moved = time.monotonic() - started
                break
            time.sleep(0.1)  # a DescribeCluster of 1,000 partitions costs the controller CPU too
        code = proc.wait(timeout=60)
        took = time.monotonic() - started
        resp = gw.DescribeCluster(common_pb2.DescribeClusterRequest())
        still_led = sum(1 for p in resp.partitions if p.topic == "led" and p.leader == 1)
        # The figure is the time until every leadership moved away (what clients notice);
        # the process then closes its logs (checkpoints, clean-shutdown markers) and exits.
        return {
            "partitions": partitions,
            "controlled_shutdown_s": round(moved, 3),
            "process_exit_s": round(took, 3),
            "exit_code": code,
            "partitions_still_led": still_led,
            "target_s": 2.0,
            "ratio_to_target": round(moved / 2, 3),
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=1000, help="partitions led by the failing broker")
    parser.add_argument("--ttls", type=int, nargs="+", default=[2, 6], help="lease TTLs to measure, seconds")
    parser.add_argument(
        "--repeat", type=int, default=3, help="broker-failure runs per lease TTL (a new cluster each)"
    )
    parser.add_argument("--takeover-partitions", type=int, default=10_000)
    parser.add_argument(
        "--only",
        choices=["failure", "takeover", "shutdown"],
        nargs="*",
        default=["failure", "takeover", "shutdown"],
    )
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="run the clusters under DIR and keep their data and logs (default: a temporary "
        "directory, removed at the end)",
    )
    args = parser.parse_args()
    out: dict[str, object] = {"machine": common.machine(), "date": time.strftime("%Y-%m-%d")}
    with tempfile.TemporaryDirectory(prefix="hw-failover-") as tmp:
        base = Path(tmp) if args.keep is None else args.keep
        base.mkdir(parents=True, exist_ok=True)
        if "failure" in args.only:
            out["broker_failure"] = []
            for run, ttl in enumerate(ttl for ttl in args.ttls for _ in range(args.repeat)):
                r = bench_broker_failure(args.partitions, ttl, base, run)
                out["broker_failure"].append(r)  # type: ignore[union-attr]
                print(
                    f"broker failure, {r['partitions']} partitions, lease TTL {ttl} s: all accept acks=all "
                    f"after {r['recovery_s']} s (lease expiry seen after {r['lease_expiry_seen_s']} s; "
                    f"target {r['target_s']} s, ratio {r['ratio_to_target']})"
                )
        if "takeover" in args.only:
            r = bench_controller_takeover(args.takeover_partitions, base)
            out["controller_takeover"] = r
            print(
                f"controller takeover, {r['partitions']} partitions: {r['takeover_s']} s "
                f"(target 2 s, ratio {r['ratio_to_target']})"
            )
        if "shutdown" in args.only:
            r = bench_controlled_shutdown(args.partitions, base)
            out["controlled_shutdown"] = r
            print(
                f"controlled shutdown, {r['partitions']} partitions led: every leadership moved after "
                f"{r['controlled_shutdown_s']} s, process exited after {r['process_exit_s']} s, "
                f"{r['partitions_still_led']} still led (target 2 s, ratio {r['ratio_to_target']})"
            )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "failover.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out["machine"]))


if __name__ == "__main__":
    main()
