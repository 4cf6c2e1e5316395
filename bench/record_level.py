"""The price of convenience: record-level calls against batch-level ones, in one run.

Both paths move the same records (100-byte values, 16-byte keys, one header) from
Python through a generated stub to the gateway of one cluster (3 brokers, replication
factor 3, min.insync.replicas 2, acks=all):

- produce, record-level: ProduceRecords with REQUEST_RECORDS records per call; the
  gateway partitions (murmur2), batches, encodes and writes idempotently.
- produce, batch-level: the script partitions with the same murmur2 and encodes one
  RecordBatch v2 per partition (clients/common/records.py), then calls Produce; encoding time
  counts, since it is the work the record-level call moves to the gateway.
- consume, record-level: one ConsumeRecords stream from the earliest offset of every
  partition until every record came back as a protobuf message.
- consume, batch-level: Fetch loops per partition, decoded with decode_batches.

IN_FLIGHT calls at a time on each path. Rounds alternate between the paths, so load
changes hit both. Usage: python bench/record_level.py [--records N] [--rounds R]
[--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/record_level.py` from anywhere

import grpc

from bench import common
from clients.common.fetch_request import consumer_fetch_request
from clients.common.partitioner import partition_for_key
from clients.common.records import decode_batches, encode_batch
from protos.highwater.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

PARTITIONS = 6
REQUEST_RECORDS = 1_000
IN_FLIGHT = 4
VALUE_BYTES = 100
RPC_TIMEOUT_S = 60.0
FETCH_PARTITION_MAX_BYTES = 1 << 20

ResponseT = TypeVar("ResponseT")


def _records(count: int, seed: int) -> list[tuple[bytes, bytes]]:
    return [
        (f"key-{seed}-{i % 10_000:08d}".encode()[:16].ljust(16, b"."), bytes([i % 251]) * VALUE_BYTES)
        for i in range(count)
    ]


def _windowed(calls: list[Callable[[], grpc.Future]], check: Callable[[Any], None]) -> None:
    """Run the calls with IN_FLIGHT outstanding at a time; `check` every answer (grpc's futures are
    untyped: an answer is Any here, and `check` says what it expects)."""
    pending: list[grpc.Future] = []
    for make in calls:
        pending.append(make())
        if len(pending) >= IN_FLIGHT:
            check(pending.pop(0).result(timeout=RPC_TIMEOUT_S))
    for fut in pending:
        check(fut.result(timeout=RPC_TIMEOUT_S))


def _produce_rate(
    records: list[tuple[bytes, bytes]],
    call: Callable[[list[tuple[bytes, bytes]]], Callable[[], grpc.Future]],
    errors_in: Callable[[ResponseT], Sequence[object]],
    rpc: str,
) -> float:
    """Records/s of sending `records`, REQUEST_RECORDS a request (call(chunk) makes one), _windowed;
    SystemExit with the first of errors_in(an answer) if any."""

    def check(resp: ResponseT) -> None:
        bad = errors_in(resp)
        if bad:
            raise SystemExit(f"{rpc} failed: {bad[0]}")

    started = time.perf_counter()
    _windowed(
        [call(records[i : i + REQUEST_RECORDS]) for i in range(0, len(records), REQUEST_RECORDS)], check
    )
    return len(records) / (time.perf_counter() - started)


def _record_errors(resp: gateway_pb2.ProduceRecordsResponse) -> list[gateway_pb2.RecordResult]:
    return [r for r in resp.results if r.error_code]


def _partition_errors(resp: common_pb2.ProduceResponse) -> list[common_pb2.ProducePartitionResponse]:
    return [p for t in resp.topics for p in t.partitions if p.error_code]


def produce_record_level(
    stub: gateway_pb2_grpc.GatewayServiceStub, topic: str, records: list[tuple[bytes, bytes]]
) -> float:
    def call(chunk: list[tuple[bytes, bytes]]) -> Callable[[], grpc.Future]:
        return lambda: stub.ProduceRecords.future(
            gateway_pb2.ProduceRecordsRequest(
                topic=topic,
                records=[
                    gateway_pb2.ProducerRecord(
                        key=k, value=v, headers=[gateway_pb2.RecordHeader(key="h", value=b"1")]
                    )
                    for k, v in chunk
                ],
            ),
            timeout=RPC_TIMEOUT_S,
        )

    return _produce_rate(
        records,
        call,
        _record_errors,
        "ProduceRecords",
    )


def produce_batch_level(
    stub: gateway_pb2_grpc.GatewayServiceStub, topic: str, records: list[tuple[bytes, bytes]]
) -> float:
    def call(chunk: list[tuple[bytes, bytes]]) -> Callable[[], grpc.Future]:
        def make() -> grpc.Future:
            now = int(time.time() * 1000)
            by_partition: dict[int, list[tuple[bytes, bytes, list[tuple[str, bytes]], int]]] = {}
            for k, v in chunk:
                by_partition.setdefault(partition_for_key(k, PARTITIONS), []).append(
                    (k, v, [("h", b"1")], now)
                )
            return stub.Produce.future(
                common_pb2.ProduceRequest(
                    acks=-1,
                    timeout_ms=30_000,
                    topics=[
                        common_pb2.ProduceTopicData(
                            topic=topic,
                            partitions=[
                                common_pb2.ProducePartitionData(partition=p, records=encode_batch(rs))
                                for p, rs in by_partition.items()
                            ],
                        )
                    ],
                ),
                timeout=RPC_TIMEOUT_S,
            )

        return make

    return _produce_rate(
        records,
        call,
        _partition_errors,
        "Produce",
    )


def consume_record_level(stub: gateway_pb2_grpc.GatewayServiceStub, topic: str, count: int) -> float:
    started = time.perf_counter()
    seen = 0
    for message in stub.ConsumeRecords(
        gateway_pb2.ConsumeRecordsRequest(
            topic=topic, default_start_offset=-2, max_records=count, max_records_per_message=1_000
        ),
        timeout=RPC_TIMEOUT_S * 5,
    ):
        if message.errors:
            raise SystemExit(f"ConsumeRecords failed: {message.errors[0]}")
        seen += sum(1 for r in message.records if r.value)
    if seen != count:
        raise SystemExit(f"ConsumeRecords returned {seen} of {count} records")
    return count / (time.perf_counter() - started)


def consume_batch_level(stub: gateway_pb2_grpc.GatewayServiceStub, topic: str, count: int) -> float:
    started = time.perf_counter()
    positions = dict.fromkeys(range(PARTITIONS), 0)
    seen = 0
    deadline = time.monotonic() + RPC_TIMEOUT_S * 5
    while seen < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"Fetch returned {seen} of {count} records in time")
        request = consumer_fetch_request(
            {(topic, p): o for p, o in positions.items()},
            max_wait_ms=100,
            min_bytes=1,
            max_bytes=50 << 20,
            partition_max_bytes=FETCH_PARTITION_MAX_BYTES,
        )
        resp = stub.Fetch(request, timeout=RPC_TIMEOUT_S)
        for pr in resp.topics[0].partitions:
            for record in decode_batches(pr.records):
                if record.offset >= positions[pr.partition]:
                    positions[pr.partition] = record.offset + 1
                    seen += 1 if record.value else 0
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=200_000, help="records per path per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--bootstrap", help="the gateway of a running cluster (default: start one)")
    args = parser.parse_args()
    result: dict[str, object] = common.header()
    runs: dict[str, list[float]] = {
        "produce_record_level": [],
        "produce_batch_level": [],
        "consume_record_level": [],
        "consume_batch_level": [],
    }
    with common.highwater_target(
        bootstrap=args.bootstrap,
        topic="bench-rl-warm",
        partitions=PARTITIONS,
        replication_factor=3,
        min_insync=2,
    ) as target:
        channel = grpc.insecure_channel(
            target.gateway,
            options=[
                ("grpc.max_receive_message_length", 64 << 20),
                ("grpc.max_send_message_length", 64 << 20),
            ],
        )
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)  # type: ignore[no-untyped-call]  # generated, unannotated
        load_before = common.load_average()
        for round_ in range(args.rounds):
            for path in ("record_level", "batch_level"):
                topic = f"bench-rl-{path}-{round_}-{int(time.time())}"
                common.create_topic(
                    target.gateway, topic, partitions=PARTITIONS, replication_factor=3, min_insync=2
                )
                records = _records(args.records, round_)
                produce = produce_record_level if path == "record_level" else produce_batch_level
                consume = consume_record_level if path == "record_level" else consume_batch_level
                runs[f"produce_{path}"].append(produce(stub, topic, records))
                runs[f"consume_{path}"].append(consume(stub, topic, args.records))
                print(
                    f"round {round_} {path}: produce {runs[f'produce_{path}'][-1]:,.0f} records/s, "
                    f"consume {runs[f'consume_{path}'][-1]:,.0f} records/s",
                    flush=True,
                )
        channel.close()
    result.update(
        records_per_round=args.records,
        rounds=args.rounds,
        request_records=REQUEST_RECORDS,
        in_flight=IN_FLIGHT,
        value_bytes=VALUE_BYTES,
        partitions=PARTITIONS,
        runs=runs,
        best={k: max(v) for k, v in runs.items()},
        load_before=load_before,
        load_after=common.load_average(),
    )
    result_path = common.write_result("record_level", result)
    for name, values in runs.items():
        print(
            f"{name:22s} best {max(values):>10,.0f} records/s  (runs: "
            f"{', '.join(f'{v:,.0f}' for v in values)})"
        )
    print(f"load {load_before:.1f} -> {result['load_after']:.1f}; written to {result_path}")


if __name__ == "__main__":
    main()
