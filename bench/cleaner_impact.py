"""Highwater's produce and end-to-end figures with the log cleaner busy against idle, in one run.

    .venv/bin/python bench/cleaner_impact.py [--rounds 3] [--workloads produce-100b e2e]

Issue 39 asks that compacting topics costs produce and fetch little: the figures of
bench/peers/compare.py (Highwater alone, its own paths and its Kafka listeners) with every
broker's log cleaner busy must be within 10% of the same figures with the cleaner idle. This
script starts one LocalCluster (3 brokers, RF 3, min.insync.replicas 2) and measures each
workload in both modes, alternating per round (busy then idle in odd rounds, idle then busy in
even ones) so that both see the same machine load and neither always goes first:

- busy: a background writer, a process of its own (this script with `writer`), sends
  --writer-rate records/s with random keys out of --writer-keys to a compacted topic
  (cleanup.policy=compact, segment.bytes --segment-bytes, segment.ms --segment-ms,
  min.cleanable.dirty.ratio --min-cleanable-dirty-ratio, min.compaction.lag.ms 0) with RF 3,
  so every broker's cleaner (followers clean their copies too) has a newly rolled dirty
  segment to clean every segment.ms, and each pass re-reads the log's clean part, which holds
  a record for every key written so far;
- idle: the same writer at the same rate, same keys and segment settings, to a topic with
  cleanup.policy=delete (retention.ms --idle-retention-ms keeps its disk bounded). The writer
  is kept rather than dropped so that the only difference between the modes is the cleaner's
  work: without it the idle mode would also lack the writer's produce traffic, replication and
  CPU, and the ratio would charge all of that to the cleaner. The busy topic is set to
  cleanup.policy=delete without retention for the idle mode (back to compact for the busy
  one), so a cleaner still behind the busy writer stops.

The brokers run with --log-cleaner-backoff-ms --cleaner-backoff-ms (default 1000, Kafka's and
our default is 15 s), so the cleaner looks for work again within a second of finding none: the
worst case for produce. Everything else is the brokers' defaults (the 64 MiB/s I/O throttle
included), as users run them.

The cleaner is checked, not assumed: the brokers' highwater_log_cleaner_bytes_read counters are
read before and after each measured run (warm-up included) and the MB each broker's cleaner read
in it is reported. A busy run in which any broker's cleaner read nothing is INVALID (said so,
and left out of the verdict); so is an idle run in which a cleaner read something (the busy
topic's last dirty segments: each idle mode first waits for the counters to stand still).

`--control` runs an A/A control instead: the busy arm becomes a second idle one (`idle-again`),
so its ratios against idle show how far two runs of the same thing differ on this machine, the
spread a busy / idle ratio must be read against.

Per round it prints every figure in both modes and the ratio busy / idle of each: records/s and
MB/s (produce; >= 0.90 meets the target), latency p50 and p99 (per produce request, and send ->
receive for e2e; <= 1.10 meets it); then the median of each ratio over the valid rounds with
its verdict. Every process is stopped by pid at the end (also on Ctrl-C or SIGTERM), data in a
temporary directory. Writes bench/results/cleaner-impact.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/cleaner_impact.py` from anywhere

from bench import common, produce
from bench.peers import compare
from clients.admin import Admin
from clients.config import BATCH_SIZE_BYTES_DEFAULT, LINGER_MS_DEFAULT

MODES = ("busy", "idle")
# --control (an A/A run): the busy arm replaced by a second idle one, measured exactly as idle, so
# its ratio against idle is this machine's own spread between two runs of the same thing.
CONTROL = "idle-again"
WORKLOADS = ("produce-100b", "produce-10kb", "e2e")
BUSY_TOPIC = "cleaner-busy"
IDLE_TOPIC = "cleaner-idle"
CLEANER_BYTES_READ = "highwater_log_cleaner_bytes_read"
# The target: each figure with the cleaner busy within 10% of the same figure idle.
TARGET_FRACTION = 0.10
# The writer says "ready" once it has the topic's metadata; a cluster that cannot give it in
# this long is broken, not slow.
WRITER_READY_TIMEOUT_S = 60.0
# The writer flushes what it queued when told to stop; then it is killed.
WRITER_STOP_TIMEOUT_S = 40.0
# Busy: how long to wait, after the warm-up, for every broker's cleaner to have read something.
CLEANING_START_TIMEOUT_S = 90.0
# Idle: the cleaner counters must stand still this long (beyond one backoff) before measuring,
# and that must happen within the timeout.
IDLE_STILL_S = 2.0
IDLE_SETTLE_TIMEOUT_S = 90.0
# How often the counters are read while waiting for the cleaner to start or stop.
CLEANER_POLL_S = 0.5
# The writer's pacing step: it sends what its schedule owes every this many seconds.
WRITER_TICK_S = 0.01


# ---- the background writer (its own process) ----------------------------------------------------


def writer_main(argv: list[str]) -> int:
    """`writer`: send --rate records/s with random keys to --topic until SIGTERM/SIGINT, flush,
    print what was sent and acknowledged as JSON."""
    from clients.producer import Producer

    parser = argparse.ArgumentParser(prog="cleaner_impact.py writer")
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--keys", type=int, required=True)
    parser.add_argument("--value-bytes", type=int, required=True)
    args = parser.parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):  # Ctrl-C reaches the whole process group
        signal.signal(signum, lambda *_: stop.set())
    rng = random.Random(39)
    value = b"v" * args.value_bytes
    lock = threading.Lock()
    counts = {"acked": 0, "failed": 0}
    errors: dict[str, int] = {}

    def on_done(_metadata: object, error: Exception | None) -> None:
        with lock:
            if error is None:
                counts["acked"] += 1
            else:
                counts["failed"] += 1
                name = type(error).__name__
                errors[name] = errors.get(name, 0) + 1

    sent = 0
    with Producer(args.gateway, acks="all") as producer:
        producer.partitions_for(args.topic)
        print("ready", flush=True)
        start = time.perf_counter()
        while not stop.is_set():
            owed = int((time.perf_counter() - start) * args.rate) - sent
            for _ in range(owed):
                key = b"key-%08d" % rng.randrange(args.keys)
                producer.produce(args.topic, value, key=key, callback=on_done)
            sent += max(owed, 0)
            stop.wait(WRITER_TICK_S)
        elapsed = time.perf_counter() - start
        flush_error = ""
        try:
            producer.flush(timeout_ms=int(WRITER_STOP_TIMEOUT_S * 1000 / 2))
        except Exception as error:  # still say what was sent; the records' callbacks count the rest
            flush_error = f"{type(error).__name__}: {error}"
    with lock:
        print(
            json.dumps(
                {
                    "sent": sent,
                    **counts,
                    "errors": errors,
                    "elapsed_s": round(elapsed, 2),
                    "achieved_rate": round(sent / elapsed) if elapsed > 0 else 0,
                    **({"flush_error": flush_error} if flush_error else {}),
                }
            ),
            flush=True,
        )
    return 0


class BackgroundWriter:
    """The writer process on one topic, from start() until stop() (by pid)."""

    def __init__(self, gateway: str, topic: str, args: argparse.Namespace) -> None:
        self.topic = topic
        cmd = [
            sys.executable,
            __file__,
            "writer",
            "--gateway",
            gateway,
            "--topic",
            topic,
            "--rate",
            str(args.writer_rate),
            "--keys",
            str(args.writer_keys),
            "--value-bytes",
            str(args.writer_value_bytes),
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
            preexec_fn=common._die_with_parent,
        )
        ready = threading.Event()

        def wait_ready() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                if line.strip() == "ready":
                    ready.set()
                    return

        waiter = threading.Thread(target=wait_ready, daemon=True)
        waiter.start()
        if not ready.wait(WRITER_READY_TIMEOUT_S):
            self.stop()
            raise SystemExit(
                f"the background writer on {topic} did not get the topic's metadata within "
                f"{WRITER_READY_TIMEOUT_S:.0f} s (exit status {self.proc.returncode}): is the cluster up?"
            )
        waiter.join()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> common.Result:
        """SIGTERM, then what it printed (SIGKILL if it does not finish in time)."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=WRITER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return {"error": f"did not stop within {WRITER_STOP_TIMEOUT_S:.0f} s of SIGTERM: killed"}
        for line in reversed((out or "").splitlines()):
            if line.startswith("{"):
                summary: common.Result = json.loads(line)
                return summary
        return {"error": f"exited {self.proc.returncode} without its summary"}


# ---- the cluster and the cleaner's counters -----------------------------------------------------


class CleanerSystems(compare.Systems):
    """compare.py's Systems with Highwater alone, on brokers given --log-cleaner-backoff-ms."""

    def __init__(self, stack: contextlib.ExitStack, args: argparse.Namespace) -> None:
        self.args = args
        self.hw = stack.enter_context(
            common.highwater_target(
                bootstrap=None,
                topic="bench-warm",
                partitions=args.partitions,
                replication_factor=3,
                min_insync=2,
                broker_args=[
                    "--log-cleaner-backoff-ms",
                    str(args.cleaner_backoff_ms),
                    *(
                        ["--log-cleaner-cpu-share-under-pressure", str(args.cleaner_share_under_pressure)]
                        if args.cleaner_share_under_pressure is not None
                        else []
                    ),
                ],
            )
        )
        self.names = ("highwater",)
        self._round_topic = 0


def cleaner_bytes_read(target: common.Target) -> dict[str, float]:
    """Broker name -> its cleaner's bytes read so far (highwater_log_cleaner_bytes_read)."""
    out: dict[str, float] = {}
    for name, port in sorted(target.metrics_ports.items()):
        if not name.startswith("broker"):
            continue
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError as error:
            raise SystemExit(f"{name}'s /metrics on port {port} did not answer: {error}") from error
        for line in text.splitlines():
            if line.startswith(CLEANER_BYTES_READ) and not line.startswith(CLEANER_BYTES_READ + "_created"):
                out[name] = float(line.rsplit(" ", 1)[1])
    return out


def cleaned(before: dict[str, float], after: dict[str, float], seconds: float) -> common.Result:
    """MB each broker's cleaner read between two readings, in total and per second."""
    per = {name: round((after.get(name, 0.0) - value) / 1e6, 2) for name, value in before.items()}
    total = round(sum(per.values()), 2)
    return {
        "mb_read": per,
        "mb_read_total": total,
        "mb_per_s": round(total / seconds, 2) if seconds > 0 else 0.0,
        "window_s": round(seconds, 1),
    }


def wait_for_cleaner(target: common.Target, mode: str, backoff_s: float) -> common.Result:
    """busy: until every broker's cleaner has read something; idle: until none has for a while."""
    start = time.monotonic()
    first = last = cleaner_bytes_read(target)
    still_since = start
    deadline = start + (CLEANING_START_TIMEOUT_S if mode == "busy" else IDLE_SETTLE_TIMEOUT_S)
    while time.monotonic() < deadline:
        time.sleep(CLEANER_POLL_S)
        now = cleaner_bytes_read(target)
        if mode == "busy":
            if all(now.get(name, 0.0) > value for name, value in first.items()):
                return {"cleaning": True, "waited_s": round(time.monotonic() - start, 1)}
        else:
            if now != last:
                still_since = time.monotonic()
            elif time.monotonic() - still_since >= backoff_s + IDLE_STILL_S:
                return {"still": True, "waited_s": round(time.monotonic() - start, 1)}
        last = now
    what = "every broker's cleaner to start" if mode == "busy" else "the cleaners to stand still"
    print(f"  note: waited {time.monotonic() - start:.0f} s for {what}; measuring anyway", flush=True)
    return {"cleaning" if mode == "busy" else "still": False, "waited_s": round(time.monotonic() - start, 1)}


def set_busy_topic_policy(gateway: str, mode: str) -> None:
    """The busy topic compacted in busy mode, not in idle mode.

    A cleaner held to its CPU share (--log-cleaner-cpu-max-share) can stay behind the busy
    writer for minutes: idle mode would then measure it still cleaning what busy mode left.
    Under `delete` with no retention the cleaner leaves the topic alone and nothing is removed,
    so the next busy mode finds the same log to go on with.
    """
    idle = {"cleanup.policy": "delete", "retention.ms": "-1"}
    configs = {"cleanup.policy": "compact"} if mode == "busy" else idle
    with Admin(gateway) as admin:
        admin.alter_topic_configs(BUSY_TOPIC, set=configs)


def create_writer_topics(gateway: str, args: argparse.Namespace) -> None:
    """The compacted topic the busy writer updates and the delete topic the idle one appends to."""
    shared = {"segment.bytes": str(args.segment_bytes), "segment.ms": str(args.segment_ms)}
    topics = {
        BUSY_TOPIC: {
            **shared,
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": str(args.min_cleanable_dirty_ratio),
            "min.compaction.lag.ms": "0",
        },
        IDLE_TOPIC: {**shared, "cleanup.policy": "delete", "retention.ms": str(args.idle_retention_ms)},
    }
    for topic, configs in topics.items():
        common.create_topic(
            gateway,
            topic,
            partitions=args.writer_partitions,
            replication_factor=3,
            min_insync=2,
            configs=configs,
        )


# ---- one mode of one round ----------------------------------------------------------------------


def cases(args: argparse.Namespace) -> list[tuple[str, float | None]]:
    """(workload, e2e rate or None), in the order each mode runs them."""
    out: list[tuple[str, float | None]] = []
    for workload in args.workloads:
        out += [(workload, rate) for rate in args.rates] if workload == "e2e" else [(workload, None)]
    return out


def run_case(systems: CleanerSystems, workload: str, rate: float | None) -> list[common.Result]:
    """compare.py's run of `workload` for Highwater (its paths and its Kafka listeners)."""
    args = systems.args
    args.workload = workload  # compare's fresh_topic names the topic after it
    args.partitions = 1 if workload == "e2e" else args.produce_partitions
    # fresh_topic sets the topic and its leaders, not its partition count (constant in compare.py,
    # which runs one workload): the e2e consumer is assigned target.partitions partitions.
    systems.hw.partitions = args.partitions
    args.duration_s = args.e2e_duration_s if workload == "e2e" else args.produce_duration_s
    if rate is not None:  # cases() gives a rate to e2e cases and to no other
        return compare.run_e2e(systems, "highwater", rate)
    return compare.run_produce(systems, "highwater", compare.RECORD_SIZES[workload])


def valid(mode: str, cleaner: common.Result) -> tuple[bool, str]:
    """Whether a run measured what its mode says, and why not."""
    per: dict[str, float] = cleaner["mb_read"]
    if mode == "busy":
        idle_brokers = [name for name, mb in per.items() if mb <= 0]
        if idle_brokers:
            return False, f"INVALID: the cleaner of {', '.join(idle_brokers)} read nothing in this busy run"
        return True, ""
    if float(cleaner["mb_read_total"]) > 0:
        return False, f"INVALID: the cleaners read {cleaner['mb_read_total']} MB in this idle run"
    return True, ""


def run_mode(systems: CleanerSystems, mode: str, number: int) -> common.Result:
    """The writer of `mode` started, its warm-up, the cleaner checked, every case measured."""
    args = systems.args
    target = systems.hw
    topic = BUSY_TOPIC if mode == "busy" else IDLE_TOPIC
    set_busy_topic_policy(target.gateway, mode)
    writer = BackgroundWriter(target.gateway, topic, args)
    print(
        f"  round {number} {mode}: writer (pid {writer.pid}) on {topic} at {args.writer_rate:,.0f}/s",
        flush=True,
    )
    rows: list[common.Result] = []
    try:
        time.sleep(args.writer_warmup_s)
        ready = wait_for_cleaner(target, mode, args.cleaner_backoff_ms / 1000)
        print(f"  round {number} {mode}: cleaner {ready}", flush=True)
        for workload, rate in cases(args):
            gate = common.wait_for_quiet(wait_s=args.quiet_wait_s, say=False)
            before, started = cleaner_bytes_read(target), time.monotonic()
            try:
                got = run_case(systems, workload, rate)
            except (Exception, SystemExit) as exc:  # one failing case must not lose the others' figures
                if isinstance(exc, SystemExit) and not isinstance(exc.code, str):
                    raise  # SIGTERM's (stopped_by_sigterm): stop; a message is a failed case
                print(f"  round {number} {mode}: {workload} FAILED: {type(exc).__name__}: {exc}", flush=True)
                rows.append({"workload": workload, "rate": rate, "error": f"{type(exc).__name__}: {exc}"})
                continue
            cleaner = cleaned(before, cleaner_bytes_read(target), time.monotonic() - started)
            ok, why = valid(mode, cleaner)
            kind = "e2e" if workload == "e2e" else "produce"
            for result in got:
                result.update(gate, load_1m_after=common.load_average())
                result.update(workload=workload, mode=mode, cleaner=cleaner, valid=ok)
                print(f"  round {number} {mode}: {workload:<12} {compare.line(result, kind)}", flush=True)
            print(
                f"  round {number} {mode}: {workload:<12} cleaner read {cleaner['mb_read_total']} MB "
                f"({cleaner['mb_per_s']} MB/s; per broker {cleaner['mb_read']}) {why}",
                flush=True,
            )
            rows.extend(got)
    finally:
        stats = writer.stop()
    print(f"  round {number} {mode}: writer {stats}", flush=True)
    return {"mode": mode, "writer": stats, "cleaner_ready": ready, "results": rows}


# ---- ratios --------------------------------------------------------------------------------------


def figures(result: common.Result) -> dict[str, float]:
    """The figures compared, by name: throughput (produce) and latency percentiles."""
    out: dict[str, float] = {}
    if result["workload"] == "e2e":
        lat = result.get("latency") or {}
    else:
        out["records_per_s"] = float(result["records_per_s"])
        out["mb_per_s"] = float(result["mb_per_s"])
        lat = result.get("latency_per_request") or {}
    for name in ("p50_ms", "p99_ms"):
        if name in lat:
            out[f"latency_{name}"] = float(lat[name])
    return out


def case_key(result: common.Result) -> str:
    rate = result.get("rate")
    return f"{result['workload']} {result['system']}" + (f" @ {rate:,.0f}/s" if rate else "")


def round_ratios(busy: list[common.Result], idle: list[common.Result]) -> dict[str, dict[str, float]]:
    """case -> figure -> busy / idle, over the cases both modes measured validly."""
    idle_by = {case_key(r): r for r in idle if "error" not in r and r.get("valid")}
    out: dict[str, dict[str, float]] = {}
    for b in busy:
        if "error" in b or not b.get("valid") or case_key(b) not in idle_by:
            continue
        i = figures(idle_by[case_key(b)])
        out[case_key(b)] = {
            name: round(value / i[name], 3) for name, value in figures(b).items() if i.get(name)
        }
    return out


def verdict(figure: str, ratio: float) -> str:
    """The 10% target: throughput no lower than 0.90x, latency no higher than 1.10x."""
    if figure.startswith("latency"):
        return "met" if ratio <= 1 + TARGET_FRACTION else "NOT met"
    return "met" if ratio >= 1 - TARGET_FRACTION else "NOT met"


def medians(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, common.Result]]:
    """case -> figure -> the median of its busy / idle ratios over the rounds, and its verdict."""
    out: dict[str, dict[str, common.Result]] = {}
    for ratios in rounds:
        for key, per in ratios.items():
            for name in per:
                out.setdefault(key, {}).setdefault(name, {})
    for key, per_figure in out.items():
        for name in per_figure:
            values = [r[key][name] for r in rounds if name in r.get(key, {})]
            median = round(statistics.median(values), 3)
            per_figure[name] = {"median": median, "rounds": len(values), "verdict": verdict(name, median)}
    return out


# ---- the command line ----------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of busy + idle (default 3)")
    parser.add_argument(
        "--control",
        action="store_true",
        help="an A/A control: a second idle arm instead of the busy one (this machine's spread)",
    )
    parser.add_argument(
        "--workloads",
        nargs="+",
        choices=WORKLOADS,
        default=["produce-100b", "e2e"],
        help="compare.py workloads, in this order in each mode (default produce-100b e2e)",
    )
    parser.add_argument(
        "--produce-duration-s", type=float, default=6.0, help="measured s per produce run (6)"
    )
    parser.add_argument("--e2e-duration-s", type=float, default=8.0, help="measured s per e2e rate (8)")
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument(
        "--produce-partitions", type=int, default=6, help="produce topic partitions (6; e2e 1)"
    )
    parser.add_argument("--rates", type=float, nargs="+", default=[2000, 20000], help="e2e rates (records/s)")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE_BYTES_DEFAULT)
    parser.add_argument("--records-per-send", type=int, default=0)
    parser.add_argument("--linger-ms", type=int, default=LINGER_MS_DEFAULT)
    parser.add_argument("--in-flight", type=int, default=5)
    parser.add_argument(
        "--our-paths", nargs="+", choices=produce.PATHS, default=["client", "direct"], help="produce paths"
    )
    parser.add_argument(
        "--kafka",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also through the brokers' Kafka listeners with confluent-kafka (default on)",
    )
    writer = parser.add_argument_group("the background writer and its topics")
    writer.add_argument("--writer-rate", type=float, default=5000, help="records/s (default 5000)")
    writer.add_argument("--writer-keys", type=int, default=200_000, help="distinct keys (default 200,000)")
    writer.add_argument("--writer-value-bytes", type=int, default=100, help="value size (default 100)")
    writer.add_argument("--writer-partitions", type=int, default=3, help="partitions (default 3)")
    writer.add_argument(
        "--writer-warmup-s",
        type=float,
        default=20.0,
        help="writing before each mode is measured (default 20)",
    )
    writer.add_argument("--segment-bytes", type=int, default=1024 * 1024, help="segment.bytes (1 MiB)")
    writer.add_argument("--segment-ms", type=int, default=1000, help="segment.ms (default 1000)")
    writer.add_argument(
        "--min-cleanable-dirty-ratio", type=float, default=0.01, help="of the busy topic (default 0.01)"
    )
    writer.add_argument(
        "--idle-retention-ms", type=int, default=120_000, help="retention.ms of the idle topic (120000)"
    )
    writer.add_argument(
        "--cleaner-backoff-ms", type=int, default=1000, help="the brokers' --log-cleaner-backoff-ms (1000)"
    )
    writer.add_argument(
        "--cleaner-share-under-pressure",
        type=float,
        default=None,
        help="the brokers' --log-cleaner-cpu-share-under-pressure (default: theirs, 0.02); the "
        "max share (0.1) makes a busy cleaner read in runs of a second on a contended machine",
    )
    parser.add_argument(
        "--quiet-wait-s",
        type=float,
        default=0.0,
        help="per run, wait up to this long for the 1-minute load to drop (default 0: the writer loads it)",
    )
    parser.add_argument("--output", default="cleaner-impact", help="a name under bench/results, or a path")
    args = parser.parse_args()
    # What compare.run_produce / run_e2e / Systems read beside the above (run_case sets the rest).
    args.partitions = args.produce_partitions
    args.workload = args.workloads[0]
    args.duration_s = args.produce_duration_s
    return args


def main() -> int:
    if sys.argv[1:2] == ["writer"]:
        return writer_main(sys.argv[2:])
    args = parse_args()
    out: common.Result = {**common.header(), "args": dict(vars(args)), "rounds": []}
    arms_text = "idle + idle (A/A control)" if args.control else "busy + idle"
    print(
        f"cleaner impact: {args.rounds} round(s) of {arms_text}; {', '.join(args.workloads)}; "
        f"writer {args.writer_rate:,.0f} records/s over {args.writer_keys:,} keys",
        flush=True,
    )
    started = time.monotonic()
    all_ratios: list[dict[str, dict[str, float]]] = []
    with contextlib.ExitStack() as stack:
        systems = CleanerSystems(stack, args)
        create_writer_topics(systems.hw.gateway, args)
        print(f"  cluster up in {time.monotonic() - started:.1f} s", flush=True)
        arms = (CONTROL, "idle") if args.control else MODES
        label = f"{arms[0]}/idle"
        for number in range(1, args.rounds + 1):
            order = arms if number % 2 else arms[::-1]
            modes = {mode: run_mode(systems, mode, number) for mode in order}
            ratios = round_ratios(modes[arms[0]]["results"], modes["idle"]["results"])
            for key, per in ratios.items():
                shown = ", ".join(f"{name} {value}x" for name, value in per.items())
                print(f"  round {number} {label} {key}: {shown}", flush=True)
            all_ratios.append(ratios)
            out["rounds"].append({"order": list(order), "modes": modes, "ratios": ratios})
    summary = medians(all_ratios)
    out["ratio_median"] = summary
    print(f"{label} (median over valid rounds; target within {TARGET_FRACTION:.0%}):")
    if not summary:
        print("  none: no round had a valid busy and idle run of the same case")
    for key, per_figure in summary.items():
        for name, got in per_figure.items():
            print(f"  {key:<40} {name:<16} {got['median']}x over {got['rounds']} round(s): {got['verdict']}")
    path = common.write_result(args.output, out)
    print(
        f"took {time.monotonic() - started:.0f} s; machine: {out['machine']}; results: {common.shown(path)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
