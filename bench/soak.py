"""Soak: a mixed workload for a long time, and whether any process's memory, files or threads grow.

Starts a LocalCluster (etcd, controller, 3 brokers, gateway) and runs, for --duration:
- our Producer at --rate records/s (acks=all, idempotent), with a burst at --burst-rate for
  --burst-s every --burst-every;
- a group of two of our Consumers reading the topic and committing every --commit-every;
- a Kafka-protocol consumer group (confluent-kafka) on the brokers' Kafka listeners, its own group;
- topic churn: a topic created and the previous one deleted every --churn-every;
- member restarts: one member of our group closed and a new one started every --restart-every;
- short-lived clients: a Producer opened, one send, closed, every --short-client-every.

Every --sample-every it reads, for every process of the cluster and for this workload
process: RSS split into anonymous and file-backed memory (/proc/<pid>/status RssAnon,
RssFile), open files (/proc/<pid>/fd), threads, CPU seconds; and etcd's database size (its
/metrics, or its data file). Every record carries a sequence number: at the end, every
acknowledged record must have been read by both groups (0 lost).

After --warmup, each figure's growth per hour is a least-squares slope with its correlation r
(r near 1: steady growth; near 0: noise around a level). The verdict holds the targets of issue
43: RSS grows under 10 MiB an hour, open files and threads are flat, etcd's database is flat
under steady commits, and nothing acknowledged is lost. A slope measured over minutes says
little about hours: growth that slows down (a cache filling, the allocator's high-water mark
after a burst) needs a run of hours to show that it levels off.

--heap-debug starts the services with HIGHWATER_HEAP_DEBUG_DIR set (services/common/heap_debug.py)
and signals the processes it names (default broker-1) at the end of the warm-up (baseline, and
tracemalloc starts) and at the end (what grew in between, by type and by source line). Traced
processes run slower and use more memory: their slopes are not the figures to quote.

    python bench/soak.py --duration 2h
    python bench/soak.py --duration 15m --warmup 4m --heap-debug

Results: bench/results/soak.json (every sample, the slopes, the verdict); heap dumps beside
it, in bench/results/soak-heap/. Stop it any time with Ctrl-C or SIGTERM: the cluster is stopped by pid.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import re
import signal
import struct
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/soak.py` from anywhere

from bench import common
from services.common.heap_debug import HEAP_DEBUG_DIR_ENV

# Targets of issue 43, per process after the warm-up.
RSS_MIB_PER_HOUR_MAX = 10.0
# Open files and threads are whole numbers that move as connections come and go: "flat" is a
# slope under this per hour, or a fitted change over the whole measured window under COUNT_DRIFT_MAX.
COUNT_PER_HOUR_MAX = 5.0
COUNT_DRIFT_MAX = 3.0
# etcd's database file grows in bbolt's steps; with compaction it stops growing under steady commits.
ETCD_DB_MIB_PER_HOUR_MAX = 1.0

# How long the end of the run may take to read back every acknowledged record.
DRAIN_TIMEOUT_S = 120.0
# One member, consumer or churn step may take this long to close before we move on (it is a daemon).
THREAD_JOIN_TIMEOUT_S = 30.0
# A short-lived client's send and close.
SHORT_CLIENT_TIMEOUT_MS = 30_000
# The producer paces itself in steps this long.
PACING_STEP_S = 0.01
# Without a terminal the progress goes out as a plain line this often.
PLAIN_PROGRESS_EVERY_S = 60.0
MiB = 1024 * 1024
# At the default load (~4,000 records/s of ~130 B over 6 partitions, ~90 KB/s a partition) a
# 64 MiB segment rolls every ~12 minutes and 256 MiB of retention starts deleting after ~50.
SEGMENT_BYTES = 64 * MiB
RETENTION_BYTES = 256 * MiB
HEAP_DUMP_WAIT_S = 60.0
SEQ = struct.Struct(">q")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(h|m|s|ms)?\s*$")
_ETCD_DB_METRICS = ("etcd_mvcc_db_total_size_in_bytes", "etcd_debugging_mvcc_db_total_size_in_bytes")
_ETCD_DB_IN_USE_METRIC = "etcd_mvcc_db_total_size_in_use_in_bytes"


def duration_s(text: str) -> float:
    """'2h', '10m', '40s', '500ms' or plain seconds -> seconds."""
    m = _DURATION.match(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: write it as 2h, 10m, 40s or 500ms")
    unit = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, None: 1.0}[m.group(2)]
    return float(m.group(1)) * unit


def clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


# ---- what was acknowledged and what was read --------------------------------------------------


class SeqSet:
    """A set of sequence numbers as a bitmap: 2 hours at 3,000 records/s is 2.7 MB."""

    def __init__(self) -> None:
        self._bits = bytearray()
        self._lock = threading.Lock()  # callbacks of several producers' threads add at once
        self.count = 0

    def add(self, seq: int) -> None:
        index, bit = divmod(seq, 8)
        mask = 1 << bit
        with self._lock:
            if index >= len(self._bits):
                self._bits.extend(bytes(max(index + 1 - len(self._bits), 1 << 16)))
            if not self._bits[index] & mask:
                self._bits[index] |= mask
                self.count += 1

    def missing_from(self, other: SeqSet, show: int = 10) -> tuple[int, list[int]]:
        """How many of self's numbers `other` lacks, and the first `show` of them."""
        with self._lock:
            mine = int.from_bytes(self._bits, "little")
        with other._lock:
            theirs = int.from_bytes(other._bits, "little")
        missing = mine & ~theirs
        first: list[int] = []
        rest = missing
        while rest and len(first) < show:
            low = rest & -rest
            first.append(low.bit_length() - 1)
            rest ^= low
        return missing.bit_count(), first


@dataclass
class Tally:
    """Counts and errors of the workload, shared by its threads (each key written by one thread)."""

    acked: SeqSet = field(default_factory=SeqSet)
    ours: SeqSet = field(default_factory=SeqSet)  # read by our group
    kafka: SeqSet = field(default_factory=SeqSet)  # read by the Kafka-protocol group
    counts: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def error(self, where: str, exc: BaseException) -> None:
        self.note(f"{where}: {type(exc).__name__}")

    def note(self, error: str) -> None:
        with self._lock:
            self.errors[error] += 1


def record_seq(value: bytes | None) -> int | None:
    return SEQ.unpack_from(value)[0] if value is not None and len(value) >= SEQ.size else None


# ---- the workload --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    gateway: str
    kafka_bootstrap: str
    topic: str
    partitions: int
    record_size: int
    rate: float
    burst_every_s: float
    burst_s: float
    burst_rate: float
    commit_every_s: float
    churn_every_s: float
    restart_every_s: float
    short_client_every_s: float


class Soak:
    """The workload's threads: each runs until `stop_sending` (producers, churn) or `stop_reading`."""

    def __init__(self, w: Workload) -> None:
        self.w = w
        self.tally = Tally()
        self.seqs = itertools.count()  # next() is atomic in CPython: one number per record
        self.pad = b"x" * max(w.record_size - SEQ.size, 0)
        self.stop_sending = threading.Event()
        self.stop_reading = threading.Event()
        self.threads: list[threading.Thread] = []
        self.members: list[tuple[threading.Thread, threading.Event]] = []
        self.started = time.monotonic()

    def _thread(self, name: str, target: Callable[..., None], *args: object) -> threading.Thread:
        t = threading.Thread(target=target, args=args, name=f"soak-{name}", daemon=True)
        t.start()
        return t

    def start(self) -> None:
        for _ in range(2):
            self._start_member()
        self.threads += [
            self._thread("kafka-group", self._kafka_group),
            self._thread("producer", self._produce),
            self._thread("churn", self._churn),
            self._thread("short-clients", self._short_clients),
            self._thread("restarts", self._restarts),
        ]

    def rate_at(self, elapsed_s: float) -> float:
        """Records/s due now: the burst rate for burst_s at the start of every burst_every_s."""
        w = self.w
        in_burst = w.burst_every_s > 0 and (elapsed_s % w.burst_every_s) >= w.burst_every_s - w.burst_s
        return w.burst_rate if in_burst else w.rate

    def _record(self, seq: int) -> bytes:
        return SEQ.pack(seq) + self.pad

    def _on_ack(self, seq: int) -> Callable[[Any, Exception | None], None]:
        def done(metadata: Any, error: Exception | None) -> None:
            if error is None:
                self.tally.acked.add(seq)
            else:
                self.tally.error("produce", error)

        return done

    def _produce(self) -> None:
        from clients.producer import Producer

        due = 0.0
        sent = 0
        with Producer(self.w.gateway, acks="all") as producer:
            last = time.monotonic()
            while not self.stop_sending.is_set():
                now = time.monotonic()
                due += self.rate_at(now - self.started) * (now - last)
                last = now
                while sent < int(due):
                    seq = next(self.seqs)
                    try:
                        producer.produce(self.w.topic, self._record(seq), callback=self._on_ack(seq))
                    except Exception as exc:  # an operating error of one send: counted, the run goes on
                        self.tally.error("produce", exc)
                    sent += 1
                time.sleep(PACING_STEP_S)
            producer.flush(timeout_ms=60_000)
        self.tally.count("sent", sent)

    def _short_clients(self) -> None:
        from clients.producer import Producer

        while not self.stop_sending.wait(self.w.short_client_every_s):
            seq = next(self.seqs)
            try:
                with Producer(self.w.gateway, acks="all") as producer:
                    producer.send(self.w.topic, self._record(seq)).result(SHORT_CLIENT_TIMEOUT_MS / 1000)
                self.tally.acked.add(seq)
                self.tally.count("short_clients")
            except Exception as exc:
                self.tally.error("short client", exc)

    def _churn(self) -> None:
        from clients.admin import Admin

        previous: str | None = None
        with Admin(self.w.gateway) as admin:
            for n in itertools.count():
                if self.stop_sending.wait(self.w.churn_every_s):
                    break
                name = f"{self.w.topic}-churn-{n}"
                try:
                    admin.create_topics(name, 1, 3)
                    self.tally.count("topics_created")
                    if previous is not None:
                        admin.delete_topics(previous)
                        self.tally.count("topics_deleted")
                    previous = name
                except Exception as exc:
                    self.tally.error("churn", exc)
            if previous is not None:
                with contextlib.suppress(Exception):
                    admin.delete_topics(previous)

    def _start_member(self) -> None:
        stop = threading.Event()
        self.members.append((self._thread("member", self._member, stop), stop))

    def _member(self, stop: threading.Event) -> None:
        from clients.consumer import Consumer

        consumer = Consumer(
            self.w.topic,
            bootstrap=self.w.gateway,
            group_id=f"{self.w.topic}-ours",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        try:
            next_commit = time.monotonic() + self.w.commit_every_s
            while not (stop.is_set() or self.stop_reading.is_set()):
                try:
                    for record in consumer.poll(timeout_ms=200):
                        seq = record_seq(record.value)
                        if seq is not None:
                            self.tally.ours.add(seq)
                    if time.monotonic() >= next_commit:
                        next_commit += self.w.commit_every_s
                        consumer.commit()
                        self.tally.count("commits")
                except Exception as exc:  # a commit during a rebalance: counted, retried next second
                    self.tally.error("member", exc)
                    time.sleep(0.2)
            with contextlib.suppress(Exception):
                consumer.commit()
        finally:
            consumer.close()

    def _restarts(self) -> None:
        turn = 0
        while not self.stop_sending.wait(self.w.restart_every_s):
            thread, stop = self.members.pop(turn % len(self.members))
            stop.set()
            thread.join(THREAD_JOIN_TIMEOUT_S)
            self._start_member()
            self.tally.count("member_restarts")
            turn += 1

    def _kafka_group(self) -> None:
        import confluent_kafka

        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": self.w.kafka_bootstrap,
                "group.id": f"{self.w.topic}-kafka",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": True,
                "auto.commit.interval.ms": int(self.w.commit_every_s * 1000),
            }
        )
        try:
            consumer.subscribe([self.w.topic])
            while not self.stop_reading.is_set():
                for m in consumer.consume(num_messages=10_000, timeout=0.2):
                    error = m.error()
                    if error is not None:
                        self.tally.note(f"kafka group: {error.name()}")
                        continue
                    seq = record_seq(m.value())
                    if seq is not None:
                        self.tally.kafka.add(seq)
        finally:
            consumer.close()

    def finish_sending(self) -> None:
        self.stop_sending.set()
        for t in self.threads:
            if t.name != "soak-kafka-group":
                t.join(THREAD_JOIN_TIMEOUT_S + 60)

    def drain(self, timeout_s: float) -> dict[str, object]:
        """Wait (at most timeout_s) until both groups have read every acknowledged record."""
        deadline = time.monotonic() + timeout_s
        while True:
            lost_ours, _ = self.tally.acked.missing_from(self.tally.ours)
            lost_kafka, _ = self.tally.acked.missing_from(self.tally.kafka)
            if (lost_ours == 0 and lost_kafka == 0) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        lost_ours, first_ours = self.tally.acked.missing_from(self.tally.ours)
        lost_kafka, first_kafka = self.tally.acked.missing_from(self.tally.kafka)
        return {
            "acked": self.tally.acked.count,
            "read_by_our_group": self.tally.ours.count,
            "read_by_kafka_group": self.tally.kafka.count,
            "lost_our_group": lost_ours,
            "lost_our_group_first": first_ours,
            "lost_kafka_group": lost_kafka,
            "lost_kafka_group_first": first_kafka,
        }

    def stop(self) -> None:
        self.stop_sending.set()
        self.stop_reading.set()
        for t in [*self.threads, *(m for m, _ in self.members)]:
            t.join(THREAD_JOIN_TIMEOUT_S)


# ---- sampling -------------------------------------------------------------------------------------


def process_sample(pid: int) -> dict[str, float] | None:
    """RSS (anonymous and file-backed, MiB), open files, threads and CPU seconds; None once gone."""
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == "VmRSS":
                    out["rss_mib"] = int(value.split()[0]) / 1024
                elif key == "RssAnon":
                    out["anon_mib"] = int(value.split()[0]) / 1024
                elif key == "RssFile":
                    out["file_mib"] = int(value.split()[0]) / 1024
                elif key == "Threads":
                    out["threads"] = int(value)
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError):
        return None
    out["cpu_s"] = common.process_cpu_s(pid) or 0.0
    return {k: round(v, 3) for k, v in out.items()}


def etcd_db_bytes(client_url: str, data_dir: Path) -> dict[str, float]:
    """etcd's database size from its /metrics (whichever name this etcd serves), else its file."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError, ValueError):
        with urllib.request.urlopen(f"{client_url}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in _ETCD_DB_METRICS and "db_mib" not in out:
                out["db_mib"] = float(value) / 2**20
            elif name == _ETCD_DB_IN_USE_METRIC:
                out["db_in_use_mib"] = float(value) / 2**20
    if "db_mib" not in out:
        with contextlib.suppress(OSError):
            out["db_mib"] = (data_dir / "member" / "snap" / "db").stat().st_size / 2**20
    return {k: round(v, 3) for k, v in out.items()}


# ---- growth ---------------------------------------------------------------------------------------


def slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope (per unit of x) and Pearson's r of (x, y) points; (0, 0) when flat or few."""
    n = len(points)
    if n < 3:
        return 0.0, 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    syy = sum((y - my) ** 2 for _, y in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    if sxx == 0:
        return 0.0, 0.0
    r = sxy / math.sqrt(sxx * syy) if syy > 0 else 0.0
    return sxy / sxx, r


FIGURES = ("rss_mib", "anon_mib", "file_mib", "fds", "threads")


def growth(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, dict[str, dict[str, float]]]:
    """Per process and figure: slope per hour and r over the samples after the warm-up."""
    after = [s for s in samples if s["t_s"] >= warmup_s]
    window_h = (after[-1]["t_s"] - after[0]["t_s"]) / 3600 if len(after) > 1 else 0.0
    out: dict[str, dict[str, dict[str, float]]] = {}
    names = sorted({n for s in after for n in s["processes"]})
    for name in names:
        per: dict[str, dict[str, float]] = {}
        for fig in FIGURES:
            pts = [
                (s["t_s"] / 3600, s["processes"][name][fig])
                for s in after
                if fig in s["processes"].get(name, {})
            ]
            if not pts:
                continue
            k, r = slope(pts)
            per[fig] = {
                "per_hour": round(k, 3),
                "r": round(r, 3),
                "first": pts[0][1],
                "last": pts[-1][1],
                "window_h": round(window_h, 3),
            }
        out[name] = per
    for fig in ("db_mib", "db_in_use_mib"):
        pts = [(s["t_s"] / 3600, s["etcd"][fig]) for s in after if fig in s.get("etcd", {})]
        if pts:
            k, r = slope(pts)
            out.setdefault("etcd", {})[fig] = {
                "per_hour": round(k, 3),
                "r": round(r, 3),
                "first": pts[0][1],
                "last": pts[-1][1],
                "window_h": round(window_h, 3),
            }
    return out


def _count_flat(fig: dict[str, float]) -> bool:
    return fig["per_hour"] < COUNT_PER_HOUR_MAX or fig["per_hour"] * fig["window_h"] < COUNT_DRIFT_MAX


def verdict(
    slopes: dict[str, dict[str, dict[str, float]]], lost: dict[str, object], cluster: set[str]
) -> list[dict[str, object]]:
    """One row per target: what was measured and whether it held."""
    rows: list[dict[str, object]] = []
    for name in sorted(cluster & slopes.keys()):
        per = slopes[name]
        if "rss_mib" in per:
            k = per["rss_mib"]["per_hour"]
            rows.append(
                {
                    "target": f"{name} RSS < {RSS_MIB_PER_HOUR_MAX:g} MiB/h",
                    "measured": f"{k:+.2f} MiB/h (anon {per['anon_mib']['per_hour']:+.2f}, "
                    f"r {per['rss_mib']['r']:.2f})",
                    "ok": k < RSS_MIB_PER_HOUR_MAX,
                }
            )
        for fig in ("fds", "threads"):
            if fig in per:
                rows.append(
                    {
                        "target": f"{name} {'open files' if fig == 'fds' else 'threads'} flat",
                        "measured": f"{per[fig]['per_hour']:+.2f}/h "
                        f"({per[fig]['first']:g} -> {per[fig]['last']:g})",
                        "ok": _count_flat(per[fig]),
                    }
                )
    db = slopes.get("etcd", {}).get("db_mib")
    if db is not None:
        rows.append(
            {
                "target": f"etcd db size flat (< {ETCD_DB_MIB_PER_HOUR_MAX:g} MiB/h)",
                "measured": f"{db['per_hour']:+.2f} MiB/h "
                f"({db['first']:.2f} -> {db['last']:.2f} MiB, r {db['r']:.2f})",
                "ok": db["per_hour"] < ETCD_DB_MIB_PER_HOUR_MAX,
            }
        )
    for group in ("our_group", "kafka_group"):
        rows.append(
            {
                "target": f"0 lost ({group.replace('_', ' ')})",
                "measured": f"{lost[f'lost_{group}']} of {lost['acked']} acknowledged not read",
                "ok": lost[f"lost_{group}"] == 0,
            }
        )
    return rows


def print_tables(slopes: dict[str, dict[str, dict[str, float]]], rows: list[dict[str, object]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=140)
    table = Table(title="growth per hour after the warm-up (least squares; r)")
    for col in ("process", "RSS MiB/h", "anon MiB/h", "file MiB/h", "fds/h", "threads/h", "RSS now MiB"):
        table.add_column(col, justify="right" if col != "process" else "left")
    for name, per in slopes.items():
        if name == "etcd" and "rss_mib" not in per:
            continue

        def cell(fig: str, per: dict[str, dict[str, float]] = per) -> str:
            return f"{per[fig]['per_hour']:+.2f} ({per[fig]['r']:.2f})" if fig in per else "-"

        now = f"{per['rss_mib']['last']:.1f}" if "rss_mib" in per else "-"
        table.add_row(name, *(cell(f) for f in FIGURES), now)
    console.print(table)
    v = Table(title="verdict")
    for col in ("target", "measured", "ok"):
        v.add_column(col)
    for row in rows:
        v.add_row(str(row["target"]), str(row["measured"]), "yes" if row["ok"] else "NO")
    console.print(v)


# ---- heap dumps ------------------------------------------------------------------------------------


def heap_dir(output: str) -> Path:
    """Where heap dumps go: beside the result JSON (bench/results/soak-heap/ for --output soak)."""
    path = Path(output) if ("/" in output or output.endswith(".json")) else common.RESULTS_DIR / output
    return path.with_name(path.stem + "-heap")


def heap_dump(directory: Path, pids: dict[str, int], names: list[str]) -> list[Path]:
    """SIGUSR1 to each named process; the dump files they wrote (waits for them, bounded)."""
    before = set(directory.glob("*.txt"))
    sent = 0
    for name in names:
        if name in pids:
            with contextlib.suppress(OSError):
                os.kill(pids[name], signal.SIGUSR1)
                sent += 1
    deadline = time.monotonic() + HEAP_DUMP_WAIT_S
    while time.monotonic() < deadline:
        new = sorted(set(directory.glob("*.txt")) - before)
        if len(new) >= sent:
            return new
        time.sleep(0.5)
    return sorted(set(directory.glob("*.txt")) - before)


# ---- the run ---------------------------------------------------------------------------------------


class Progress:
    """One status line (rich) on a terminal; a plain line a minute otherwise."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console()
        self._status: Any = None
        self._last_plain = 0.0

    @contextlib.contextmanager
    def shown(self) -> Iterator[Progress]:
        if self.console.is_terminal:
            with self.console.status("starting...") as status:
                self._status = status
                yield self
        else:
            yield self

    def update(self, text: str) -> None:
        if self._status is not None:
            self._status.update(text)
        elif time.monotonic() - self._last_plain >= PLAIN_PROGRESS_EVERY_S:
            self._last_plain = time.monotonic()
            print(text, flush=True)


def status_line(sample: dict[str, Any], soak: Soak, duration: float, first: dict[str, Any] | None) -> str:
    t = sample["t_s"]
    brokers = [v for n, v in sorted(sample["processes"].items()) if n.startswith("broker")]
    anon = "/".join(f"{b['anon_mib']:.0f}" for b in brokers if "anon_mib" in b)
    fds = "/".join(f"{b['fds']:.0f}" for b in brokers)
    lag = soak.tally.acked.count - soak.tally.ours.count
    return (
        f"{clock(t)} of {clock(duration)} (left {clock(duration - t)})  "
        f"rate {soak.rate_at(t):,.0f}/s  acked {soak.tally.acked.count:,} lag {lag:,}  "
        f"brokers anon MiB {anon} fds {fds}  etcd db {sample['etcd'].get('db_mib', 0):.1f} MiB  "
        f"errors {sum(soak.tally.errors.values())}  load {common.load_average()}"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    from services.launcher.local_cluster import LocalCluster

    topic = f"soak-{int(time.time())}"
    warmup = args.warmup if args.warmup is not None else min(600.0, args.duration / 4)
    out: dict[str, Any] = {
        **common.header(),
        "note": "the machine is shared: other work ran beside this soak (see load_1m)",
        "settings": {k: v for k, v in vars(args).items()},
        "warmup_s": warmup,
        "topic": topic,
    }
    heap_to = heap_dir(args.output)
    if args.heap_debug:
        heap_to.mkdir(parents=True, exist_ok=True)
        for old in heap_to.glob("*.txt"):
            old.unlink()
        os.environ[HEAP_DEBUG_DIR_ENV] = str(heap_to)  # LocalCluster hands our environment on
    with (
        common.stopped_by_sigterm(),
        tempfile.TemporaryDirectory(prefix="hw-soak-") as tmp,
        LocalCluster(Path(tmp)) as cluster,
    ):
        gateway = cluster.gateway_addresses[0]
        common.create_topic(
            gateway,
            topic,
            partitions=args.partitions,
            replication_factor=3,
            min_insync=2,
            configs={"segment.bytes": str(args.segment_bytes), "retention.bytes": str(args.retention_bytes)},
        )
        pids: dict[str, int] = {"etcd": cluster.etcd.pid} if cluster.etcd.pid else {}
        pids.update({name: p.pid for name, p in cluster.processes.items() if p.pid})
        cluster_names = set(pids)
        pids["workload"] = os.getpid()
        soak = Soak(
            Workload(
                gateway=gateway,
                kafka_bootstrap=cluster.kafka_bootstrap(),
                topic=topic,
                partitions=args.partitions,
                record_size=args.record_size,
                rate=args.rate,
                burst_every_s=args.burst_every,
                burst_s=args.burst_s,
                burst_rate=args.burst_rate,
                commit_every_s=args.commit_every,
                churn_every_s=args.churn_every,
                restart_every_s=args.restart_every,
                short_client_every_s=args.short_client_every,
            )
        )
        samples: list[dict[str, Any]] = []
        heap: dict[str, list[str]] = {}
        out["load_1m_before"] = common.load_average()
        soak.start()
        try:
            with Progress().shown() as progress:
                next_sample = soak.started
                heap_armed = args.heap_debug
                while True:
                    now = time.monotonic()
                    t = now - soak.started
                    sample: dict[str, Any] = {
                        "t_s": round(t, 1),
                        "load_1m": common.load_average(),
                        "processes": {},
                        "etcd": etcd_db_bytes(cluster.etcd.client_url, cluster.etcd.data_dir),
                        "acked": soak.tally.acked.count,
                        "read_ours": soak.tally.ours.count,
                        "read_kafka": soak.tally.kafka.count,
                    }
                    for name, pid in pids.items():
                        figures = process_sample(pid)
                        if figures is not None:
                            sample["processes"][name] = figures
                    samples.append(sample)
                    progress.update(status_line(sample, soak, args.duration, samples[0]))
                    if heap_armed and t >= warmup:
                        heap_armed = False
                        heap["after_warmup"] = [
                            common.shown(p) for p in heap_dump(heap_to, pids, args.heap_debug)
                        ]
                    if t >= args.duration:
                        break
                    next_sample += args.sample_every
                    time.sleep(max(0.0, min(next_sample, soak.started + args.duration) - time.monotonic()))
            if args.heap_debug:
                heap["end"] = [common.shown(p) for p in heap_dump(heap_to, pids, args.heap_debug)]
            print("sending stopped; reading back every acknowledged record...", flush=True)
            soak.finish_sending()
            lost = soak.drain(DRAIN_TIMEOUT_S)
        finally:
            soak.stop()
        out["load_1m_after"] = common.load_average()
    slopes = growth(samples, warmup)
    rows = verdict(slopes, lost, cluster_names)
    first, last = samples[0], samples[-1]
    out.update(
        counts={**soak.tally.counts, **lost},
        errors=dict(soak.tally.errors),
        cpu_cores={
            name: round(
                (last["processes"][name]["cpu_s"] - first["processes"][name]["cpu_s"])
                / max(last["t_s"], 1e-9),
                3,
            )
            for name in last["processes"]
            if name in first["processes"]
        },
        growth_per_hour=slopes,
        verdict=rows,
        ok=all(bool(r["ok"]) for r in rows),
        heap_dumps=heap,
        samples=samples,
    )
    return out


def analyse(results: str, warmup_s: float | None) -> int:
    """Slopes and verdict of a finished run over the samples after `warmup_s` (its own warm-up
    when None); nothing is written."""
    path = (
        Path(results)
        if ("/" in results or results.endswith(".json"))
        else common.RESULTS_DIR / f"{results}.json"
    )
    out = json.loads(path.read_text())
    warmup = out["warmup_s"] if warmup_s is None else warmup_s
    samples: list[dict[str, Any]] = out["samples"]
    if not samples or samples[-1]["t_s"] <= warmup:
        lasted = clock(samples[-1]["t_s"] if samples else 0)
        print(f"{path}: no samples after {clock(warmup)} (the run lasted {lasted})")
        return 2
    cluster = {name for name in samples[-1]["processes"] if name != "workload"}
    slopes = growth(samples, warmup)
    print(f"{path}: samples from {clock(warmup)} to {clock(samples[-1]['t_s'])}")
    print_tables(slopes, verdict(slopes, out["counts"], cluster))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add(
        "--duration",
        type=duration_s,
        default=600.0,
        help="how long the workload runs: 2h, 10m, 40s (default 10m)",
    )
    add(
        "--warmup",
        type=duration_s,
        default=None,
        help="samples before this are left out of the slopes (default 10m, or a quarter of a shorter run)",
    )
    add("--sample-every", type=duration_s, default=10.0, help="sampling interval (default 10s)")
    add("--rate", type=float, default=3000.0, help="base records/s of the producer (default 3000)")
    add(
        "--burst-every",
        type=duration_s,
        default=60.0,
        help="a burst starts this often (default 60s; 0: none)",
    )
    add("--burst-s", type=duration_s, default=5.0, help="how long a burst lasts (default 5s)")
    add("--burst-rate", type=float, default=15000.0, help="records/s during a burst (default 15000)")
    add("--record-size", type=int, default=100, help="bytes per record (default 100)")
    add("--partitions", type=int, default=6, help="partitions of the topic (RF 3, min.insync 2; default 6)")
    # A months-long topic rolls and deletes segments; with Kafka's 1 GiB segments and no
    # retention, a two-hour run would only show the active segments' indexes growing.
    add(
        "--segment-bytes",
        type=int,
        default=SEGMENT_BYTES,
        help=f"the topic's segment.bytes (default {SEGMENT_BYTES // MiB} MiB: segments roll during the run)",
    )
    add(
        "--retention-bytes",
        type=int,
        default=RETENTION_BYTES,
        help=f"the topic's retention.bytes per partition (default {RETENTION_BYTES // MiB} MiB: "
        "old segments are deleted during the run and the disk stays bounded)",
    )
    add(
        "--commit-every",
        type=duration_s,
        default=1.0,
        help="our group's members commit this often (default 1s)",
    )
    add(
        "--churn-every",
        type=duration_s,
        default=30.0,
        help="a topic created and one deleted this often (default 30s)",
    )
    add(
        "--restart-every",
        type=duration_s,
        default=60.0,
        help="a member of our group restarted this often (default 60s)",
    )
    add(
        "--short-client-every",
        type=duration_s,
        default=3.0,
        help="a Producer opened, one send, closed, this often (default 3s)",
    )
    add(
        "--heap-debug",
        nargs="*",
        metavar="PROCESS",
        default=None,
        help="heap dumps (gc counts, tracemalloc) of these processes after the warm-up and at the end "
        "(default with the flag: broker-1); written beside the results, bench/results/soak-heap/",
    )
    add("--output", default="soak", help="results: a name under bench/results, or a path (default soak)")
    add(
        "--analyse",
        metavar="RESULTS",
        default=None,
        help="run nothing: read a finished run's results (a name under bench/results, or a path) and "
        "print its slopes and verdict again, over the samples after --warmup (default: the run's own); "
        "e.g. to see whether growth that slowed down has levelled off in the last hour",
    )
    args = parser.parse_args(argv)
    if args.analyse is not None:
        return analyse(args.analyse, args.warmup)
    if args.heap_debug is not None and not args.heap_debug:
        args.heap_debug = ["broker-1"]
    if args.sample_every <= 0 or args.duration <= 0:
        parser.error("--duration and --sample-every must be positive")
    if args.burst_every and args.burst_s >= args.burst_every:
        parser.error("--burst-s must be shorter than --burst-every")
    out = run(args)
    rows: list[dict[str, object]] = out["verdict"]
    print_tables(out["growth_per_hour"], rows)
    print(
        f"counts: {out['counts']}; errors: {out['errors'] or 'none'}; "
        f"load {out['load_1m_before']} -> {out['load_1m_after']}",
        flush=True,
    )
    for stage, paths in out["heap_dumps"].items():
        print(f"heap dumps ({stage}): {', '.join(paths)}")
    # The verdict is in the table and the JSON ("ok"); the exit status says the run completed.
    return common.finish(args.output, out)


if __name__ == "__main__":
    sys.exit(main())
