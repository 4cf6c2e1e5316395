"""The Redis Streams peer: a primary and two replicas (redis-server) on loopback, and the redis-py
client doing what our workloads do, acknowledged with WAIT 2 (both replicas have the writes).

- produce: a pipeline of --batch records (XADD stream * v <payload>, one round trip)
  followed by WAIT 2 <timeout>; a record counts once WAIT says 2 replicas have it.
  Latency is per pipeline+WAIT. Redis is single-threaded and redis-py synchronous, so one
  connection carries one pipeline at a time (what a Python user gets without threads).
- consume: catch-up read of the whole stream with XRANGE ... COUNT --fetch-batch.
- e2e: a consumer process (this module run as `e2e-consumer`) blocks in XREAD on the
  primary while a producer sends at a fixed rate: each record is XADD + WAIT 2 in one
  pipeline; latency = receive time - the send time in the record.

No snapshots and no AOF (save "", appendonly no): durability comes from the replicas, as
Highwater's comes from replication with fsync off. Every server is started and stopped (by
pid) here, with its data in a temporary directory. Run it alone: --help.
"""

from __future__ import annotations

import contextlib
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common

if TYPE_CHECKING:
    import redis

SERVER_READY_TIMEOUT_S = 30.0
STREAM = "bench"
# How long WAIT may block for the replicas before it answers with fewer.
WAIT_TIMEOUT_MS = 5_000
REPLICAS = 2
_SENT_NS = struct.Struct(">q")


@dataclass
class RedisCluster:
    """A primary and `replicas` replicas on 127.0.0.1."""

    base_dir: Path
    replicas: int = REPLICAS
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: list[int] = field(default_factory=list)

    @property
    def primary_port(self) -> int:
        return self.ports[0]

    @property
    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}

    def start(self) -> RedisCluster:
        import redis

        self.ports = [common.free_port() for _ in range(self.replicas + 1)]
        for i, port in enumerate(self.ports):
            name = "redis-primary" if i == 0 else f"redis-replica-{i}"
            data = self.base_dir / name
            data.mkdir(parents=True, exist_ok=True)
            cmd = [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(data),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--protected-mode",
                "no",
                "--logfile",
                "",
            ]
            if i > 0:
                cmd += ["--replicaof", "127.0.0.1", str(self.ports[0])]
            self.procs[name] = common.spawn(cmd, self.base_dir / f"{name}.log")
        deadline = time.monotonic() + SERVER_READY_TIMEOUT_S
        primary = redis.Redis(port=self.primary_port, socket_connect_timeout=1)
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                info = primary.info("replication")
                online = [
                    v
                    for k, v in info.items()
                    if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
                ]
                if len(online) == self.replicas:
                    primary.close()
                    return self
            time.sleep(0.1)
        primary.close()
        raise SystemExit(f"redis: {self.replicas} replicas not online within {SERVER_READY_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        for proc in self.procs.values():
            common.stop_process(proc)


def redis_cluster(replicas: int = REPLICAS) -> contextlib.AbstractContextManager[RedisCluster]:
    return common.running_in_tmp_dir("hw-bench-redis-", lambda tmp: RedisCluster(tmp, replicas))


def client(port: int) -> redis.Redis:
    import redis

    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=30)


def reset(port: int) -> None:
    r = client(port)
    r.delete(STREAM)
    r.wait(REPLICAS, WAIT_TIMEOUT_MS)
    r.close()


# ---- produce ----------------------------------------------------------------------------------


def produce(
    port: int,
    *,
    record_size: int,
    duration_s: float,
    warmup_s: float,
    throughput: float,
    batch: int,
    window: common.Window,
) -> dict[str, object]:
    payload = b"x" * record_size
    r = client(port)
    latencies: list[float] = []
    counts = {"sent": 0, "acked": 0, "failed": 0}
    errors: dict[str, int] = {}

    def run(seconds: float, record: bool) -> float:
        clock = common.SendClock(seconds)
        sent = 0
        for now in clock:
            wait = common.pacing_delay(clock.start, sent, throughput, now)
            if wait:
                time.sleep(wait)
                continue
            sent_at = time.perf_counter()
            pipe = r.pipeline(transaction=False)
            for _ in range(batch):
                pipe.xadd(STREAM, {"v": payload})
            pipe.wait(REPLICAS, WAIT_TIMEOUT_MS)
            replies = pipe.execute()
            took = time.perf_counter() - sent_at
            sent += batch
            if replies[-1] >= REPLICAS:
                counts["acked"] += batch
                if record:
                    latencies.append(took)
            else:
                counts["failed"] += batch
                errors["WAIT short of replicas"] = errors.get("WAIT short of replicas", 0) + 1
        counts["sent"] += sent
        return time.perf_counter() - clock.start

    try:
        if warmup_s > 0:
            run(warmup_s, False)
        counts.update(sent=0, acked=0, failed=0)
        window.open()
        elapsed = run(duration_s, True)
        window.close()
    finally:
        r.close()
    return common.produce_summary(
        f"redis-py pipeline({batch} XADD)+WAIT {REPLICAS}",
        counts,
        errors,
        elapsed,
        record_size,
        latencies,
        per_request=batch,
    )


# ---- consume (catch-up) -----------------------------------------------------------------------


def load(port: int, *, count: int, record_size: int, batch: int = 1000) -> float:
    payload = b"x" * record_size
    r = client(port)
    start = time.perf_counter()
    try:
        left = count
        while left > 0:
            n = min(batch, left)
            pipe = r.pipeline(transaction=False)
            for _ in range(n):
                pipe.xadd(STREAM, {"v": payload})
            pipe.wait(REPLICAS, WAIT_TIMEOUT_MS)
            pipe.execute()
            left -= n
    finally:
        r.close()
    return time.perf_counter() - start


def consume(
    port: int, *, count: int, record_size: int, fetch_batch: int, window: common.Window
) -> dict[str, object]:
    r = client(port)
    received = 0
    try:
        window.open()
        start = time.perf_counter()
        low = "-"
        while received < count:
            # redis-py's hints cover its async client and decoded replies too; ours gives bytes.
            entries = cast(
                list[tuple[bytes, dict[bytes, bytes]]], r.xrange(STREAM, min=low, max="+", count=fetch_batch)
            )
            if not entries:
                break
            received += len(entries)
            low = "(" + entries[-1][0].decode()
        elapsed = time.perf_counter() - start
        window.close()
    finally:
        r.close()
    return common.read_summary(f"redis-py XRANGE COUNT {fetch_batch}", received, count, elapsed, record_size)


# ---- end-to-end latency -----------------------------------------------------------------------


def e2e_produce(port: int, *, rate: float, duration_s: float, record_size: int) -> dict[str, object]:
    """XADD + WAIT 2 per record at `rate` records/s; records that fell due together go in one
    pipeline (with one WAIT), so a slow WAIT delays, never drops, the schedule."""
    pad = b"x" * max(record_size - _SENT_NS.size, 0)
    r = client(port)
    sent = 0
    try:
        clock = common.SendClock(duration_s)
        for now in clock:
            due_count = min(int((now - clock.start) * rate) + 1, int(duration_s * rate)) - sent
            if due_count <= 0:
                time.sleep(max(clock.start + sent / rate - now, 0))
                continue
            pipe = r.pipeline(transaction=False)
            for _ in range(due_count):
                pipe.xadd(STREAM, {"v": _SENT_NS.pack(time.time_ns()) + pad})
            pipe.wait(REPLICAS, WAIT_TIMEOUT_MS)
            pipe.execute()
            sent += due_count
    finally:
        r.close()
    return {"sent": sent}


def e2e_consume(port: int, *, expected: int, timeout_s: float) -> dict[str, object]:
    r = client(port)
    latencies: list[float] = []
    newest = cast(list[tuple[bytes, dict[bytes, bytes]]], r.xrevrange(STREAM, count=1))
    # Read after what is there now ("$" on every call could skip records added between calls).
    last: bytes | str = newest[0][0] if newest else "0-0"
    deadline = time.monotonic() + timeout_s
    print("ready", flush=True)
    idle_since = time.monotonic()
    try:
        while len(latencies) < expected and time.monotonic() < deadline:
            answer = cast(
                list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]],
                r.xread({STREAM: last}, count=10_000, block=500),
            )
            if not answer:
                # Done once records stopped coming (a producer that fell behind sends fewer).
                if latencies and time.monotonic() - idle_since > common.E2E_IDLE_END_S:
                    break
                continue
            idle_since = time.monotonic()
            for _stream, entries in answer:
                now = time.time_ns()
                for _entry_id, fields in entries:
                    latencies.append((now - _SENT_NS.unpack_from(fields[b"v"])[0]) / 1e9)
                last = entries[-1][0]
    finally:
        r.close()
    return {"received": len(latencies), "latency": common.percentiles_ms(latencies)}


def main() -> int:
    return common.e2e_consumer_main(
        __doc__,
        lambda consumer: consumer.add_argument("--port", type=int, required=True),
        lambda args: e2e_consume(args.port, expected=args.expected, timeout_s=args.timeout_s),
    )


if __name__ == "__main__":
    raise SystemExit(main())
