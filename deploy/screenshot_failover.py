#!/usr/bin/env python3
"""Prometheus watching a broker failover, and a screenshot of what it saw.

    .venv/bin/python deploy/screenshot_failover.py [--out docs/images/prometheus-failover.png]

Starts a local cluster (services/launcher/local_cluster.py: etcd, a controller, three
brokers on three racks, a gateway) and Debian's `prometheus` scraping every
process once a second, puts a little produce load on a 6-partition topic, then
runs a failover in three phases:

1. steady: every partition fully replicated;
2. broker 2 SIGKILLed: its lease runs out, its leaderships move to brokers 1
   and 3, under_replicated_partitions rises on the leaders;
3. broker 2 restarted and a preferred leader election run: the ISR expands
   again, under_replicated_partitions falls back to 0 and leader_count
   returns to its balance.

Then headless Chromium (Debian's `chromium`) takes a screenshot of
Prometheus's own graph page with `highwater_under_replicated_partitions` and
`highwater_leader_count` over the run. Missing `prometheus` or `chromium` are
installed with apt-get when running as root.

A script, not a test: it takes about two minutes. Every process it starts is
stopped by its pid in `finally`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

import grpc  # noqa: E402  (after the sys.path line: the script runs from anywhere)

from clients.common.records import Record, encode_batch  # noqa: E402
from coordinator.etcd_server import free_port  # noqa: E402
from protos.highwater.v1 import common_pb2, gateway_pb2_grpc  # noqa: E402
from services.launcher.local_cluster import LocalCluster  # noqa: E402

DEFAULT_OUT = REPO_ROOT / "docs" / "images" / "prometheus-failover.png"
TOPIC = "failover-demo"
PARTITIONS = 6

# Prometheus scrapes every second, so a few-second transition shows as a slope, not a step.
SCRAPE_INTERVAL_S = 1
# How long each phase is held once reached, so each shows as a plateau on the graph.
PHASE_HOLD_S = 20.0
# Bounds on what the phases wait for (lease TTL 3 s; restart and catch-up a few seconds).
CLUSTER_LEASE_TTL_S = 3
REPLICA_LAG_TIME_MAX_MS = 2_000
PHASE_TIMEOUT_S = 60.0
PROMETHEUS_READY_TIMEOUT_S = 30.0
PROMETHEUS_STOP_TIMEOUT_S = 15.0
CHROMIUM_TIMEOUT_S = 120.0
# Chromium runs the page's JavaScript (the classic UI draws with Rickshaw) for this long of virtual time.
CHROMIUM_VIRTUAL_TIME_MS = 10_000
WINDOW_WIDTH_PX, WINDOW_HEIGHT_PX = 1400, 1640
# Produce load: one small batch every LOAD_INTERVAL_S, bounded in total.
LOAD_INTERVAL_S = 0.2
LOAD_BATCH_RECORDS = 20
LOAD_RECORDS_MAX = 100_000
RPC_TIMEOUT_S = 5.0

APT_PACKAGES = {"prometheus": "prometheus", "chromium": "chromium"}


def log(msg: str) -> None:
    print(f"[screenshot {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ensure_packages() -> None:
    missing = [pkg for cmd, pkg in APT_PACKAGES.items() if shutil.which(cmd) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SystemExit(f"needs Debian's {' '.join(missing)}: apt-get install {' '.join(missing)}")
    log(f"installing {' '.join(missing)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], env=env, check=True, capture_output=True, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        env=env,
        check=True,
        capture_output=True,
        timeout=900,
    )


def wait_until(
    condition: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.5
) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


# ---- Prometheus ---------------------------------------------------------------------------------


def prometheus_config(cluster: LocalCluster) -> str:
    """Static targets named after the processes (instance="broker-2"), so the legends read well."""
    jobs: dict[str, list[dict[str, object]]] = {}
    for p in cluster.processes.values():
        jobs.setdefault(p.kind, []).append(
            {"targets": [f"127.0.0.1:{p.info['metrics_port']}"], "labels": {"instance": p.name}}
        )
    config = {
        "global": {"scrape_interval": f"{SCRAPE_INTERVAL_S}s", "scrape_timeout": f"{SCRAPE_INTERVAL_S}s"},
        "scrape_configs": [{"job_name": kind, "static_configs": targets} for kind, targets in jobs.items()],
    }
    return json.dumps(config, indent=2)  # JSON is YAML


def query(prom_url: str, expr: str) -> float | None:
    """The value of an instant query that yields one series; None when it yields nothing."""
    url = f"{prom_url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=RPC_TIMEOUT_S) as resp:
        result = json.loads(resp.read())["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def graph_url(prom_url: str, range_s: int) -> str:
    """Prometheus's classic graph page (Debian's package ships the classic UI) with two graphs."""
    params = {}
    for i, expr in enumerate(("highwater_under_replicated_partitions", "highwater_leader_count")):
        params.update(
            {f"g{i}.expr": expr, f"g{i}.tab": "0", f"g{i}.stacked": "0", f"g{i}.range_input": f"{range_s}s"}
        )
    return f"{prom_url}/classic/graph?{urllib.parse.urlencode(params)}"


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)


# ---- the load -----------------------------------------------------------------------------------


class Load(threading.Thread):
    """Small acks=1 batches to random partitions until stopped; errors during the failover are expected."""

    def __init__(self, gateway: str) -> None:
        super().__init__(name="load", daemon=True)
        self.gateway = gateway
        self.stopped = threading.Event()
        self.acked = 0
        self.failed = 0

    def run(self) -> None:
        with grpc.insecure_channel(self.gateway) as channel:
            stub = gateway_pb2_grpc.GatewayServiceStub(channel)
            sent = 0
            while not self.stopped.is_set() and sent < LOAD_RECORDS_MAX:
                now = int(time.time() * 1000)
                batch = encode_batch(
                    [Record(None, f"record-{sent + i}".encode(), [], now) for i in range(LOAD_BATCH_RECORDS)]
                )
                request = common_pb2.ProduceRequest(
                    acks=1,
                    timeout_ms=2_000,
                    topics=[
                        common_pb2.ProduceTopicData(
                            topic=TOPIC,
                            partitions=[
                                common_pb2.ProducePartitionData(
                                    partition=random.randrange(PARTITIONS), records=batch
                                )
                            ],
                        )
                    ],
                )
                try:
                    resp = stub.Produce(request, timeout=RPC_TIMEOUT_S)
                    ok = resp.topics[0].partitions[0].error_code == common_pb2.NONE
                except grpc.RpcError:
                    ok = False
                self.acked += LOAD_BATCH_RECORDS if ok else 0
                self.failed += 0 if ok else LOAD_BATCH_RECORDS
                sent += LOAD_BATCH_RECORDS
                self.stopped.wait(LOAD_INTERVAL_S)


# ---- the run ------------------------------------------------------------------------------------


def run(out: Path, work: Path) -> None:
    cluster = LocalCluster(
        work / "cluster",
        brokers=3,
        controllers=1,
        gateways=1,
        lease_ttl_s=CLUSTER_LEASE_TTL_S,
        replica_lag_time_max_ms=REPLICA_LAG_TIME_MAX_MS,
        racks=["rack-a", "rack-b", "rack-c"],
    )
    prometheus: subprocess.Popen[bytes] | None = None
    load: Load | None = None
    try:
        log("starting the local cluster")
        cluster.start()
        # Pin each process's metrics port (as LocalCluster pins the gateway's gRPC
        # port): the restarted broker must come back where Prometheus scrapes.
        for p in cluster.processes.values():
            p.args += ["--metrics-port", str(p.info["metrics_port"])]
        prom_port = free_port()
        prom_url = f"http://127.0.0.1:{prom_port}"
        config_path = work / "prometheus.yml"
        config_path.write_text(prometheus_config(cluster))
        with (work / "prometheus.log").open("ab") as prom_log:
            prometheus = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={work / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=prom_log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        log(f"prometheus (pid {prometheus.pid}) on {prom_url}")

        def prometheus_ready() -> bool:
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{prom_url}/-/ready", timeout=RPC_TIMEOUT_S) as resp,
            ):
                return resp.status == 200
            return False

        wait_until(prometheus_ready, PROMETHEUS_READY_TIMEOUT_S, "prometheus ready")
        started = time.time()

        gw = gateway_pb2_grpc.GatewayServiceStub(grpc.insecure_channel(cluster.gateway_address))
        created = gw.CreateTopics(
            common_pb2.CreateTopicsRequest(
                topics=[
                    common_pb2.CreatableTopic(name=TOPIC, num_partitions=PARTITIONS, replication_factor=3)
                ]
            ),
            timeout=RPC_TIMEOUT_S,
        )
        if created.topics[0].error_code != common_pb2.NONE:
            raise RuntimeError(f"CreateTopics: {created.topics[0].error_message}")
        load = Load(cluster.gateway_address)
        load.start()

        def sum_of(metric: str) -> Callable[[], float | None]:
            return lambda: query(prom_url, f"sum({metric})")

        urp = sum_of("highwater_under_replicated_partitions")
        wait_until(
            lambda: sum_of("highwater_leader_count")() == PARTITIONS and urp() == 0,
            PHASE_TIMEOUT_S,
            "every partition led and fully replicated, as Prometheus sees it",
        )
        log(f"phase 1: steady, holding {PHASE_HOLD_S:.0f} s")
        time.sleep(PHASE_HOLD_S)  # the plateau the graph shows before the failure

        log("phase 2: SIGKILL broker-2")
        cluster.kill("broker-2")
        wait_until(lambda: (urp() or 0) > 0, PHASE_TIMEOUT_S, "under_replicated_partitions > 0")
        wait_until(
            lambda: (
                query(
                    prom_url,
                    'highwater_leader_count{instance="broker-1"} + '
                    'ignoring(instance) highwater_leader_count{instance="broker-3"}',
                )
                == PARTITIONS
            ),
            PHASE_TIMEOUT_S,
            "brokers 1 and 3 leading every partition",
        )
        log(f"under-replicated: {urp():.0f}; holding {PHASE_HOLD_S:.0f} s")
        time.sleep(PHASE_HOLD_S)

        log("phase 3: restart broker-2, then a preferred leader election")
        cluster.start_process("broker-2")
        wait_until(lambda: urp() == 0, PHASE_TIMEOUT_S, "under_replicated_partitions back to 0")

        def preferred_election_done() -> bool:
            """One ElectLeaders(PREFERRED); done once broker 2 leads what it prefers again."""
            elected = gw.ElectLeaders(
                common_pb2.ElectLeadersRequest(election_type=common_pb2.PREFERRED, timeout_ms=10_000),
                timeout=15.0,
            )
            refused = [
                f"{p.topic}-{p.partition}: {p.error_message}"
                for p in elected.partitions
                if p.error_code not in (common_pb2.NONE, common_pb2.ELECTION_NOT_NEEDED)
            ]
            if elected.error_code != common_pb2.NONE or refused:
                log(f"ElectLeaders: {elected.error_message or ''} {refused}; retrying")
                return False
            return (query(prom_url, 'highwater_leader_count{instance="broker-2"}') or 0) > 0

        wait_until(
            preferred_election_done,
            PHASE_TIMEOUT_S,
            "broker-2 leading again after a preferred election",
            interval_s=2.0,
        )
        log(f"recovered; holding {PHASE_HOLD_S:.0f} s")
        time.sleep(PHASE_HOLD_S)
        load.stopped.set()
        log(f"load: {load.acked} records acknowledged, {load.failed} failed during the run")

        range_s = int(time.time() - started) + 10
        url = graph_url(prom_url, range_s)
        screenshot(url, out, work)
        log(f"wrote {out} ({out.stat().st_size} bytes) from {url}")
    finally:
        if load is not None:
            load.stopped.set()
            load.join(timeout=RPC_TIMEOUT_S * 2)
        if prometheus is not None:
            stop_process(prometheus, PROMETHEUS_STOP_TIMEOUT_S)
        cluster.stop()


def screenshot(url: str, out: Path, work: Path) -> None:
    """Headless Chromium; its own process group, ended by pid on timeout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={work / 'chromium'}",
        f"--window-size={WINDOW_WIDTH_PX},{WINDOW_HEIGHT_PX}",
        f"--virtual-time-budget={CHROMIUM_VIRTUAL_TIME_MS}",
        f"--screenshot={out}",
        url,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=CHROMIUM_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=PROMETHEUS_STOP_TIMEOUT_S)
        raise
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"chromium failed ({proc.returncode}):\n{output.decode(errors='replace')[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"PNG to write (default {DEFAULT_OUT})")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, TSDB) afterwards")
    args = parser.parse_args(argv)
    ensure_packages()
    work = Path(tempfile.mkdtemp(prefix="highwater-screenshot-"))
    try:
        run(args.out.resolve(), work)
    finally:
        if args.keep:
            log(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
