"""Producer throughput and latency, modelled on Kafka's kafka-producer-perf-test.

Records of --record-size bytes at --throughput records/s (-1: as fast as they go) for
--duration-s seconds, acks=all by default, to a topic with --partitions partitions and
--replication-factor replicas (min.insync.replicas --min-insync). Three ways in (--path,
several may be given and run one after another on the same cluster):

- client:  the Producer (clients/producer.py) through the gateway: send_batch() calls of one
           batch's worth of records each (--batch-size bytes), with its linger, compression,
           idempotence and in-flight limits. Latency is per send_batch() call: from the call
           to its future resolving (Kafka's perf test measures send -> callback per record).
- gateway: raw gRPC Produce to the gateway, each request one batch per partition, encoded
           here (clients/records.encode_values) per request; --in-flight requests at once.
- direct:  (--direct) the same raw Produce sent by us to each partition's leader broker,
           bypassing the gateway: --in-flight requests at once per leader.

Each batch holds distinct records (random upper-case letters, made once), so compression
figures are not flattered by repeats. Prints records/s, MB/s (MB = 10^6 bytes of record values)
and latency percentiles (p50,
p99, p99.9, max) per request/batch, and the CPU each process used (etcd, controller,
brokers, gateway and this client) in cores (CPU seconds per second). Starts its own
LocalCluster (3 brokers) in a temporary directory unless --bootstrap HOST:PORT names a
gateway; every process it starts is stopped by pid on the way out.

--profile samples the client, the gateway and the leader brokers with py-spy during one
more run and prints each one's top functions by self time.

Writes bench/results/produce.json. Example:
  python bench/produce.py --record-size 100 --duration-s 20 --path client direct
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import functools
import os
import random
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common
from clients.config import BATCH_SIZE_BYTES_DEFAULT, LINGER_MS_DEFAULT

if TYPE_CHECKING:
    from clients.sender import SentRecords

# One Produce's server-side timeout (acks=all waits this long for the ISR at most).
PRODUCE_TIMEOUT_MS = 30_000
BATCH_HEADER_BYTES = 61
PATHS = ("client", "gateway", "direct")


@dataclass
class ProduceSpec:
    record_size: int = 100
    duration_s: float = 20.0
    warmup_s: float = 2.0
    throughput: float = -1  # records/s; -1: unbounded
    acks: str = "all"
    batch_size: int = BATCH_SIZE_BYTES_DEFAULT  # the Producer's defaults
    linger_ms: int = LINGER_MS_DEFAULT
    compression: str = "none"
    in_flight: int = 5
    buffer_memory: int = 32 * 1024 * 1024
    records_per_send: int = 0  # client path: values per send_batch() call; 0: one batch's worth

    @property
    def records_per_batch(self) -> int:
        """Records of record_size that fit batch_size bytes once encoded (no key, no headers)."""
        return records_per_batch(self.batch_size, self.record_size)

    @property
    def acks_wire(self) -> int:
        return {"all": -1, "-1": -1, "1": 1, "0": 0}[str(self.acks)]


def records_per_batch(batch_size: int, record_size: int) -> int:
    """How many records of record_size bytes fit one encoded batch of at most batch_size bytes.

    Measured on a probe batch: a record's framing grows with its offset delta (varints), so
    a fixed overhead guess overshoots a 1 MiB batch past the broker's max.message.bytes.
    """
    from clients.common.records import encode_values

    probe = 1000
    size = len(encode_values([b"x" * record_size] * probe, timestamp_ms=0)) - BATCH_HEADER_BYTES
    per_record = -(-size // probe) + 1  # ceil, plus a byte for larger offset deltas further on
    return max(1, (batch_size - BATCH_HEADER_BYTES) // per_record)


def make_payload(size: int, seed: int = 7) -> bytes:
    """Random upper-case letters, as kafka-producer-perf-test makes its payload."""
    rng = random.Random(seed)
    return bytes(rng.randrange(65, 91) for _ in range(size))


def make_values(size: int, count: int) -> list[bytes]:
    """`count` different payloads of random upper-case letters (made once, reused for every batch).

    kafka-producer-perf-test repeats one payload, which a compressor squeezes to almost
    nothing within a batch; distinct records make --compression figures honest (letters
    compress to about 60%, as text does). Uncompressed runs cost the same either way.
    """
    rng = random.Random(7)
    block = rng.randbytes(size * count)
    letters = bytes(65 + b % 26 for b in range(256))
    block = block.translate(letters)
    return [block[i * size : (i + 1) * size] for i in range(count)]


# The measured window (consume.py and peers/compare.py take it from here).
Window = common.Window


# ---- the Producer through the gateway --------------------------------------------------------


def produce_client(target: common.Target, spec: ProduceSpec, window: Window) -> common.Result:
    from clients.producer import Producer

    per_send = spec.records_per_send or spec.records_per_batch
    values = make_values(spec.record_size, per_send)
    settings: common.Result = dict(
        acks=spec.acks,
        linger_ms=spec.linger_ms,
        batch_size_bytes=spec.batch_size,
        compression=spec.compression,
        enable_idempotence=spec.acks_wire == -1,
        max_in_flight_requests=spec.in_flight,
        buffer_memory_bytes=spec.buffer_memory,
        max_request_bytes=max(1024 * 1024, spec.batch_size),
    )
    lock = threading.Lock()
    latencies: list[float] = []
    counts = {"acked": 0, "failed": 0}
    errors: dict[str, int] = {}

    def on_done(future: concurrent.futures.Future[SentRecords], sent_at: float) -> None:
        took = time.perf_counter() - sent_at
        error = future.exception()
        with lock:
            if error is None:
                counts["acked"] += per_send
                latencies.append(took)
            else:
                counts["failed"] += per_send
                errors[type(error).__name__] = errors.get(type(error).__name__, 0) + 1

    def run(duration_s: float) -> tuple[int, float]:
        sent = 0
        clock = common.SendClock(duration_s)
        for now in clock:
            wait = common.pacing_delay(clock.start, sent, spec.throughput, now)
            if wait:
                time.sleep(wait)
                continue
            sent_at = time.perf_counter()
            future = producer.send_batch(target.topic, values)
            future.add_done_callback(functools.partial(on_done, sent_at=sent_at))
            sent += per_send
        producer.flush(timeout_ms=120_000)
        return sent, time.perf_counter() - clock.start

    with Producer(target.gateway, **settings) as producer:
        producer.partitions_for(target.topic)
        if spec.warmup_s > 0:
            run(spec.warmup_s)
        with lock:
            latencies.clear()
            counts.update(acked=0, failed=0)
            errors.clear()
        window.open()
        sent, elapsed = run(spec.duration_s)
        window.close()
    return summarize(
        "client",
        spec,
        sent,
        counts["acked"],
        counts["failed"],
        dict(errors),
        elapsed,
        latencies,
        per_request=per_send,
    )


# ---- raw gRPC Produce: to the gateway or to each leader --------------------------------------


async def _produce_raw(
    target: common.Target, spec: ProduceSpec, direct: bool, window: Window
) -> common.Result:
    import grpc

    from clients.common.records import encode_values
    from protos.highwater.v1 import broker_pb2_grpc, common_pb2, gateway_pb2_grpc

    groups = common.address_groups(target, direct)
    channels = common.aio_channels(groups)
    stub_cls = broker_pb2_grpc.BrokerServiceStub if direct else gateway_pb2_grpc.GatewayServiceStub
    stubs = {address: stub_cls(channel) for address, channel in channels.items()}
    values = make_values(spec.record_size, spec.records_per_batch)
    per_batch = len(values)
    latencies: list[float] = []
    counts = {"sent": 0, "acked": 0, "failed": 0}
    errors: dict[str, int] = {}
    recording = False

    async def worker(address: str, partitions: list[int], stop_at: float, start: float) -> None:
        stub = stubs[address]
        per_request = per_batch * len(partitions)
        while True:
            now = time.perf_counter()
            if now >= stop_at:
                return
            wait = common.pacing_delay(start, counts["sent"], spec.throughput, now)
            if wait:
                await asyncio.sleep(wait)
                continue
            counts["sent"] += per_request
            timestamp_ms = time.time_ns() // 1_000_000
            request = common_pb2.ProduceRequest(
                acks=spec.acks_wire,
                timeout_ms=PRODUCE_TIMEOUT_MS,
                topics=[
                    common_pb2.ProduceTopicData(
                        topic=target.topic,
                        partitions=[
                            common_pb2.ProducePartitionData(
                                partition=p,
                                records=encode_values(
                                    values, timestamp_ms=timestamp_ms, compression=spec.compression
                                ),
                            )
                            for p in partitions
                        ],
                    )
                ],
            )
            sent_at = time.perf_counter()
            try:
                response = await stub.Produce(request, timeout=PRODUCE_TIMEOUT_MS / 1000 + 5)
            except grpc.aio.AioRpcError as exc:
                counts["failed"] += per_request
                errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                continue
            took = time.perf_counter() - sent_at
            ok = 0
            for topic in response.topics:
                for part in topic.partitions:
                    if part.error_code == common_pb2.NONE:
                        ok += per_batch
                    else:
                        name = common_pb2.ErrorCode.Name(part.error_code)
                        errors[name] = errors.get(name, 0) + 1
            counts["acked"] += ok
            counts["failed"] += per_request - ok
            if recording:
                latencies.append(took)

    async def run(duration_s: float) -> float:
        start = time.perf_counter()
        stop_at = start + duration_s
        await asyncio.gather(
            *(
                worker(address, partitions, stop_at, start)
                for address, partitions in groups.items()
                for _ in range(spec.in_flight)
            )
        )
        return time.perf_counter() - start

    try:
        for channel in channels.values():
            await asyncio.wait_for(channel.channel_ready(), 10)
        if spec.warmup_s > 0:
            await run(spec.warmup_s)
        counts.update(sent=0, acked=0, failed=0)
        errors.clear()
        recording = True
        window.open()
        elapsed = await run(spec.duration_s)
        window.close()
    finally:
        for channel in channels.values():
            await channel.close()
    return summarize(
        "direct" if direct else "gateway",
        spec,
        counts["sent"],
        counts["acked"],
        counts["failed"],
        errors,
        elapsed,
        latencies,
        per_request=per_batch * target.partitions // len(groups),
    )


def produce_raw(target: common.Target, spec: ProduceSpec, direct: bool, window: Window) -> common.Result:
    return asyncio.run(_produce_raw(target, spec, direct, window))


def summarize(
    path: str,
    spec: ProduceSpec,
    sent: int,
    acked: int,
    failed: int,
    errors: dict[str, int],
    elapsed_s: float,
    latencies: list[float],
    *,
    per_request: int,
) -> common.Result:
    counts = {"sent": sent, "acked": acked, "failed": failed}
    return common.produce_summary(
        path, counts, errors, elapsed_s, spec.record_size, latencies, per_request=per_request
    )


def run_path(target: common.Target, spec: ProduceSpec, path: str, window: Window) -> common.Result:
    if path == "client":
        return produce_client(target, spec, window)
    return produce_raw(target, spec, path == "direct", window)


def describe(result: common.Result) -> str:
    lat = result["latency_per_request"]
    text = (
        f"{result['path']:>7}: {result['records_per_s']:>10,} records/s  {result['mb_per_s']:>7.1f} MB/s  "
        f"latency per request ({result['records_per_request']} records): "
        f"{common.format_latency(lat)}"
    )
    if result["records_failed"]:
        text += f"  FAILED {result['records_failed']} records: {result['errors']}"
    return text


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--record-size", type=int, default=100, help="bytes per record value (default 100)")
    parser.add_argument(
        "--duration-s", type=float, default=20.0, help="measured seconds per path (default 20)"
    )
    parser.add_argument("--warmup-s", type=float, default=2.0, help="unmeasured seconds first (default 2)")
    parser.add_argument(
        "--throughput", type=float, default=-1, help="records/s to aim at; -1 unbounded (default)"
    )
    parser.add_argument("--acks", choices=["all", "1", "0"], default="all")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=BATCH_SIZE_BYTES_DEFAULT,
        help="bytes per partition batch (Producer batch_size_bytes; raw paths: records per "
        f"batch = what fits). Default {BATCH_SIZE_BYTES_DEFAULT}, the Producer's",
    )
    parser.add_argument(
        "--records-per-send",
        type=int,
        default=0,
        help="client path: values per send_batch() call (default: what fits one --batch-size batch)",
    )
    parser.add_argument(
        "--linger-ms",
        type=int,
        default=LINGER_MS_DEFAULT,
        help=f"Producer linger_ms (client path; default {LINGER_MS_DEFAULT}, the Producer's)",
    )
    parser.add_argument("--compression", choices=["none", "gzip", "snappy", "lz4", "zstd"], default="none")
    parser.add_argument(
        "--in-flight",
        type=int,
        default=5,
        help="requests in flight (client: max_in_flight_requests; raw: per target); default 5",
    )
    parser.add_argument(
        "--buffer-memory", type=int, default=32 * 1024 * 1024, help="Producer buffer_memory_bytes"
    )
    parser.add_argument(
        "--path",
        choices=PATHS,
        nargs="+",
        default=None,
        help="client (Producer via gateway), gateway (raw gRPC), direct (raw gRPC to leaders)",
    )
    parser.add_argument("--direct", action="store_true", help="same as --path direct")
    parser.add_argument("--brokers", type=int, default=3, help="brokers of our own cluster (default 3)")
    parser.add_argument(
        "--tmp-dir",
        default=None,
        help="where our cluster's data goes (default: the system temp dir; /dev/shm takes the "
        "disk out of the figure)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="one more run per path under py-spy: top functions of client, gateway, leaders",
    )
    parser.add_argument(
        "--native", action="store_true", help="py-spy --native (C frames of gRPC and protobuf)"
    )
    common.add_target_arguments(parser, partitions=6, output="produce")
    return parser.parse_args()


def spec_from_args(args: argparse.Namespace) -> ProduceSpec:
    return ProduceSpec(
        record_size=args.record_size,
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        throughput=args.throughput,
        acks=args.acks,
        batch_size=args.batch_size,
        linger_ms=args.linger_ms,
        compression=args.compression,
        in_flight=args.in_flight,
        buffer_memory=args.buffer_memory,
        records_per_send=args.records_per_send,
    )


def measure_path(
    target: common.Target, spec: ProduceSpec, path: str, args: argparse.Namespace
) -> common.Result:
    """One path's run once the load gate lets it start: its result with the server-side Produce
    figures and the CPU each process used, printed as it goes; with --profile, one more run under py-spy."""
    gate = common.wait_for_quiet(wait_s=args.quiet_wait_s)
    window = Window(common.CpuMeter({**target.pids, "client": os.getpid()}))
    before = common.rpc_totals(target, "Produce")
    result = run_path(target, spec, path, window)
    # Server-side view: Produce requests/s and mean time each took in the gateway and the
    # leaders (Little's law: rate x latency = requests in flight, the pipeline's depth).
    result["server_produce"] = common.rpc_delta(
        before, common.rpc_totals(target, "Produce"), float(result["elapsed_s"])
    )
    common.add_cpu_figures(result, gate, window.cpu, int(result["records_acked"]))
    print("  " + describe(result), flush=True)
    if result["server_produce"]:
        print("           server-side Produce: " + common.format_rpc(result["server_produce"]), flush=True)
    print("           " + common.format_cpu_figures(result), flush=True)
    if args.profile:
        profiled, profile = common.profiled_run(
            target, functools.partial(run_path, target, spec, path), spec.duration_s, native=args.native
        )
        result["profiled_run"] = {k: profiled[k] for k in ("records_per_s", "mb_per_s")}
        result["profile"] = profile
    return result


def main() -> int:
    args = parse_args()
    paths = ["direct"] if args.direct else (args.path or ["client"])
    spec = spec_from_args(args)
    topic = common.target_topic(args, "produce")
    out = common.target_header(
        args,
        spec=asdict(spec),
        tmp_dir=args.tmp_dir or tempfile.gettempdir(),
        min_insync=args.min_insync,
    )
    print(
        f"produce: {spec.record_size} B records, acks={spec.acks}, {args.partitions} partitions, RF "
        f"{args.replication_factor}, min.insync {args.min_insync}, batch {spec.batch_size} B "
        f"({spec.records_per_batch} records), linger {spec.linger_ms} ms, compression {spec.compression}, "
        f"{spec.duration_s:.0f} s per path",
        flush=True,
    )
    with common.target_for(args, topic, brokers=args.brokers, tmp_dir=args.tmp_dir) as target:
        out["leaders"] = target.leader_processes()
        for path in paths:
            out["runs"].append(measure_path(target, spec, path, args))
    return common.finish(args.output, out)


if __name__ == "__main__":
    raise SystemExit(main())
