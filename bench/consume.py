"""Catch-up read throughput, modelled on Kafka's kafka-consumer-perf-test.

Loads --records records of --record-size bytes first (acks=all, straight to the partition
leaders, in batches of --batch-size bytes as the Producer makes them by default), then
times reading them all back from offset 0, one way after another on the same data:

- consumer:      the Consumer (clients/consumer.py) through the gateway: assign every
                 partition, seek to the beginning, poll() until every record is returned
                 (each record decoded into a ConsumerRecord), max_poll_records --max-poll-records.
- fetch:         raw gRPC Fetch to the gateway for every partition at once, one request at
                 a time, advancing each partition's offset past the batches returned.
                 Records are counted from the batch headers (no decoding: what a pass-through
                 reader pays); --decode decodes every record as well (clients.common.records).
- fetch-direct:  the same raw Fetch sent to each partition's leader broker, one loop per
                 leader running concurrently, bypassing the gateway.

Prints records/s and MB/s (MB = 10^6 bytes of record values) and the CPU of every process.
Starts its own LocalCluster (3 brokers, RF 3, min.insync.replicas 2) unless --bootstrap is
given. Writes bench/results/consume.json. Example:
  python bench/consume.py --records 2000000 --path consumer fetch fetch-direct
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common
from bench.produce import PRODUCE_TIMEOUT_MS, Window, make_payload, records_per_batch

PATHS = ("consumer", "fetch", "fetch-direct")
# One reader gives up after this long without finishing (the figure is then marked incomplete).
READ_TIMEOUT_S = 120.0
LOAD_IN_FLIGHT = 4


async def _load(target: common.Target, records: int, record_size: int, batch_size: int) -> float:
    """Write `records` records spread evenly over the partitions, acks=all, direct to leaders."""
    from clients.common.records import encode_values
    from protos.highwater.v1 import broker_pb2_grpc, common_pb2

    per_batch = records_per_batch(batch_size, record_size)
    payload = make_payload(record_size)
    groups = common.address_groups(target)
    left = {
        p: records // target.partitions + (1 if p < records % target.partitions else 0)
        for p in range(target.partitions)
    }
    channels = common.aio_channels(groups)

    async def loader(address: str, partitions: list[int]) -> None:
        stub = broker_pb2_grpc.BrokerServiceStub(channels[address])  # type: ignore[no-untyped-call]  # generated, unannotated
        while True:
            # Up to 64 batches per partition per request: loading is not what is measured.
            parts = []
            for p in partitions:
                data = b""
                for _ in range(64):
                    n = min(per_batch, left[p])
                    if n <= 0:
                        break
                    left[p] -= n
                    data += encode_values([payload] * n, timestamp_ms=time.time_ns() // 1_000_000)
                if data:
                    parts.append(common_pb2.ProducePartitionData(partition=p, records=data))
            if not parts:
                return
            resp = await stub.Produce(
                common_pb2.ProduceRequest(
                    acks=-1,
                    timeout_ms=PRODUCE_TIMEOUT_MS,
                    topics=[common_pb2.ProduceTopicData(topic=target.topic, partitions=parts)],
                ),
                timeout=PRODUCE_TIMEOUT_MS / 1000 + 5,
            )
            common.check_partition_errors(resp, "loading failed: partition")

    start = time.perf_counter()
    try:
        await asyncio.gather(*(loader(a, ps) for a, ps in groups.items() for _ in range(LOAD_IN_FLIGHT)))
    finally:
        for channel in channels.values():
            await channel.close()
    return time.perf_counter() - start


def load(target: common.Target, records: int, record_size: int, batch_size: int) -> float:
    return asyncio.run(_load(target, records, record_size, batch_size))


# ---- readers ----------------------------------------------------------------------------------


def read_consumer(
    target: common.Target, records: int, max_poll_records: int, window: Window
) -> common.Result:
    from clients.consumer import Consumer
    from clients.types import TopicPartition

    tps = [TopicPartition(target.topic, p) for p in range(target.partitions)]
    received = 0
    value_bytes = 0
    with Consumer(
        bootstrap=target.gateway,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=max_poll_records,
    ) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning()
        window.open()
        start = time.perf_counter()
        deadline = start + READ_TIMEOUT_S
        while received < records and time.perf_counter() < deadline:
            batch = consumer.poll(timeout_ms=1000)
            received += len(batch)
            if batch:
                value_bytes += len(batch[0].value or b"") * len(batch)
        elapsed = time.perf_counter() - start
        window.close()
    return _summary("consumer", received, records, elapsed, value_bytes)


async def _read_fetch(
    target: common.Target, records: int, direct: bool, decode: bool, partition_max_bytes: int, window: Window
) -> common.Result:
    from clients.common.fetch_request import consumer_fetch_request
    from clients.common.record_batch import iter_batch_headers
    from clients.common.records import decode_batches
    from protos.highwater.v1 import broker_pb2_grpc, gateway_pb2_grpc

    groups = common.address_groups(target, direct)
    channels = common.aio_channels(groups)
    stub_cls = broker_pb2_grpc.BrokerServiceStub if direct else gateway_pb2_grpc.GatewayServiceStub
    offsets = dict.fromkeys(range(target.partitions), 0)
    totals = {"records": 0, "bytes": 0, "requests": 0}
    deadline = time.perf_counter() + READ_TIMEOUT_S

    async def reader(address: str, partitions: list[int]) -> None:
        stub = stub_cls(channels[address])
        # What the load put there: records spread evenly, the remainder on the first partitions.
        share = sum(
            records // target.partitions + (1 if p < records % target.partitions else 0) for p in partitions
        )
        mine = 0
        while mine < share and time.perf_counter() < deadline:
            request = consumer_fetch_request(
                {(target.topic, p): offsets[p] for p in partitions},
                max_wait_ms=0,
                min_bytes=0,
                max_bytes=50 * 1024 * 1024,
                partition_max_bytes=partition_max_bytes,
            )
            response = await stub.Fetch(request, timeout=30)
            totals["requests"] += 1
            got = 0
            common.check_partition_errors(response, "Fetch of partition")
            for topic in response.topics:
                for part in topic.partitions:
                    buf = part.records
                    if not buf:
                        continue
                    if decode:
                        count = 0
                        size = 0
                        last = offsets[part.partition]
                        for record in decode_batches(buf):
                            if record.offset >= offsets[part.partition]:
                                count += 1
                                size += len(record.value or b"")
                                last = record.offset
                        offsets[part.partition] = last + 1
                    else:
                        count = 0
                        for header in iter_batch_headers(buf):
                            count += header.next_offset - max(header.base_offset, offsets[part.partition])
                            offsets[part.partition] = header.next_offset
                        size = len(buf)  # record bytes as stored (values + framing)
                    got += count
                    totals["bytes"] += size
            mine += got
            totals["records"] += got
            if not got:
                await asyncio.sleep(0.01)  # caught up with the HW before the others: let them finish

    try:
        for channel in channels.values():
            await asyncio.wait_for(channel.channel_ready(), 10)
        window.open()
        start = time.perf_counter()
        await asyncio.gather(*(reader(a, ps) for a, ps in groups.items()))
        elapsed = time.perf_counter() - start
        window.close()
    finally:
        for channel in channels.values():
            await channel.close()
    name = ("fetch-direct" if direct else "fetch") + (" +decode" if decode else "")
    result = _summary(name, int(totals["records"]), records, elapsed, int(totals["bytes"]))
    result["requests"] = totals["requests"]
    return result


def read_fetch(
    target: common.Target, records: int, direct: bool, decode: bool, partition_max_bytes: int, window: Window
) -> common.Result:
    return asyncio.run(_read_fetch(target, records, direct, decode, partition_max_bytes, window))


def _summary(path: str, received: int, expected: int, elapsed_s: float, value_bytes: int) -> common.Result:
    rate = received / elapsed_s if elapsed_s > 0 else 0.0
    return {
        "path": path,
        "records": received,
        "complete": received >= expected,
        "elapsed_s": round(elapsed_s, 3),
        "records_per_s": round(rate),
        "mb_per_s": round(value_bytes / elapsed_s / 1e6, 1) if elapsed_s else 0.0,
    }


def run_path(
    target: common.Target, path: str, records: int, args: argparse.Namespace, window: Window
) -> common.Result:
    if path == "consumer":
        return read_consumer(target, records, args.max_poll_records, window)
    return read_fetch(target, records, path == "fetch-direct", args.decode, args.partition_max_bytes, window)


def describe(result: common.Result) -> str:
    text = (
        f"{result['path']:>20}: {result['records_per_s']:>10,} records/s  {result['mb_per_s']:>7.1f} MB/s  "
        f"({result['records']:,} records in {result['elapsed_s']} s)"
    )
    return text if result["complete"] else text + "  INCOMPLETE (timed out)"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--records", type=int, default=2_000_000, help="records to load and read (default 2M)"
    )
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument(
        "--batch-size",
        type=int,
        default=16 * 1024,
        help="bytes per batch when loading (default 16384, the Producer's default)",
    )
    parser.add_argument("--path", choices=PATHS, nargs="+", default=list(PATHS))
    parser.add_argument(
        "--max-poll-records", type=int, default=500, help="Consumer max_poll_records (Kafka's 500)"
    )
    parser.add_argument(
        "--partition-max-bytes",
        type=int,
        default=1024 * 1024,
        help="raw Fetch: bytes per partition per request (default 1 MiB, Kafka's)",
    )
    parser.add_argument("--decode", action="store_true", help="raw Fetch: decode every record too")
    parser.add_argument("--profile", action="store_true", help="one more read per path under py-spy")
    common.add_target_arguments(parser, partitions=6, output="consume")
    args = parser.parse_args()
    topic = common.target_topic(args, "consume")
    out = common.target_header(
        args, records=args.records, record_size=args.record_size, batch_size=args.batch_size
    )
    with common.target_for(args, topic) as target:
        took = load(target, args.records, args.record_size, args.batch_size)
        out["load_s"] = round(took, 2)
        print(
            f"consume: loaded {args.records:,} records of {args.record_size} B into {args.partitions} "
            f"partitions (RF {args.replication_factor}, {args.batch_size} B batches) in {took:.1f} s",
            flush=True,
        )
        for path in args.path:
            gate = common.wait_for_quiet(wait_s=args.quiet_wait_s)
            window = Window(common.CpuMeter({**target.pids, "client": os.getpid()}))
            result = run_path(target, path, args.records, args, window)
            common.add_cpu_figures(result, gate, window.cpu, int(result["records"]))
            print("  " + describe(result), flush=True)
            print("      " + common.format_cpu_figures(result), flush=True)
            if args.profile:
                _, result["profile"] = common.profiled_run(
                    target,
                    functools.partial(run_path, target, path, args.records, args),
                    max(result["elapsed_s"], 1),
                )
            out["runs"].append(result)
    return common.finish(args.output, out)


if __name__ == "__main__":
    raise SystemExit(main())
