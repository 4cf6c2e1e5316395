"""What every benchmark in bench/ shares: the machine, versions, CPU per process, percentiles,
the load gate, JSON results, and a Highwater cluster ready for a workload.

Figures on this 2-core machine move with the neighbours' load (FACTS.md), so every result
records the 1-minute load average before and after its run, and the CPU seconds each
process used (utime + stime from /proc/<pid>/stat), which holds better than wall-clock rates
on a shared machine: "the leader broker used 0.93 core-seconds per second" says which process
is the bottleneck even when the absolute rate drifts.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import grpc

    from protos.highwater.v1 import common_pb2

# A benchmark's result document, written as JSON (write_result): its fields differ from one
# benchmark to the next and nest freely, so values are typed as JSON values are, not per field.
Result = dict[str, Any]

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "bench" / "results"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The brief's rule for a fair figure on a shared 2-core machine: measure when the 1-minute
# load is below this, or say that it was not.
QUIET_LOAD_MAX = 1.5
# How long the load gate waits for a quiet machine before measuring anyway.
QUIET_WAIT_S_DEFAULT = 20.0
_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# An e2e consumer stops this long after the last record it got (its producer has finished).
E2E_IDLE_END_S = 3.0


# ---- the machine and what runs on it ----------------------------------------------------------


def machine() -> Result:
    """Cores, memory, CPU model, kernel and Python of this machine."""
    mem_kib = 0
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as f:
        mem_kib = int(f.readline().split()[1])
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "cpu": cpu_model(platform.processor() or ""),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def cpu_model(default: str = "") -> str:
    """The CPU's model name from /proc/cpuinfo (default when it says none)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return default


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _binary_version(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else None


def versions(*, peers: bool = False) -> Result:
    """Versions of what the figures depend on: our commit, the Python packages, the servers."""
    commit = _binary_version(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    from clients.common.records import codec_is_accelerated

    out: Result = {
        "highwater_commit": commit,
        "highwater_tree_modified": bool(dirty),
        "grpcio": _package_version("grpcio"),
        "protobuf": _package_version("protobuf"),
        "aiokafka": _package_version("aiokafka"),
        "confluent_kafka": _package_version("confluent-kafka"),
        "record_codec_accelerated": codec_is_accelerated(),
        "etcd": _binary_version(["etcd", "--version"]),
    }
    if peers:
        out.update(
            {
                "nats_server": _binary_version(["nats-server", "--version"]),
                "nats_py": _package_version("nats-py"),
                "redis_server": _binary_version(["redis-server", "--version"]),
                "redis_py": _package_version("redis"),
                "hiredis": _package_version("hiredis"),
            }
        )
    return out


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def wait_for_quiet(
    max_load: float = QUIET_LOAD_MAX, wait_s: float = QUIET_WAIT_S_DEFAULT, say: bool = True
) -> Result:
    """Wait (at most wait_s) for the 1-minute load to drop below max_load; never fails.

    Returns {"load_1m_before": ..., "quiet": bool, "waited_s": ...} for the result JSON, so a
    figure measured on a busy machine says so next to itself.
    """
    start = time.monotonic()
    load = load_average()
    while load >= max_load and time.monotonic() - start < wait_s:
        time.sleep(5)
        load = load_average()
    waited = round(time.monotonic() - start, 1)
    quiet = load < max_load
    if say and not quiet:
        print(
            f"  note: 1-minute load {load} >= {max_load} after waiting {waited:.0f} s: measuring anyway "
            "(the machine is shared)",
            flush=True,
        )
    return {"load_1m_before": load, "quiet": quiet, "waited_s": waited}


# ---- CPU per process --------------------------------------------------------------------------


def process_cpu_s(pid: int) -> float | None:
    """utime + stime of a process (all its threads), in seconds; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: split after its closing parenthesis.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS_PER_S


class CpuMeter:
    """CPU seconds used by named processes between start() and stop().

    meter = CpuMeter({"broker-1": 1234, "client": os.getpid()}); meter.start(); ...;
    meter.stop() -> {"broker-1": {"cpu_s": 4.1, "cores": 0.82}, ...} where cores is
    CPU seconds per wall second (1.0 = one core kept busy).
    """

    def __init__(self, pids: Mapping[str, int | None]) -> None:
        self.pids = {name: pid for name, pid in pids.items() if pid}
        self._start: dict[str, float] = {}
        self._t0 = 0.0

    def add(self, name: str, pid: int) -> None:
        self.pids[name] = pid
        if self._t0:
            self._start[name] = process_cpu_s(pid) or 0.0

    def start(self) -> CpuMeter:
        self._t0 = time.monotonic()
        self._start = {name: process_cpu_s(pid) or 0.0 for name, pid in self.pids.items()}
        return self

    def stop(self) -> dict[str, dict[str, float]]:
        wall = max(time.monotonic() - self._t0, 1e-9)
        out: dict[str, dict[str, float]] = {}
        for name, pid in self.pids.items():
            now = process_cpu_s(pid)
            if now is None:
                continue
            used = now - self._start.get(name, 0.0)
            out[name] = {"cpu_s": round(used, 2), "cores": round(used / wall, 2)}
        out["total"] = {
            "cpu_s": round(sum(v["cpu_s"] for v in out.values()), 2),
            "cores": round(sum(v["cores"] for v in out.values()), 2),
        }
        return out


def format_cpu(cpu: dict[str, dict[str, float]]) -> str:
    return ", ".join(f"{name} {v['cores']:.2f}" for name, v in cpu.items())


# ---- latency figures ------------------------------------------------------------------------

PERCENTILES = (("p50", 50.0), ("p99", 99.0), ("p99_9", 99.9))


def percentiles_ms(samples_s: Sequence[float]) -> dict[str, float | int]:
    """p50, p99, p99.9 and max in ms (nearest rank) of latencies given in seconds."""
    if not samples_s:
        return {"count": 0}
    ordered = sorted(samples_s)
    n = len(ordered)
    out: dict[str, float | int] = {"count": n}
    for name, q in PERCENTILES:
        rank = max(1, math.ceil(q / 100 * n))
        out[f"{name}_ms"] = round(ordered[rank - 1] * 1000, 3)
    out["max_ms"] = round(ordered[-1] * 1000, 3)
    out["mean_ms"] = round(sum(ordered) / n * 1000, 3)
    return out


def format_latency(lat: dict[str, float | int]) -> str:
    if not lat.get("count"):
        return "no samples"
    return (
        f"p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms, p99.9 {lat['p99_9_ms']:.2f} ms, "
        f"max {lat['max_ms']:.2f} ms"
    )


# ---- results ----------------------------------------------------------------------------------


def write_result(name: str, result: Result) -> Path:
    """bench/results/<name>.json (the latest run of that benchmark; RESULTS.md keeps the table),
    or the file `name` itself when it is a path (has a directory or ends in .json)."""
    path = Path(name) if ("/" in name or name.endswith(".json")) else RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    return path


def shown(path: Path) -> str:
    """`path` as a reader finds it: relative to the repository when inside it."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(resolved)


def finish(name: str, out: Result) -> int:
    """Write the result JSON and say where it went (and on what machine); the exit status 0."""
    path = write_result(name, out)
    print(f"machine: {out['machine']}; results: {shown(path)}")
    return 0


def header(*, peers: bool = False) -> Result:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": machine(),
        "versions": versions(peers=peers),
    }


# ---- a Highwater cluster for a workload --------------------------------------------------------


@dataclass
class Target:
    """Where a workload sends: the gateway, and each partition's leader address (for --direct)."""

    gateway: str
    topic: str
    partitions: int
    leaders: dict[int, str] = field(default_factory=dict)
    # Processes to meter: name -> pid (empty with --bootstrap: not ours to watch).
    pids: dict[str, int] = field(default_factory=dict)
    # Broker address -> process name ("127.0.0.1:40123" -> "broker-1"), when the cluster is ours.
    names: dict[str, str] = field(default_factory=dict)
    # Process name -> its Prometheus /metrics port, when the cluster is ours.
    metrics_ports: dict[str, int] = field(default_factory=dict)
    # The brokers' Kafka listeners (docs/KAFKA.md), "host:port,...", when the cluster is ours.
    kafka_bootstrap: str = ""

    def leader_processes(self) -> dict[str, list[int]]:
        """Process name (or address) of each leader -> the partitions it leads."""
        out: dict[str, list[int]] = {}
        for partition, address in sorted(self.leaders.items()):
            out.setdefault(self.names.get(address, address), []).append(partition)
        return out


def address_groups(target: Target, direct: bool = True) -> dict[str, list[int]]:
    """Partitions by where requests for them go: each partition's leader (direct) or the gateway."""
    if not direct:
        return {target.gateway: list(range(target.partitions))}
    groups: dict[str, list[int]] = {}
    for partition, address in sorted(target.leaders.items()):
        groups.setdefault(address, []).append(partition)
    return groups


def aio_channels(addresses: Iterable[str]) -> dict[str, grpc.aio.Channel]:
    """An asyncio gRPC channel (the clients' options) to each address."""
    import grpc

    from clients.connection import CHANNEL_OPTIONS

    return {a: grpc.aio.insecure_channel(a, options=CHANNEL_OPTIONS) for a in addresses}


def check_partition_errors(
    response: common_pb2.ProduceResponse | common_pb2.FetchResponse, what: str
) -> None:
    """SystemExit naming the first partition of a Produce/Fetch response that has an error."""
    from protos.highwater.v1 import common_pb2

    for t in response.topics:
        for part in t.partitions:
            if part.error_code != common_pb2.NONE:
                raise SystemExit(
                    f"{what} {part.partition}: "
                    f"{common_pb2.ErrorCode.Name(part.error_code)} {part.error_message}"
                )


def profile_pids(target: Target) -> dict[str, int]:
    """The client, the gateway and every leader broker: the processes a workload runs through."""
    pids = {"client": os.getpid()}
    for name in ("gateway-1", *target.leader_processes()):
        if name in target.pids:
            pids[name] = target.pids[name]
    return pids


def _gateway_stub(address: str) -> tuple[grpc.Channel, Any]:
    """A blocking channel to the gateway and its stub (the generated stub class is untyped)."""
    import grpc

    from protos.highwater.v1 import gateway_pb2_grpc

    channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)])
    return channel, gateway_pb2_grpc.GatewayServiceStub(channel)  # type: ignore[no-untyped-call]


def create_topics_request(
    name: str,
    *,
    num_partitions: int,
    replication_factor: int,
    assignments: Mapping[int, common_pb2.ReplicaList] | None = None,
    configs: Mapping[str, str] | None = None,
    min_insync: int | None = None,
    timeout_ms: int | None = None,
) -> common_pb2.CreateTopicsRequest:
    """A CreateTopics request for one topic: CreatableTopic fields, min_insync as its
    min.insync.replicas config."""
    from protos.highwater.v1 import common_pb2

    all_configs = dict(configs or {})
    if min_insync is not None:
        all_configs["min.insync.replicas"] = str(min_insync)
    topic = common_pb2.CreatableTopic(
        name=name,
        num_partitions=num_partitions,
        replication_factor=replication_factor,
        assignments=assignments,
        configs=all_configs,
    )
    request = common_pb2.CreateTopicsRequest(topics=[topic])
    if timeout_ms is not None:
        request.timeout_ms = timeout_ms
    return request


def produce_request(
    topic: str, batches: Iterable[tuple[int, bytes]], *, timeout_ms: int, acks: int = -1
) -> object:
    """A Produce request to one topic: (partition, encoded records) for each partition."""
    from protos.highwater.v1 import common_pb2

    return common_pb2.ProduceRequest(
        acks=acks,
        timeout_ms=timeout_ms,
        topics=[
            common_pb2.ProduceTopicData(
                topic=topic,
                partitions=[common_pb2.ProducePartitionData(partition=p, records=r) for p, r in batches],
            )
        ],
    )


def create_topic(
    gateway: str,
    topic: str,
    *,
    partitions: int,
    replication_factor: int,
    min_insync: int,
    timeout_s: float = 60.0,
    configs: dict[str, str] | None = None,
) -> dict[int, str]:
    """Create `topic` (with `configs` beside min.insync.replicas) and wait until every
    partition has a leader and a full ISR.

    Returns partition -> leader address. Raises SystemExit with the reason if that does not
    happen within timeout_s (a benchmark on a half-ready topic measures the wrong thing).
    """
    from protos.highwater.v1 import common_pb2

    channel, stub = _gateway_stub(gateway)
    try:
        resp = stub.CreateTopics(
            create_topics_request(
                topic,
                num_partitions=partitions,
                replication_factor=replication_factor,
                min_insync=min_insync,
                timeout_ms=int(timeout_s * 1000),
                configs=configs,
            ),
            timeout=timeout_s,
        )
        err = resp.topics[0].error_code if resp.topics else resp.error_code
        if err not in (common_pb2.NONE, common_pb2.TOPIC_ALREADY_EXISTS):
            raise SystemExit(
                f"CreateTopics {topic}: {common_pb2.ErrorCode.Name(err)} "
                f"{resp.topics[0].error_message if resp.topics else resp.error_message}"
            )
        deadline = time.monotonic() + timeout_s
        while True:
            d = stub.DescribeCluster(common_pb2.DescribeClusterRequest(), timeout=10)
            brokers = {b.broker_id: f"{b.host}:{b.port}" for b in d.brokers}
            states = [p for p in d.partitions if p.topic == topic]
            ready = {
                p.partition: brokers[p.leader]
                for p in states
                if p.leader in brokers and len(p.isr) >= min(replication_factor, len(p.replicas))
            }
            if len(states) == partitions and len(ready) == partitions:
                return ready
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"topic {topic}: only {len(ready)} of {partitions} partitions have a leader "
                    f"and a full ISR after {timeout_s:.0f} s"
                )
            time.sleep(0.1)
    finally:
        channel.close()


@contextlib.contextmanager
def stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM ends the benchmark as Ctrl-C does: through its `with` blocks, so the cluster it
    started is stopped by pid. (Python's default for SIGTERM exits at once, past every
    `finally` and atexit hook, and left a whole LocalCluster running.)"""

    def on_sigterm(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set a handler (and gets the signal)
        return
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def highwater_target(
    *,
    bootstrap: str | None,
    topic: str,
    partitions: int,
    replication_factor: int,
    min_insync: int,
    brokers: int = 3,
    tmp_dir: str | None = None,
    broker_args: Sequence[str] = (),
    create_timeout_s: float = 60.0,
) -> Iterator[Target]:
    """A topic ready for a workload: on --bootstrap's cluster, or on a LocalCluster of our own
    (etcd + controller + `brokers` brokers + gateway, in a temporary directory, every process
    stopped by pid on the way out). tmp_dir puts the brokers' logs elsewhere (/dev/shm: no disk);
    broker_args are extra flags for every broker of our own cluster (bench/cleaner_impact.py's
    --log-cleaner-backoff-ms, bench/scale.py's --replicas-max); create_timeout_s bounds the wait
    for every partition to have a leader and a full ISR."""
    if bootstrap:
        leaders = create_topic(
            bootstrap,
            topic,
            partitions=partitions,
            replication_factor=replication_factor,
            min_insync=min_insync,
            timeout_s=create_timeout_s,
        )
        yield Target(bootstrap, topic, partitions, leaders)
        return
    from services.launcher.local_cluster import LocalCluster

    with (
        stopped_by_sigterm(),
        tempfile.TemporaryDirectory(prefix="hw-bench-", dir=tmp_dir) as tmp,
        LocalCluster(Path(tmp), brokers=brokers, broker_args=list(broker_args)) as cluster,
    ):
        gateway = cluster.gateway_addresses[0]
        leaders = create_topic(
            gateway,
            topic,
            partitions=partitions,
            replication_factor=replication_factor,
            min_insync=min_insync,
            timeout_s=create_timeout_s,
        )
        pids: dict[str, int] = {"etcd": cluster.etcd.pid} if cluster.etcd.pid else {}
        names: dict[str, str] = {}
        ports: dict[str, int] = {}
        for name, p in cluster.processes.items():
            if p.pid:
                pids[name] = p.pid
            if p.kind == "broker" and p.info:
                names[p.address] = name
            if p.info.get("metrics_port"):
                ports[name] = int(p.info["metrics_port"])
        yield Target(gateway, topic, partitions, leaders, pids, names, ports, cluster.kafka_bootstrap())


def add_target_arguments(parser: argparse.ArgumentParser, *, partitions: int, output: str) -> None:
    """The options target_for reads (--bootstrap and the topic's shape) and the ones every
    cluster benchmark shares (--topic, --quiet-wait-s, --output), declared once so that the
    scripts agree on their names and defaults."""
    parser.add_argument(
        "--partitions", type=int, default=partitions, help=f"topic partitions (default {partitions})"
    )
    parser.add_argument("--replication-factor", type=int, default=3, help="replicas of the topic (default 3)")
    parser.add_argument(
        "--min-insync", type=int, default=2, help="min.insync.replicas of the topic (default 2)"
    )
    parser.add_argument(
        "--bootstrap", help="an existing cluster's gateway HOST:PORT (default: start our own)"
    )
    parser.add_argument("--topic", default=None, help="topic name (default: a new one per run)")
    parser.add_argument(
        "--quiet-wait-s",
        type=float,
        default=QUIET_WAIT_S_DEFAULT,
        help=f"wait up to this long for the 1-minute load to drop below {QUIET_LOAD_MAX} "
        f"(default {QUIET_WAIT_S_DEFAULT:g})",
    )
    parser.add_argument(
        "--output", default=output, help=f"results: a name under bench/results, or a path (default {output})"
    )


def target_topic(args: argparse.Namespace, name: str) -> str:
    """The topic a run writes: --topic, or a new one per run so that runs never read each other's records."""
    topic: str | None = args.topic
    return topic or f"bench-{name}-{int(time.time())}"


def target_header(args: argparse.Namespace, **fields: object) -> Result:
    """A result's opening fields: the machine and versions (header()), the topic's shape from
    add_target_arguments' options, then the script's own `fields`; "runs" is left empty for it to fill."""
    return {
        **header(),
        **fields,
        "partitions": args.partitions,
        "replication_factor": args.replication_factor,
        "runs": [],
    }


def target_for(
    args: argparse.Namespace, topic: str, **kwargs: Any
) -> contextlib.AbstractContextManager[Target]:
    """highwater_target() from a script's --bootstrap, --partitions, --replication-factor and
    --min-insync (kwargs: the rest, such as brokers and tmp_dir)."""
    return highwater_target(
        bootstrap=args.bootstrap,
        topic=topic,
        partitions=args.partitions,
        replication_factor=args.replication_factor,
        min_insync=args.min_insync,
        **kwargs,
    )


# ---- server-side request latency, from the services' Prometheus histograms ---------------------

_LATENCY_METRICS = {
    "gateway": "highwater_gateway_request_latency_seconds",
    "broker": "highwater_request_latency_seconds",
}


def metrics_text(port: int) -> str | None:
    """The Prometheus /metrics page of one of our processes, or None when it does not answer."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text: str = resp.read().decode()
    except OSError:
        return None
    return text


# The stall lengths bench scripts report (services/common/loop_stalls.py's histogram buckets).
LOOP_STALL_BOUNDS_S = ("0.02", "0.05", "0.1")


def loop_stalls(target: Target) -> dict[str, dict[str, float]]:
    """process name -> {"<bound>": stalls at least that long so far, "sum_s": their total}, from
    each process's highwater_event_loop_stall_seconds (a process without it is left out)."""
    out: dict[str, dict[str, float]] = {}
    for name, port in target.metrics_ports.items():
        text = metrics_text(port)
        if text is None:
            continue
        buckets: dict[str, float] = {}
        count = total = None
        for line in text.splitlines():
            if line.startswith("highwater_event_loop_stall_seconds_bucket{"):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                buckets[le] = float(line.rsplit(" ", 1)[1])
            elif line.startswith("highwater_event_loop_stall_seconds_count "):
                count = float(line.rsplit(" ", 1)[1])
            elif line.startswith("highwater_event_loop_stall_seconds_sum "):
                total = float(line.rsplit(" ", 1)[1])
        if count is None or total is None:
            continue
        # A bucket counts stalls up to its bound: the ones at least that long are the rest.
        figures = {f">={bound}s": count - buckets.get(bound, count) for bound in LOOP_STALL_BOUNDS_S}
        out[name] = {**figures, "sum_s": total}
    return out


def loop_stalls_between(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """The stalls of each process between two loop_stalls() readings."""
    return {
        name: {key: round(value - before.get(name, {}).get(key, 0.0), 3) for key, value in figures.items()}
        for name, figures in after.items()
    }


def rpc_totals(target: Target, rpc: str) -> dict[str, tuple[float, float]]:
    """process name -> (request count, seconds in total) of one RPC, from each /metrics."""
    out: dict[str, tuple[float, float]] = {}
    for name, port in target.metrics_ports.items():
        kind = name.split("-")[0]
        metric = _LATENCY_METRICS.get(kind)
        if metric is None:
            continue
        text = metrics_text(port)
        if text is None:
            continue
        count = total = 0.0
        for line in text.splitlines():
            if f'rpc="{rpc}"' not in line:
                continue
            if line.startswith(metric + "_count"):
                count = float(line.rsplit(" ", 1)[1])
            elif line.startswith(metric + "_sum"):
                total = float(line.rsplit(" ", 1)[1])
        out[name] = (count, total)
    return out


def rpc_delta(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], elapsed_s: float
) -> dict[str, dict[str, float]]:
    """Per process: requests/s and mean server-side latency (ms) of the RPC between two scrapes."""
    out: dict[str, dict[str, float]] = {}
    for name, (count, total) in after.items():
        c0, t0 = before.get(name, (0.0, 0.0))
        n = count - c0
        if n > 0:
            out[name] = {
                "requests_per_s": round(n / elapsed_s, 1),
                "mean_ms": round((total - t0) / n * 1000, 2),
            }
    return out


def format_rpc(per: dict[str, dict[str, float]]) -> str:
    """rpc_delta()'s figures on one line."""
    return ", ".join(f"{n} {v['requests_per_s']:.0f}/s mean {v['mean_ms']:.1f} ms" for n, v in per.items())


# ---- py-spy: where the time goes ---------------------------------------------------------------


def py_spy_binary() -> str | None:
    """py-spy from the venv (the `bench` extra) or PATH."""
    local = Path(sys.executable).with_name("py-spy")
    if local.exists():
        return str(local)
    import shutil

    return shutil.which("py-spy")


# Our code, for the inclusive table (library and entry-point frames are in every stack).
_OUR_PREFIXES = (
    "(services/",
    "(clients/",
    "(coordinator/",
    "(bench/",
    "(produce.py",
    "(consume.py",
    "(e2e_latency.py",
    "(compare.py",
    "(nats_js.py",
    "(redis_streams.py",
)
_ENTRY_FILES = (
    "(services/cli.py)",
    "(services/__main__.py)",
    "(services/security/cli_options.py)",
    "(clients/loop_thread.py)",
)


def _is_ours(frame: str) -> bool:
    where = frame[frame.find(" (") + 1 :] if " (" in frame else ""
    return where.startswith(_OUR_PREFIXES) and not where.startswith(_ENTRY_FILES) and "_pb2" not in where


class PySpy:
    """`py-spy record` on several processes at once, for one measured run.

    Sampling is --nonblocking (the target is not paused), so the run it watches slows by a
    few percent at most; figures taken under it are labelled as such. `finish()` returns,
    per process, how busy it was (sampled non-idle stacks / samples expected in the time)
    and the top functions by self time and by inclusive time, as shares of its busy samples.
    """

    def __init__(
        self, pids: dict[str, int], duration_s: float, out_dir: Path, *, rate: int = 100, native: bool = False
    ) -> None:
        self.binary = py_spy_binary()
        self.pids = pids
        self.duration_s = max(1, math.ceil(duration_s))
        self.out_dir = out_dir
        self.rate = rate
        self.native = native
        self._procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}

    def start(self) -> PySpy:
        if self.binary is None:
            print("  note: py-spy not found (pip install -e '.[bench]'); no profile", flush=True)
            return self
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, pid in self.pids.items():
            out = self.out_dir / f"{name}.txt"
            cmd = [
                self.binary,
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(self.duration_s),
                "--rate",
                str(self.rate),
                "--format",
                "raw",
                "--function",
                "--output",
                str(out),
            ]
            # --native (C frames of gRPC and protobuf) needs the target paused while its stack is
            # read; without it the target runs on (--nonblocking) and barely slows down.
            cmd.append("--native" if self.native else "--nonblocking")
            self._procs[name] = (
                subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE),
                out,
            )
        return self

    def finish(self, top: int = 12) -> Result:
        results: Result = {}
        for name, (proc, out) in self._procs.items():
            try:
                _, err = proc.communicate(timeout=self.duration_s + 30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            if not out.exists():
                results[name] = {"error": (err or b"").decode(errors="replace")[-300:]}
                continue
            results[name] = summarize_py_spy(out, self.rate * self.duration_s, top)
        return results


def summarize_py_spy(path: Path, expected_samples: int, top: int) -> Result:
    from collections import Counter

    self_counts: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        # raw format: process;thread;outermost ... innermost
        thread = frames[1] if len(frames) > 1 else "?"
        frames = [f for f in frames[2:] if f]
        total += count
        threads[thread.split(" (")[0]] += count
        if frames:
            self_counts[_short_frame(frames[-1])] += count
        for frame in dict.fromkeys(_short_frame(f) for f in frames):
            if _is_ours(frame):
                inclusive[frame] += count
    if not total:
        return {"busy": 0.0, "samples": 0}
    return {
        "samples": total,
        "busy": round(total / max(expected_samples, 1), 2),
        "threads": {t: round(c / total, 3) for t, c in threads.most_common(6)},
        "top_self": [{"function": f, "share": round(c / total, 3)} for f, c in self_counts.most_common(top)],
        "top_inclusive": [
            {"function": f, "share": round(c / total, 3)} for f, c in inclusive.most_common(top)
        ],
    }


def _short_frame(frame: str) -> str:
    """'func (path/to/site-packages/pkg/mod.py:12)' -> 'func (pkg/mod.py)'."""
    name, sep, where = frame.partition(" (")
    if not sep:
        return frame
    where = where.rstrip(")")
    where = where.rsplit(":", 1)[0] if where.rsplit(":", 1)[-1].isdigit() else where
    for marker in ("site-packages/", "/lib/python3.11/", str(REPO) + "/"):
        if marker in where:
            where = where.split(marker, 1)[1]
    return f"{name} ({where})"


def format_profile(profile: Result, top: int = 6) -> str:
    lines = []
    for name, info in profile.items():
        if not isinstance(info, dict) or "top_self" not in info:
            lines.append(f"    {name}: {info}")
            continue
        lines.append(f"    {name}: busy {info['busy']:.2f} of a core-second per second; top self time:")
        for item in info["top_self"][:top]:
            lines.append(f"      {item['share'] * 100:5.1f}%  {item['function']}")
        lines.append("      our code, inclusive:")
        for item in info["top_inclusive"][:top]:
            lines.append(f"      {item['share'] * 100:5.1f}%  {item['function']}")
    return "\n".join(lines)


class Window:
    """The measured window: starts the CPU meter (and profiler) when sending starts."""

    def __init__(self, meter: CpuMeter | None = None, profiler: PySpy | None = None) -> None:
        self.meter = meter
        self.profiler = profiler
        self.cpu: dict[str, dict[str, float]] = {}
        self.profile: Result = {}

    def open(self) -> None:
        if self.meter is not None:
            self.meter.start()
        if self.profiler is not None:
            self.profiler.start()

    def close(self) -> None:
        if self.meter is not None:
            self.cpu = self.meter.stop()
        if self.profiler is not None:
            self.profile = self.profiler.finish()


def profiled_run(
    target: Target, run: Callable[[Window], Result], duration_s: float, *, native: bool = False
) -> tuple[Result, Result]:
    """One more run(window) with py-spy on profile_pids(target); prints its rate and profile,
    returns (the run's result, the profile)."""
    with tempfile.TemporaryDirectory(prefix="hw-pyspy-") as tmp:
        window = Window(profiler=PySpy(profile_pids(target), duration_s, Path(tmp), native=native))
        profiled = run(window)
    print(f"  under py-spy: {profiled['records_per_s']:,} records/s", flush=True)
    print(format_profile(window.profile), flush=True)
    return profiled, window.profile


# ---- processes a benchmark starts itself (peers, consumer roles) -------------------------------

PROCESS_STOP_TIMEOUT_S = 10.0


def _die_with_parent() -> None:
    """In the child between fork and exec: SIGKILL me when the benchmark dies (Linux prctl)."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


def spawn(cmd: list[str], log_path: Path | None = None, **kwargs: Any) -> subprocess.Popen[bytes]:
    """Start a child that dies with us; its output goes to log_path (or is dropped)."""
    out = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
            **kwargs,
        )
    finally:
        if not isinstance(out, int):
            out.close()


def stop_process(
    proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None, timeout_s: float = PROCESS_STOP_TIMEOUT_S
) -> None:
    """SIGTERM by pid, SIGKILL if it has not exited within timeout_s; never raises."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(OSError):
        proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=timeout_s)


@contextlib.contextmanager
def running_in_tmp_dir(prefix: str, make: Callable[[Path], Any]) -> Iterator[Any]:
    """make(a new temporary directory), start()ed for the block and stop()ped on the way out
    (the directory goes after): a peer's servers with their data."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        servers = make(Path(tmp))
        try:
            servers.start()
            yield servers
        finally:
            servers.stop()


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_us_per_record(cpu: dict[str, dict[str, float]], records: int) -> dict[str, float]:
    """CPU µs each process spent per record: holds better than records/s on a loaded machine,
    and 2 cores / the total says what an otherwise idle 2-core machine could reach."""
    if records <= 0:
        return {}
    return {name: round(v["cpu_s"] / records * 1e6, 3) for name, v in cpu.items()}


def idle_machine_ceiling(per_record_us: dict[str, float], cores: int | None = None) -> int | None:
    """Records/s an otherwise idle machine could reach at these CPU costs: the lower of
    cores / total CPU per record and one core / the busiest process's CPU per record (a
    Python process runs on about one core: the GIL). An estimate, not a measurement."""
    total = per_record_us.get("total")
    busiest = max((v for k, v in per_record_us.items() if k != "total"), default=0.0)
    if not total or not busiest:
        return None
    return round(min((cores or os.cpu_count() or 1) / total, 1.0 / busiest) * 1e6)


def add_cpu_figures(result: Result, gate: Result, cpu: dict[str, dict[str, float]], records: int) -> None:
    """The load before and after, the CPU per process, its cost per record and the ceiling."""
    result.update(gate, load_1m_after=load_average(), cpu_cores=cpu)
    result["cpu_us_per_record"] = per = cpu_us_per_record(cpu, records)
    result["idle_2_core_ceiling_records_per_s"] = idle_machine_ceiling(per)


def format_cpu_figures(result: Result) -> str:
    """add_cpu_figures()'s figures on one line."""
    per: dict[str, float] = result["cpu_us_per_record"]
    return (
        f"CPU (cores): {format_cpu(result['cpu_cores'])}; CPU µs/record: "
        f"{per.get('total')} (idle-machine ceiling "
        f"{result['idle_2_core_ceiling_records_per_s'] or 0:,}/s); "
        f"load {result['load_1m_before']} -> "
        f"{result['load_1m_after']}"
    )


# ---- what the peers' workloads share -----------------------------------------------------------


class SendClock:
    """The turns of a send loop: `for now in SendClock(duration_s)` yields time.perf_counter()
    until duration_s has passed since `start` (taken when the clock is made)."""

    def __init__(self, duration_s: float) -> None:
        self.start = time.perf_counter()
        self.stop_at = self.start + duration_s

    def __iter__(self) -> Iterator[float]:
        while True:
            now = time.perf_counter()
            if now >= self.stop_at:
                return
            yield now


def pacing_delay(start: float, sent: int, throughput: float, now: float) -> float:
    """How long to wait (at most 0.05 s) before the next send to keep to `throughput` records/s
    from `start`; 0.0: send now (also when throughput <= 0, unbounded)."""
    if throughput > 0:
        due = start + sent / throughput
        if due > now:
            return min(due - now, 0.05)
    return 0.0


def produce_summary(
    path: str,
    counts: dict[str, int],
    errors: dict[str, int],
    elapsed_s: float,
    record_size: int,
    latencies: list[float],
    *,
    per_request: int,
) -> Result:
    """A produce run's result: counts (sent, acked, failed), rates and latency per request."""
    rate = counts["acked"] / elapsed_s if elapsed_s > 0 else 0.0
    return {
        "path": path,
        "records_sent": counts["sent"],
        "records_acked": counts["acked"],
        "records_failed": counts["failed"],
        "errors": errors,
        "elapsed_s": round(elapsed_s, 3),
        "records_per_s": round(rate),
        "mb_per_s": round(rate * record_size / 1e6, 1),
        "records_per_request": per_request,
        "latency_per_request": percentiles_ms(latencies),
    }


def read_summary(path: str, received: int, expected: int, elapsed_s: float, record_size: int) -> Result:
    """A peer's catch-up read: records, rates and whether all `expected` came back."""
    rate = received / elapsed_s
    return {
        "path": path,
        "records": received,
        "elapsed_s": round(elapsed_s, 3),
        "records_per_s": round(rate),
        "mb_per_s": round(rate * record_size / 1e6, 1),
        "complete": received >= expected,
    }


def e2e_consumer_main(
    doc: str | None,
    add_address: Callable[[argparse.ArgumentParser], object],
    consume: Callable[[argparse.Namespace], Result],
) -> int:
    """A peer module's command line: `e2e-consumer` (address, --expected, --timeout-s) prints
    consume(args) as JSON on stdout."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="role", required=True)
    consumer = sub.add_parser("e2e-consumer", help="(used by e2e) read and time records; JSON on stdout")
    add_address(consumer)
    consumer.add_argument("--expected", type=int, required=True)
    consumer.add_argument("--timeout-s", type=float, required=True)
    args = parser.parse_args()
    print(json.dumps(consume(args)), flush=True)
    return 0
