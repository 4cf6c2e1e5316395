"""End-to-end latency: from Producer.send() to Consumer.poll() returning the record.

A consumer runs in another process (this script with `consumer`), assigned every
partition of the topic at its end; once it says it is ready, this process produces
records of --record-size bytes at each --rates value (records/s; default 2,000 and
20,000) for --duration-s seconds, with acks=all, linger_ms --linger-ms (default 0: send
at once), through the gateway. Each record carries its send time (time.time_ns(), the
machine's clock, which both processes read) in its first 8 bytes and a flag saying whether
it falls in the warm-up (--warmup-s, not counted). The consumer reports p50, p99, p99.9
and max of receive time - send time. Consumers read only below the high watermark, so a
record is seen only after every ISR member has it.

Starts its own LocalCluster (3 brokers, RF 3, min.insync.replicas 2) unless --bootstrap is
given. Records the CPU of every process, producer and consumer included. Writes
bench/results/e2e_latency.json. Example: python bench/e2e_latency.py --rates 2000 20000

--hops also captures partition 0's leader's traffic on loopback with tcpdump (root or
CAP_NET_RAW) for --hops-capture-s seconds in the middle of each rate, and prints where each
record's time went, hop by hop (bench/hops.py: the Producer, the leader, the followers'
acknowledgements, the HW's move to the consumer).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common, hops

# (send time in ns since the epoch, 1 if measured / 0 if warm-up) lead every payload.
STAMP = struct.Struct(">qB")
CONSUMER_READY_TIMEOUT_S = 30.0
# The consumer keeps reading this long after the producer stops, for records in flight.
DRAIN_S = 5.0
# --hops: the capture starts this long after the warm-up ends, and is cut to this many bytes
# per packet (a record's stamp lies within the first few hundred bytes of its segment).
HOPS_START_AFTER_WARMUP_S = 1.0
HOPS_SNAP_BYTES = 512
# tcpdump is given this long to start (and to fail on a missing permission) and to stop.
TCPDUMP_SETTLE_S = 5.0


@dataclass(frozen=True)
class RateSettings:
    """How run_rate measures one rate: this script's flags, and what bench/peers/compare.py asks.

    A dataclass with a default for every setting, not the argparse Namespace: a caller that
    builds one (compare.py) keeps working when a flag is added here, and mypy checks its names.
    """

    warmup_s: float
    duration_s: float
    record_size: int = 100
    linger_ms: int = 0
    fetch_max_wait_ms: int = 500
    # Wait up to this long before the rate for the 1-minute load to drop (common.wait_for_quiet).
    quiet_wait_s: float = 0.0
    hops: bool = False
    hops_capture_s: float = 2.0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RateSettings:
        return cls(
            warmup_s=args.warmup_s,
            duration_s=args.duration_s,
            record_size=args.record_size,
            linger_ms=args.linger_ms,
            fetch_max_wait_ms=args.fetch_max_wait_ms,
            quiet_wait_s=args.quiet_wait_s,
            hops=args.hops,
            hops_capture_s=args.hops_capture_s,
        )


def stamped(pad: bytes, measured: bool) -> bytes:
    return STAMP.pack(time.time_ns(), 1 if measured else 0) + pad


class E2EConsumer:
    """A consumer process started with `cmd`: waits for its 'ready' line; result() reads its JSON."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            preexec_fn=common._die_with_parent,
        )
        stdout = self.proc.stdout
        if stdout is None:
            raise RuntimeError(
                f"the e2e consumer's stdout is not a pipe (Popen stdout=PIPE gives one): {cmd}"
            )
        deadline = time.monotonic() + CONSUMER_READY_TIMEOUT_S
        line = ""
        while time.monotonic() < deadline:
            line = stdout.readline()
            if line.strip() == "ready" or not line:
                break
        if line.strip() != "ready":
            common.stop_process(self.proc)
            raise SystemExit(f"the e2e consumer ({' '.join(cmd[:4])} ...) never said it was ready")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def result(self, timeout_s: float) -> common.Result:
        try:
            out, _ = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            common.stop_process(self.proc)
            return {"received": 0, "error": "the consumer did not finish"}
        lines = [line for line in (out or "").splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else {"received": 0, "error": "no result from the consumer"}

    def stop(self) -> None:
        common.stop_process(self.proc)


class LoopbackCapture:
    """tcpdump of one TCP port on loopback, from `delay_s` from now for `capture_s` seconds, on a
    thread of its own; `result()` waits for it and parses the capture (bench/hops.py)."""

    def __init__(self, port: int, *, delay_s: float, capture_s: float) -> None:
        self.port = port
        self._dir = tempfile.TemporaryDirectory(prefix="hw-hops-")
        self._path = Path(self._dir.name) / "capture.pcap"
        self._cancel = threading.Event()
        self._error = ""
        self._thread = threading.Thread(target=self._run, args=(delay_s, capture_s), daemon=True)
        self._thread.start()

    def _run(self, delay_s: float, capture_s: float) -> None:
        if self._cancel.wait(delay_s):
            return
        # Under timeout(1): the capture ends by itself even if this process dies (no preexec_fn,
        # which would fork a process whose gRPC threads are busy).
        command = ["timeout", f"{capture_s + TCPDUMP_SETTLE_S:.0f}", "tcpdump", "-i", "lo", "-n", "-U"]
        proc = subprocess.Popen(
            [*command, "-s", str(HOPS_SNAP_BYTES), "-w", str(self._path), "tcp", "port", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            self._cancel.wait(capture_s)
        finally:
            proc.terminate()
            try:
                _, err = proc.communicate(timeout=TCPDUMP_SETTLE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
        if proc.returncode not in (0, 124, -15):  # stopped by us, by timeout(1), by SIGTERM
            self._error = (err or b"").decode(errors="replace").strip()[-300:]

    def stop(self) -> None:
        """End the capture now if it still runs (tcpdump stopped by pid), and wait for it."""
        self._cancel.set()
        self._thread.join(TCPDUMP_SETTLE_S * 2)

    def result(self) -> common.Result:
        """The stages' p10/p50/p90 in ms, or {"error": why}. Ends the capture if still running."""
        self.stop()
        try:
            if self._error or not self._path.exists():
                return {"error": f"tcpdump: {self._error or 'no capture was written'}"}
            try:
                stages = hops.hop_stages(hops.read_pcap(self._path.read_bytes()), self.port)
            except hops.CaptureError as error:
                return {"error": str(error)}
            return {"leader_port": self.port, "stages_ms": hops.summarize(stages)}
        finally:
            self._dir.cleanup()


def describe_hops(found: common.Result) -> list[str]:
    if "error" in found:
        return [f"hops: {found['error']}"]
    stages: dict[str, dict[str, float]] = found["stages_ms"]
    lines = ["hops (ms, p10 / p50 / p90; bench/hops.py says what each stage is):"]
    for name in hops.STAGES:
        if name in stages:
            stage = stages[name]
            figures = f"{stage['p10']:7.3f} {stage['p50']:7.3f} {stage['p90']:7.3f}"
            lines.append(f"  {name:<10} {figures}  (n={stage['n']:.0f})")
    return lines


def produce_at_rate(
    gateway: str,
    topic: str,
    *,
    rate: float,
    duration_s: float,
    warmup_s: float,
    record_size: int,
    linger_ms: int,
) -> common.Result:
    """Producer.send() one record at a time on a fixed schedule; returns what was sent."""
    from clients.producer import Producer

    pad = b"x" * max(record_size - STAMP.size, 0)
    sent = measured = 0
    late_s_max = 0.0
    with Producer(gateway, acks="all", linger_ms=linger_ms) as producer:
        producer.partitions_for(topic)
        total = warmup_s + duration_s
        start = time.perf_counter()
        while True:
            now = time.perf_counter()
            if now - start >= total:
                break
            due = start + sent / rate
            if due > now:
                time.sleep(due - now)
                continue
            late_s_max = max(late_s_max, now - due)
            is_measured = now - start >= warmup_s
            producer.produce(topic, stamped(pad, is_measured))
            sent += 1
            measured += is_measured
        producer.flush(timeout_ms=60_000)
    return {
        "sent": sent,
        "measured": measured,
        "achieved_rate": round(measured / duration_s),
        "schedule_late_ms_max": round(late_s_max * 1000, 2),
    }


def consume_role(args: argparse.Namespace) -> int:
    """The consumer process: read from the end, time every measured record, print JSON."""
    from clients.consumer import Consumer
    from clients.types import TopicPartition

    latencies: list[float] = []
    warmup = 0
    with Consumer(
        bootstrap=args.bootstrap,
        auto_offset_reset="latest",
        enable_auto_commit=False,
        fetch_max_wait_ms=args.fetch_max_wait_ms,
        max_poll_records=10_000,
    ) as consumer:
        tps = [TopicPartition(args.topic, p) for p in range(args.partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.position(tp)  # resolve "latest" now, before the producer starts
        print("ready", flush=True)
        deadline = time.monotonic() + args.timeout_s
        idle_since = time.monotonic()
        while len(latencies) < args.expected and time.monotonic() < deadline:
            records = consumer.poll(timeout_ms=200)
            if not records:
                # Done once records stopped coming (a producer that fell behind sends fewer).
                if latencies and time.monotonic() - idle_since > common.E2E_IDLE_END_S:
                    break
                continue
            idle_since = time.monotonic()
            for record in records:
                now = time.time_ns()
                if record.value is None:
                    raise SystemExit(
                        f"e2e: {record.topic}-{record.partition} offset {record.offset} has no value: "
                        "the topic holds records this benchmark did not write; use a new --topic"
                    )
                sent_ns, measured = STAMP.unpack_from(record.value)
                if measured:
                    latencies.append((now - sent_ns) / 1e9)
                else:
                    warmup += 1
    print(
        json.dumps(
            {
                "received": len(latencies),
                "warmup_received": warmup,
                "latency": common.percentiles_ms(latencies),
            }
        ),
        flush=True,
    )
    return 0


def run_rate(target: common.Target, rate: float, settings: RateSettings) -> common.Result:
    gate = common.wait_for_quiet(wait_s=settings.quiet_wait_s)
    expected = int(rate * settings.duration_s)
    consumer = E2EConsumer(
        [
            sys.executable,
            __file__,
            "consumer",
            "--bootstrap",
            target.gateway,
            "--topic",
            target.topic,
            "--partitions",
            str(target.partitions),
            "--expected",
            str(expected),
            "--timeout-s",
            str(settings.warmup_s + settings.duration_s + DRAIN_S + 30),
            "--fetch-max-wait-ms",
            str(settings.fetch_max_wait_ms),
        ]
    )
    capture: LoopbackCapture | None = None
    try:
        if settings.hops:
            leader = target.leaders.get(0)
            if leader is None:
                raise SystemExit("--hops: partition 0 has no leader in Metadata")
            capture = LoopbackCapture(
                int(leader.rsplit(":", 1)[1]),
                delay_s=settings.warmup_s + HOPS_START_AFTER_WARMUP_S,
                capture_s=settings.hops_capture_s,
            )
        meter = common.CpuMeter({**target.pids, "producer": os.getpid(), "consumer": consumer.pid}).start()
        before = {rpc: common.rpc_totals(target, rpc) for rpc in ("Produce", "Fetch")}
        started = time.monotonic()
        sent = produce_at_rate(
            target.gateway,
            target.topic,
            rate=rate,
            duration_s=settings.duration_s,
            warmup_s=settings.warmup_s,
            record_size=settings.record_size,
            linger_ms=settings.linger_ms,
        )
        cpu = meter.stop()
        # Server-side Produce and Fetch: requests/s and mean time in the gateway and brokers (the
        # parts of the end-to-end path; a Produce holds its records until the ISR has them).
        server = {
            rpc: common.rpc_delta(before[rpc], common.rpc_totals(target, rpc), time.monotonic() - started)
            for rpc in before
        }
        got = consumer.result(timeout_s=DRAIN_S + common.E2E_IDLE_END_S + 30)
        found = capture.result() if capture is not None else None
    finally:
        if capture is not None:
            capture.stop()  # on any way out, tcpdump too
        consumer.stop()
    return {
        "rate": rate,
        **sent,
        **got,
        **gate,
        "load_1m_after": common.load_average(),
        "cpu_cores": cpu,
        "server_rpcs": server,
        **({"hops": found} if found is not None else {}),
    }


def describe(result: common.Result) -> str:
    lat = result.get("latency") or {}
    text = (
        f"{result['rate']:>8,.0f} records/s: {common.format_latency(lat)}  "
        f"({result.get('received', 0):,} of {result.get('measured', 0):,} measured records received)"
    )
    return text


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="role")
    role = sub.add_parser("consumer", help="(started by this script) the consuming process")
    role.add_argument("--bootstrap", required=True)
    role.add_argument("--topic", required=True)
    role.add_argument("--partitions", type=int, required=True)
    role.add_argument("--expected", type=int, required=True)
    role.add_argument("--timeout-s", type=float, required=True)
    role.add_argument("--fetch-max-wait-ms", type=int, default=500)
    parser.add_argument(
        "--rates", type=float, nargs="+", default=[2000, 20000], help="records/s (default 2000 20000)"
    )
    parser.add_argument(
        "--duration-s", type=float, default=20.0, help="measured seconds per rate (default 20)"
    )
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument(
        "--linger-ms", type=int, default=0, help="Producer linger_ms (default 0: send at once)"
    )
    parser.add_argument(
        "--fetch-max-wait-ms",
        type=int,
        default=500,
        help="Consumer fetch_max_wait_ms (the long poll; an arriving record ends it at once)",
    )
    parser.add_argument(
        "--hops",
        action="store_true",
        help="also capture partition 0's leader's traffic with tcpdump (root or CAP_NET_RAW) and "
        "print each stage of a record's path (bench/hops.py)",
    )
    parser.add_argument(
        "--hops-capture-s",
        type=float,
        default=2.0,
        help="seconds captured per rate with --hops (default 2; starts 1 s after the warm-up)",
    )
    # One partition by default, as Kafka's EndToEndLatency.
    common.add_target_arguments(parser, partitions=1, output="e2e_latency")
    args = parser.parse_args()
    if args.role == "consumer":
        return consume_role(args)
    if args.hops and shutil.which("tcpdump") is None:
        parser.error("--hops needs tcpdump on PATH (Debian: apt-get install tcpdump)")
    if args.hops and args.hops_capture_s <= 0:
        parser.error(f"--hops-capture-s must be positive, got {args.hops_capture_s}")
    topic = common.target_topic(args, "e2e")
    out = common.target_header(
        args, record_size=args.record_size, linger_ms=args.linger_ms, duration_s=args.duration_s
    )
    print(
        f"e2e latency: {args.record_size} B records, acks=all, linger {args.linger_ms} ms, {args.partitions} "
        f"partition(s), RF {args.replication_factor}, {args.duration_s:.0f} s per rate",
        flush=True,
    )
    settings = RateSettings.from_args(args)
    with common.target_for(args, topic) as target:
        for rate in args.rates:
            result = run_rate(target, rate, settings)
            print("  " + describe(result), flush=True)
            for rpc, per in result["server_rpcs"].items():
                if per:
                    print(f"      server-side {rpc}: " + common.format_rpc(per), flush=True)
            print(
                f"      CPU (cores): {common.format_cpu(result['cpu_cores'])}; load "
                f"{result['load_1m_before']} -> {result['load_1m_after']}",
                flush=True,
            )
            if "hops" in result:
                for line in describe_hops(result["hops"]):
                    print("      " + line, flush=True)
            out["runs"].append(result)
    return common.finish(args.output, out)


if __name__ == "__main__":
    raise SystemExit(main())
