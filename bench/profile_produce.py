"""Broker produce path profile: where the leader's CPU goes on acks=all 1 MiB batches.

Starts etcd, a controller, three brokers and a gateway (LocalCluster in a temporary
directory), creates one partition with replicas [1, 2, 3] (broker 1 leads,
min.insync.replicas 2) and sends uncompressed 1 MiB batches of 100-byte records with
acks=all straight to the leader, --in-flight requests at a time. Three phases:

1. baseline: --duration-s of produce without a profiler: throughput in MB/s;
2. py-spy: the same with `py-spy record --pid <leader>` sampling the leader broker
   process: the top functions by self time (and the throughput under sampling);
3. cProfile: a second cluster whose broker 1 runs under `python -m cProfile -o`
   (launched by this script: LocalCluster's own command, behind the profiler): exact
   call counts of every function of ours in the leader, divided by the number of
   batches produced. The produce path must cost per batch, never per record
   (DESIGN.md section 4): a function of ours called --per-record-calls-min times per
   batch or more fails the check, and the script exits 1.

A script, not a test: `python bench/profile_produce.py --help`. Needs py-spy for phase 2
(`pip install -e '.[dev]'`); --no-py-spy skips it. Writes bench/results/profile_produce.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import pstats
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402

from bench import common  # noqa: E402
from bench.log_bench import machine  # noqa: E402
from clients.common.records import decode_batches, encode_values  # noqa: E402
from protos.highwater.v1 import broker_pb2_grpc, common_pb2, gateway_pb2_grpc  # noqa: E402
from services.common import limits  # noqa: E402
from services.common.server import channel_options  # noqa: E402
from services.launcher.local_cluster import LocalCluster, ServiceProcess  # noqa: E402

MIB = 1024 * 1024
RECORD_BYTES = 100
TOPIC = "profile-produce"
LEADER_ID = 1
LEADER = f"broker-{LEADER_ID}"
# Batches are built to fit Kafka's default max.message.bytes (1 MiB + 12), which the broker enforces.
BATCH_BYTES_MAX = min(MIB, limits.MAX_MESSAGE_BYTES)
PRODUCE_TIMEOUT_MS = 30_000
# The cluster needs this long to elect the leader and fill the ISR of a new topic.
TOPIC_READY_TIMEOUT_S = 30.0
# py-spy writes its file after the sampling ends; it must not take longer than this.
PY_SPY_EXIT_TIMEOUT_S = 60.0
# A broker under cProfile exits slower (it writes the profile after its controlled shutdown).
PROFILED_EXIT_TIMEOUT_S = 60.0
# Steps of the leader's produce path that should each run a fixed number of times per batch.
PER_BATCH_STEPS = {
    ("services/broker/replica_manager.py", "produce"),
    ("services/broker/partition.py", "append_as_leader"),
    ("clients/common/record_batch.py", "validate_batches"),
    ("clients/common/record_batch.py", "batch_crc"),
    ("services/broker/producer_state.py", "check"),
    ("services/broker/log/appends.py", "append_as_leader"),
    ("clients/common/record_batch.py", "assign_offsets"),
    ("services/broker/log/segment.py", "append"),
    ("services/broker/log/storage.py", "append"),
    ("services/broker/replica_manager.py", "_read_all"),
    ("services/broker/log/reads.py", "read"),
}
# py-spy frames look like "name (path:line)" or, with --function, "name (path)".
_FRAME = re.compile(r"^(?P<name>.*) \((?P<path>[^()]*?)(?::\d+)?\)$")


@dataclass
class ProduceRun:
    """What one produce phase did, as the client saw it."""

    phase: str
    batches_acked: int
    batches_failed: int
    errors: dict[str, int]
    records_per_batch: int
    batch_bytes: int
    elapsed_s: float

    @property
    def mb_per_s(self) -> float:
        return self.batches_acked * self.batch_bytes / self.elapsed_s / 1e6

    @property
    def batches_sent(self) -> int:
        return self.batches_acked + self.batches_failed


# ---- the cluster --------------------------------------------------------------------------------


class ProfiledCluster(LocalCluster):
    """A LocalCluster whose process `profiled` runs its usual command under `python -m cProfile -o`.

    LocalCluster starts `[python, -m, services, ...]`; for that one process `python` is a
    two-line launcher that execs the same interpreter with cProfile in front, so ports,
    ready files and logs work as for every other process. The profile is written when
    the process exits normally (SIGTERM -> clean stop).
    """

    def __init__(self, base_dir: Path, *, profiled: str, profile_path: Path, **kwargs: Any) -> None:
        super().__init__(base_dir, **kwargs)
        self.profiled = profiled
        self.profile_path = profile_path

    def _spawn(self, p: ServiceProcess) -> None:
        if p.name != self.profiled:
            super()._spawn(p)
            return
        launcher = self.base_dir / "run" / "python-under-cprofile"
        launcher.write_text(
            f"#!/bin/sh\nexec {shlex.quote(self.python)} -m cProfile "
            f'-o {shlex.quote(str(self.profile_path))} "$@"\n'
        )
        launcher.chmod(0o755)
        python, self.python = self.python, str(launcher)
        try:
            super()._spawn(p)
        finally:
            self.python = python


def create_topic_led_by_broker_1(cluster: LocalCluster) -> None:
    with grpc.insecure_channel(cluster.gateway_addresses[0]) as channel:
        gw = gateway_pb2_grpc.GatewayServiceStub(channel)  # type: ignore[no-untyped-call]  # generated, unannotated
        resp = gw.CreateTopics(
            common.create_topics_request(
                TOPIC,
                num_partitions=-1,
                replication_factor=-1,
                assignments={0: common_pb2.ReplicaList(replicas=[LEADER_ID, 2, 3])},
                min_insync=2,
            )
        )
        result = resp.topics[0]
        if result.error_code != common_pb2.NONE:
            raise SystemExit(
                f"CreateTopics failed: {common_pb2.ErrorCode.Name(result.error_code)} {result.error_message}"
            )
        deadline = time.monotonic() + TOPIC_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            states = gw.DescribeCluster(common_pb2.DescribeClusterRequest()).partitions
            state = next((s for s in states if s.topic == TOPIC and s.partition == 0), None)
            if state is not None and state.leader == LEADER_ID and sorted(state.isr) == [1, 2, 3]:
                return
            time.sleep(0.1)
    raise SystemExit(
        f"{TOPIC}-0 did not get leader {LEADER_ID} and a full ISR within {TOPIC_READY_TIMEOUT_S} s"
    )


def make_batch(target_bytes: int) -> bytes:
    """One uncompressed batch of 100-byte records, as many as fit in target_bytes, stamped now.

    A current timestamp matters: the broker's time-based retention (7 days) would delete
    rolled segments of old-stamped batches in the middle of the run.
    """
    now_ms = int(time.time() * 1000)
    per_record = len(encode_values([b"x" * RECORD_BYTES] * 100, timestamp_ms=now_ms)) / 100
    count = int((target_bytes - 61) / per_record)
    while True:
        batch = encode_values([os.urandom(RECORD_BYTES) for _ in range(count)], timestamp_ms=now_ms)
        if len(batch) <= target_bytes:
            return batch
        count -= max(1, int((len(batch) - target_bytes) / per_record))


# ---- producing ----------------------------------------------------------------------------------


async def _produce_for(
    address: str, batch: bytes, records_per_batch: int, duration_s: float, in_flight: int, phase: str
) -> ProduceRun:
    request = common.produce_request(TOPIC, [(0, batch)], timeout_ms=PRODUCE_TIMEOUT_MS)
    acked = 0
    errors: Counter[str] = Counter()
    async with grpc.aio.insecure_channel(address, options=channel_options()) as channel:
        stub = broker_pb2_grpc.BrokerServiceStub(channel)  # type: ignore[no-untyped-call]  # generated, unannotated
        started = time.monotonic()
        deadline = started + duration_s

        async def sender() -> None:
            nonlocal acked
            while time.monotonic() < deadline:
                resp = await stub.Produce(request, timeout=PRODUCE_TIMEOUT_MS / 1000 + 5)
                code = resp.topics[0].partitions[0].error_code
                if code == common_pb2.NONE:
                    acked += 1
                else:
                    errors[common_pb2.ErrorCode.Name(code)] += 1

        await asyncio.gather(*(sender() for _ in range(in_flight)))
        elapsed = time.monotonic() - started
    return ProduceRun(
        phase, acked, sum(errors.values()), dict(errors), records_per_batch, len(batch), elapsed
    )


def produce_for(
    cluster: LocalCluster, batch: bytes, records_per_batch: int, duration_s: float, in_flight: int, phase: str
) -> ProduceRun:
    run = asyncio.run(
        _produce_for(
            cluster.processes[LEADER].address, batch, records_per_batch, duration_s, in_flight, phase
        )
    )
    print(
        f"  {phase}: {run.batches_acked} batches acknowledged in {run.elapsed_s:.1f} s "
        f"= {run.mb_per_s:.1f} MB/s"
        + (f", {run.batches_failed} failed {run.errors}" if run.batches_failed else ""),
        flush=True,
    )
    return run


# ---- py-spy: self time ----------------------------------------------------------------------------

OUR_PACKAGES = ("services", "clients", "coordinator")
# Frames every event-loop sample passes through: not informative in the "ours" table.
_ENTRY_FILES = ("services/__main__.py", "services/cli.py")
_EVENT_LOOP_FRAME = "BaseEventLoop.run_forever"
_SELECT_FRAMES = ("EpollSelector.select", "_PollLikeSelector.select", "BaseSelector.select")


def _relative(path: str) -> str:
    """A file as our packages name it: relative to the repo or to site-packages / the stdlib.

    py-spy already shortens paths this way; cProfile gives absolute ones.
    """
    for marker in ("site-packages/", "/lib/python3.11/"):
        if marker in path:
            return path.split(marker, 1)[1]
    if os.path.isabs(path):
        try:
            return str(Path(path).resolve().relative_to(REPO))
        except ValueError:
            return path
    return path


def _is_ours(path: str) -> bool:
    relative = _relative(path)
    return (
        relative.split("/", 1)[0] in OUR_PACKAGES
        and relative.endswith(".py")
        and not relative.endswith(("_pb2.py", "_pb2_grpc.py"))
        and ".venv" not in relative
    )


@dataclass
class Samples:
    """py-spy's raw (collapsed stacks) output, counted per (function, file)."""

    total: int
    event_loop: int  # samples of the asyncio event loop thread
    event_loop_waiting: int  # ... of which waiting in select (epoll)
    self_samples: Counter[tuple[str, str]]
    inclusive: Counter[tuple[str, str]]


def parse_py_spy_raw(path: Path) -> Samples:
    samples = Samples(0, 0, 0, Counter(), Counter())
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = []
        for frame in stack.split(";"):
            match = _FRAME.match(frame)
            frames.append((match["name"], match["path"]) if match else (frame, ""))
        samples.total += count
        if any(name == _EVENT_LOOP_FRAME for name, _ in frames):
            samples.event_loop += count
            if frames[-1][0] in _SELECT_FRAMES:
                samples.event_loop_waiting += count
        samples.self_samples[frames[-1]] += count
        for name_and_path in set(frames):
            samples.inclusive[name_and_path] += count
    return samples


def run_py_spy(
    cluster: LocalCluster, batch: bytes, records_per_batch: int, args: argparse.Namespace, out_dir: Path
) -> tuple[ProduceRun, dict[str, object]] | None:
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if py_spy is None:
        print("  py-spy is not installed (pip install -e '.[dev]'): phase skipped", flush=True)
        return None
    raw = out_dir / "py-spy.raw"
    duration = math.ceil(args.duration_s)
    sampler = subprocess.Popen(
        [
            py_spy,
            "record",
            "--pid",
            str(cluster.processes[LEADER].pid),
            "--duration",
            str(duration),
            "--rate",
            str(args.py_spy_rate),
            "--format",
            "raw",
            "--function",
            "--output",
            str(raw),
            "--nonblocking",
            *(["--native"] if args.native else []),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        run = produce_for(cluster, batch, records_per_batch, duration, args.in_flight, "py-spy")
        output, _ = sampler.communicate(timeout=PY_SPY_EXIT_TIMEOUT_S)
    finally:
        if sampler.poll() is None:
            sampler.kill()
            sampler.wait()
    if sampler.returncode != 0 or not raw.exists():
        print(
            f"  py-spy failed (exit {sampler.returncode}): {output.decode(errors='replace')[-2000:]}",
            flush=True,
        )
        return run, {}
    s = parse_py_spy_raw(raw)
    wall = duration * args.py_spy_rate
    total = max(s.total, 1)
    ours_self = sum(n for (_, path), n in s.self_samples.items() if _is_ours(path))
    print(
        f"\n  leader broker, py-spy at {args.py_spy_rate} Hz for {duration} s ({wall} samples per thread): "
        f"{s.total} samples of running threads; the event loop thread ran {s.event_loop / wall:.0%} of the "
        f"time ({s.event_loop_waiting / wall:.0%} of it in epoll), other threads (gRPC's poller) "
        f"{(s.total - s.event_loop) / wall:.0%}; our code on top of the stack in {ours_self / total:.1%} "
        "of the samples"
    )
    print(
        "  top functions by self time (share of all samples; C work is charged to the Python frame calling "
        f"it)\n  {'self %':>7} {'incl %':>7}  function (file)"
    )
    top = []
    for (name, path), n in s.self_samples.most_common(args.top):
        share, incl = n / total, s.inclusive[(name, path)] / total
        top.append(
            {"function": name, "file": _relative(path), "self": round(share, 4), "inclusive": round(incl, 4)}
        )
        print(f"  {share:7.1%} {incl:7.1%}  {name} ({_relative(path)})")
    ours_inclusive = sorted(
        (
            (n, name, path)
            for (name, path), n in s.inclusive.items()
            if _is_ours(path) and _relative(path) not in _ENTRY_FILES
        ),
        reverse=True,
    )[: args.top]
    print(f"\n  our functions by inclusive time:\n  {'incl %':>7} {'self %':>7}  function (file)")
    for n, name, path in ours_inclusive:
        print(f"  {n / total:7.1%} {s.self_samples[(name, path)] / total:7.1%}  {name} ({_relative(path)})")
    return run, {
        "samples": s.total,
        "event_loop_busy": round((s.event_loop - s.event_loop_waiting) / wall, 3),
        "ours_self_share": round(ours_self / total, 4),
        "top_self": top,
        "ours_inclusive": [
            {"function": name, "file": _relative(path), "inclusive": round(n / total, 4)}
            for n, name, path in ours_inclusive
        ],
    }


# ---- cProfile: call counts -------------------------------------------------------------------------


def check_call_counts(profile: Path, run: ProduceRun, args: argparse.Namespace) -> dict[str, object]:
    """Per-batch calls of every function of ours in the leader; flags any called per record."""
    stats = pstats.Stats(str(profile))
    batches = max(run.batches_sent, 1)
    limit_calls = args.per_record_calls_min * batches
    ours = []
    for (path, line, name), (_, ncalls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]  # pstats' table, not in typeshed
        if _is_ours(path):
            ours.append((ncalls, name, _relative(path), line, tottime, cumtime))
    ours.sort(reverse=True)
    print(
        f"\n  leader broker under cProfile: {run.batches_sent} batches of {run.records_per_batch} records "
        f"({run.batches_sent * run.records_per_batch} records)"
    )
    print(
        f"  our functions with the most calls:\n  {'calls':>9} {'per batch':>9} {'self s':>7}  function "
        "(file:line)"
    )
    for ncalls, name, path, line, tottime, _ in ours[: args.top]:
        print(f"  {ncalls:9d} {ncalls / batches:9.2f} {tottime:7.2f}  {name} ({path}:{line})")
    print(
        "  (cProfile counts every resumption of a coroutine as a call: produce resumes while it waits for "
        "the HW)"
    )
    print(
        f"\n  the per-batch steps of the produce path:\n  {'calls':>9} {'per batch':>9} {'self s':>7}  "
        "function (file)"
    )
    for ncalls, name, path, line, tottime, _ in ours:
        if (path, name) in PER_BATCH_STEPS:
            print(f"  {ncalls:9d} {ncalls / batches:9.2f} {tottime:7.2f}  {name} ({path}:{line})")
    flagged = [(ncalls, name, path, line) for ncalls, name, path, line, _, _ in ours if ncalls >= limit_calls]
    if flagged:
        print(f"\n  FAIL: called {args.per_record_calls_min}+ times per batch (per-record work):")
        for ncalls, name, path, line in flagged:
            print(f"    {name} ({path}:{line}): {ncalls} calls, {ncalls / batches:.0f} per batch")
    else:
        top_rate = ours[0][0] / batches if ours else 0.0
        print(
            "\n  OK: no function of ours is called per record: the most called, "
            f"{ours[0][1] if ours else '-'}, "
            f"runs {top_rate:.1f} times per batch (a batch holds {run.records_per_batch} records; the limit "
            f"is {args.per_record_calls_min} per batch)"
        )
    return {
        "batches": run.batches_sent,
        "records_per_batch": run.records_per_batch,
        "most_called": [
            {
                "function": name,
                "file": f"{path}:{line}",
                "calls": ncalls,
                "per_batch": round(ncalls / batches, 2),
            }
            for ncalls, name, path, line, _, _ in ours[: args.top]
        ],
        "per_record_functions": [f"{name} ({path}:{line})" for _, name, path, line in flagged],
    }


# ---- main -------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--duration-s", type=float, default=10.0, help="Produce time of each phase (default 10)."
    )
    parser.add_argument(
        "--warmup-s", type=float, default=2.0, help="Unmeasured produce time first (default 2)."
    )
    parser.add_argument(
        "--in-flight", type=int, default=4, help="Produce requests in flight at once (default 4)."
    )
    parser.add_argument(
        "--py-spy-rate", type=int, default=100, help="py-spy samples per second (default 100)."
    )
    parser.add_argument("--no-py-spy", action="store_true", help="Skip the py-spy phase.")
    parser.add_argument(
        "--native",
        action="store_true",
        help="py-spy --native: show C/C++ frames (gRPC, protobuf) instead of charging them to Python.",
    )
    parser.add_argument(
        "--no-cprofile", action="store_true", help="Skip the cProfile phase (its own cluster)."
    )
    parser.add_argument(
        "--per-record-calls-min",
        type=int,
        default=100,
        help="Calls per batch from which a function counts as per-record work (default 100; "
        "a 1 MiB batch holds ~9,600 records).",
    )
    parser.add_argument("--top", type=int, default=15, help="Rows in each table (default 15).")
    parser.add_argument(
        "--keep-dir", action="store_true", help="Keep the temporary directory (logs, profiles)."
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=REPO / "bench" / "results" / "profile_produce.json",
        help="Where to write the figures (default bench/results/profile_produce.json).",
    )
    args = parser.parse_args()

    batch = make_batch(BATCH_BYTES_MAX)
    records_per_batch = sum(1 for _ in decode_batches(batch))
    print(
        f"batch: {len(batch)} bytes, {records_per_batch} records of 100 bytes; acks=all, RF 3, "
        f"min.insync.replicas 2, {args.in_flight} requests in flight; load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="highwater-profile-produce-"))
    results: dict[str, object] = {
        "machine": machine(),
        "batch_bytes": len(batch),
        "records_per_batch": records_per_batch,
        "in_flight": args.in_flight,
        "duration_s": args.duration_s,
        "load_average_start": os.getloadavg()[0],
    }
    failed_check = False
    try:
        if not args.no_py_spy:
            print("cluster 1 (no profiler in the broker code; py-spy attaches from outside)", flush=True)
            with LocalCluster(work / "cluster", brokers=3) as cluster:
                create_topic_led_by_broker_1(cluster)
                produce_for(cluster, batch, records_per_batch, args.warmup_s, args.in_flight, "warm-up")
                baseline = produce_for(
                    cluster, batch, records_per_batch, args.duration_s, args.in_flight, "baseline"
                )
                results["baseline"] = {**asdict(baseline), "mb_per_s": round(baseline.mb_per_s, 1)}
                sampled = run_py_spy(cluster, batch, records_per_batch, args, work)
                if sampled is not None:
                    run, profile = sampled
                    results["py_spy"] = {**asdict(run), "mb_per_s": round(run.mb_per_s, 1), **profile}
        if not args.no_cprofile:
            profile_path = work / "leader.cprofile"
            print(f"\ncluster 2 ({LEADER} under cProfile)", flush=True)
            cluster = ProfiledCluster(
                work / "cluster-cprofile", brokers=3, profiled=LEADER, profile_path=profile_path
            )
            with cluster:
                create_topic_led_by_broker_1(cluster)
                run = produce_for(
                    cluster, batch, records_per_batch, args.duration_s, args.in_flight, "cProfile"
                )
                leader = cluster.processes[LEADER]
                cluster.terminate(LEADER, timeout_s=PROFILED_EXIT_TIMEOUT_S)
            if not profile_path.exists():
                raise SystemExit(
                    f"{LEADER} wrote no profile (exit code "
                    f"{leader.proc.returncode if leader.proc else None}); "
                    f"its log ends with:\n{leader.log_tail()}"
                )
            counts = check_call_counts(profile_path, run, args)
            results["cprofile"] = {**asdict(run), "mb_per_s": round(run.mb_per_s, 1), **counts}
            failed_check = bool(counts["per_record_functions"])
    finally:
        if args.keep_dir:
            print(f"\nlogs and profiles kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nfigures written to {args.json}")
    return 1 if failed_check else 0


if __name__ == "__main__":
    sys.exit(main())
