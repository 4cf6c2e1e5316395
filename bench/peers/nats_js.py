"""The NATS JetStream peer: three nats-server nodes clustered on loopback, a file-storage stream
with 3 replicas, and the nats-py client doing what our workloads do.

- produce: `js.publish_async` (the pipelined publish: up to --in-flight unacknowledged
  messages, 4,000 by default as in nats-py) of --record-size payloads; a message counts
  once its PubAck arrives, i.e. once the stream's leader has it on a quorum (2 of 3) of
  replicas. Latency is per message, publish -> PubAck.
- consume: catch-up read of every message with a pull consumer (fetch of --fetch-batch
  messages at a time, no acks: AckPolicy none), the fastest way nats-py reads a backlog.
- e2e: a consumer process (this module run as `e2e-consumer`) on an ordered push
  consumer reads what a producer publishes at a fixed rate; latency = receive time -
  the send time carried in the payload (both on the machine clock).

Every server is started and stopped (by pid) here, with its data in a temporary directory.
Run it alone: python bench/peers/nats_js.py --help
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import common

if TYPE_CHECKING:  # nats-py ships no type information: these names are Any to mypy
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js import JetStreamContext

SERVER_READY_TIMEOUT_S = 30.0
STREAM = "BENCH"
SUBJECT = "bench.records"
# nats-py's own default bound on unacknowledged async publishes.
PUBLISH_ASYNC_MAX_PENDING_DEFAULT = 4000
# How long the end of a produce run waits for the last PubAcks before counting them as failed.
PUBACK_WAIT_S = 30.0
# 8 bytes of send time (ns since the epoch) lead every e2e payload.
_SENT_NS = struct.Struct(">q")


@dataclass
class NatsCluster:
    """Three JetStream nodes on 127.0.0.1; `url` is the first node's client URL."""

    base_dir: Path
    nodes: int = 3
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    client_ports: list[int] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{port}" for port in self.client_ports]

    @property
    def pids(self) -> dict[str, int]:
        return {name: proc.pid for name, proc in self.procs.items()}

    def start(self) -> NatsCluster:
        self.client_ports = [common.free_port() for _ in range(self.nodes)]
        route_ports = [common.free_port() for _ in range(self.nodes)]
        routes = ", ".join(f"nats-route://127.0.0.1:{port}" for port in route_ports)
        for i in range(self.nodes):
            name = f"nats-{i + 1}"
            store = self.base_dir / name
            store.mkdir(parents=True, exist_ok=True)
            conf = self.base_dir / f"{name}.conf"
            conf.write_text(
                f'server_name: "{name}"\nhost: "127.0.0.1"\nport: {self.client_ports[i]}\n'
                f'jetstream {{ store_dir: "{store}" }}\n'
                f'cluster {{\n  name: "bench"\n  host: "127.0.0.1"\n  port: {route_ports[i]}\n'
                f"  routes: [{routes}]\n}}\n"
            )
            self.procs[name] = common.spawn(["nats-server", "-c", str(conf)], self.base_dir / f"{name}.log")
        return self

    def stop(self) -> None:
        for proc in self.procs.values():
            common.stop_process(proc)


def nats_cluster(nodes: int = 3) -> contextlib.AbstractContextManager[NatsCluster]:
    return common.running_in_tmp_dir("hw-bench-nats-", lambda tmp: NatsCluster(tmp, nodes))


async def connect(
    cluster_urls: list[str], max_pending: int = PUBLISH_ASYNC_MAX_PENDING_DEFAULT
) -> tuple[Client, JetStreamContext]:
    import nats

    async def quiet(exc: Exception) -> None:  # nats-py logs every failed attempt by default
        pass

    nc = await nats.connect(
        servers=cluster_urls,
        connect_timeout=5,
        max_reconnect_attempts=5,
        pending_size=256 * 1024 * 1024,
        error_cb=quiet,
        allow_reconnect=False,
    )
    return nc, nc.jetstream(publish_async_max_pending=max_pending, timeout=10)


async def create_stream(cluster: NatsCluster, replicas: int = 3) -> None:
    """The stream, once the JetStream meta leader exists and the stream has a leader (bounded)."""
    from nats.js.api import StorageType, StreamConfig

    deadline = time.monotonic() + SERVER_READY_TIMEOUT_S
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            nc, js = await connect(cluster.urls)
        except Exception as exc:  # servers still starting
            last_error = exc
            await asyncio.sleep(0.2)
            continue
        try:
            with contextlib.suppress(Exception):
                await js.delete_stream(STREAM)
            await js.add_stream(
                StreamConfig(name=STREAM, subjects=[SUBJECT], num_replicas=replicas, storage=StorageType.FILE)
            )
            info = await js.stream_info(STREAM)
            if (
                info.cluster is not None
                and info.cluster.leader
                and len(info.cluster.replicas or []) == replicas - 1
            ):
                return
        except Exception as exc:  # no meta leader yet, or peers still joining
            last_error = exc
        finally:
            await nc.close()
        await asyncio.sleep(0.5)
    raise SystemExit(
        f"NATS JetStream stream with {replicas} replicas not ready within "
        f"{SERVER_READY_TIMEOUT_S:.0f} s: {last_error}"
    )


# ---- produce ----------------------------------------------------------------------------------


def _ack_at(
    on_ack: Callable[[asyncio.Future[Any], float], None], sent_at: float, future: asyncio.Future[Any]
) -> None:
    """A done-callback that hands on_ack the send time too."""
    on_ack(future, sent_at)


async def produce(
    urls: list[str],
    *,
    record_size: int,
    duration_s: float,
    warmup_s: float,
    throughput: float,
    in_flight: int,
    window: common.Window,
) -> dict[str, object]:
    payload = b"x" * record_size
    nc, js = await connect(urls, max_pending=in_flight)
    latencies: list[float] = []
    counts = {"sent": 0, "acked": 0, "failed": 0}
    errors: dict[str, int] = {}
    recording = False

    def on_ack(future: asyncio.Future[Any], sent_at: float) -> None:
        took = time.perf_counter() - sent_at
        if future.cancelled() or future.exception() is not None:
            counts["failed"] += 1
            name = "cancelled" if future.cancelled() else type(future.exception()).__name__
            errors[name] = errors.get(name, 0) + 1
            return
        counts["acked"] += 1
        if recording:
            latencies.append(took)

    async def run(seconds: float) -> float:
        clock = common.SendClock(seconds)
        sent = 0
        futures: list[asyncio.Future[Any]] = []
        for now in clock:
            wait = common.pacing_delay(clock.start, sent, throughput, now)
            if wait:
                await asyncio.sleep(wait)
                continue
            sent_at = time.perf_counter()
            # nats-py hints an Awaitable; it is the asyncio.Future its ack completes.
            future = cast("asyncio.Future[Any]", await js.publish_async(SUBJECT, payload))
            future.add_done_callback(functools.partial(_ack_at, on_ack, sent_at))
            futures.append(future)
            sent += 1
        counts["sent"] += sent
        # A PubAck that never comes would hang publish_async_completed() for ever: bound it.
        pending = [f for f in futures if not f.done()]
        missing: set[asyncio.Future[Any]] = set()
        if pending:
            _, missing = await asyncio.wait(pending, timeout=PUBACK_WAIT_S)
        elapsed = time.perf_counter() - clock.start
        for future in missing:
            future.cancel()  # counted as failed ("cancelled") by on_ack
        return elapsed

    try:
        if warmup_s > 0:
            await run(warmup_s)
        counts.update(sent=0, acked=0, failed=0)
        errors.clear()
        recording = True
        window.open()
        elapsed = await run(duration_s)
        window.close()
    finally:
        await nc.close()
    return common.produce_summary(
        "nats-py publish_async", counts, errors, elapsed, record_size, latencies, per_request=1
    )


# ---- consume (catch-up) -----------------------------------------------------------------------


async def purge(urls: list[str]) -> None:
    """Empty the stream between runs (file storage of a 10 KB run is gigabytes)."""
    nc, js = await connect(urls)
    try:
        await js.purge_stream(STREAM)
    finally:
        await nc.close()


async def load(urls: list[str], *, count: int, record_size: int, timeout_s: float = 120.0) -> float:
    """Put `count` more records in the stream and return the seconds it took.

    Core-NATS publishes (no PubAck per message: the fastest way in), then waits until the
    stream holds them all, so the figure is what was stored, not what was sent.
    """
    payload = b"x" * record_size
    nc, js = await connect(urls)
    start = time.perf_counter()
    try:
        before = (await js.stream_info(STREAM)).state.messages
        for i in range(count):
            await nc.publish(SUBJECT, payload)
            if i % 10_000 == 9_999:
                await nc.flush(timeout=30)
        await nc.flush(timeout=30)
        deadline = start + timeout_s
        while (await js.stream_info(STREAM)).state.messages < before + count:
            if time.perf_counter() > deadline:
                raise SystemExit(
                    f"NATS: the stream did not reach {before + count} messages in {timeout_s:.0f} s"
                )
            await asyncio.sleep(0.1)
    finally:
        await nc.close()
    return time.perf_counter() - start


async def consume(
    urls: list[str],
    *,
    count: int,
    record_size: int,
    fetch_batch: int,
    window: common.Window,
    mode: str = "pull",
    timeout_s: float = 120.0,
) -> dict[str, object]:
    """Read `count` records from the start of the stream, without acks.

    mode "pull": a pull consumer, fetch(fetch_batch) at a time; "push": an ordered push
    consumer (flow-controlled, what nats-py offers for streaming a whole stream).
    """
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    nc, js = await connect(urls)
    received = 0
    try:
        if mode == "pull":
            sub = await js.pull_subscribe(
                SUBJECT,
                durable=None,
                stream=STREAM,
                config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
            )
            window.open()
            start = time.perf_counter()
            deadline = start + timeout_s
            while received < count and time.perf_counter() < deadline:
                try:
                    msgs = await sub.fetch(batch=min(fetch_batch, count - received), timeout=5)
                except TimeoutError:
                    continue
                received += len(msgs)
        else:
            done = asyncio.Event()

            async def on_msg(msg: Msg) -> None:
                nonlocal received
                received += 1
                if received >= count:
                    done.set()

            window.open()
            start = time.perf_counter()
            await js.subscribe(
                SUBJECT,
                cb=on_msg,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL,
                pending_msgs_limit=1_000_000,
                pending_bytes_limit=1024 * 1024 * 1024,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), timeout_s)
        elapsed = time.perf_counter() - start
        window.close()
    finally:
        await nc.close()
    path = f"nats-py pull fetch({fetch_batch})" if mode == "pull" else "nats-py ordered push consumer"
    return common.read_summary(path, received, count, elapsed, record_size)


# ---- end-to-end latency -----------------------------------------------------------------------


async def e2e_produce(
    urls: list[str], *, rate: float, duration_s: float, record_size: int
) -> dict[str, object]:
    """Publish at `rate` records/s for duration_s, the send time in each payload."""
    pad = b"x" * max(record_size - _SENT_NS.size, 0)
    nc, js = await connect(urls)
    sent = 0
    try:
        clock = common.SendClock(duration_s)
        for now in clock:
            due = clock.start + sent / rate
            if due > now:
                await asyncio.sleep(due - now)
                continue
            await js.publish_async(SUBJECT, _SENT_NS.pack(time.time_ns()) + pad)
            sent += 1
        await asyncio.wait_for(js.publish_async_completed(), 60)
    finally:
        await nc.close()
    return {"sent": sent}


async def e2e_consume(urls: list[str], *, expected: int, timeout_s: float) -> dict[str, object]:
    """Ordered push consumer from new messages; prints 'ready' once subscribed, then waits."""
    from nats.js.api import DeliverPolicy

    nc, js = await connect(urls)
    latencies: list[float] = []

    async def on_msg(msg: Msg) -> None:
        latencies.append((time.time_ns() - _SENT_NS.unpack_from(msg.data)[0]) / 1e9)

    try:
        await js.subscribe(SUBJECT, cb=on_msg, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW)
        print("ready", flush=True)
        deadline = time.monotonic() + timeout_s
        seen, idle_since = 0, time.monotonic()
        # Done at `expected`, or once records stopped coming (a producer that fell behind sends fewer).
        while len(latencies) < expected and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            if len(latencies) != seen:
                seen, idle_since = len(latencies), time.monotonic()
            elif seen and time.monotonic() - idle_since > common.E2E_IDLE_END_S:
                break
    finally:
        await nc.close()
    return {"received": len(latencies), "latency": common.percentiles_ms(latencies)}


def main() -> int:
    return common.e2e_consumer_main(
        __doc__,
        lambda consumer: consumer.add_argument("--urls", required=True),
        lambda args: asyncio.run(
            e2e_consume(args.urls.split(","), expected=args.expected, timeout_s=args.timeout_s)
        ),
    )


if __name__ == "__main__":
    raise SystemExit(main())
