"""The client alone: records/s one Producer thread can batch and encode, and a Consumer can decode.

No server is involved, so the figure is the ceiling the client puts on every
cluster benchmark (issue: Fetch gateway and clients; target: at least
1,000,000 records/s encoded by one producer thread, 100-byte records).

- encode: the Producer's bulk path (send_batch's work: check, cut into
  per-partition batches, drain, encode with the compiled RecordBatch codec),
  single thread, no I/O.
- decode: clients.common.records.decode_batches over the same batches (what
  Consumer.poll does per fetched partition), CRC checked.

Usage: python bench/client_bench.py [--records N] [--value-bytes B] [--compression zstd]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/client_bench.py` from anywhere

from bench import common
from clients.common import records
from clients.config import ProducerConfig
from clients.metadata import TopicInfo
from clients.producer import _ProducerCore
from clients.sender import encode_producer_batch
from clients.types import TopicPartition
from protos.highwater.v1 import common_pb2

ENCODE_TARGET_RECORDS_PER_S = 1_000_000


def encode(values: list[bytes], rounds: int, compression: str) -> tuple[float, list[bytes]]:
    """Records/s through the Producer's bulk path, and the batches it made."""
    loop = asyncio.new_event_loop()
    batches: list[bytes] = []
    try:
        core = _ProducerCore(
            ProducerConfig(buffer_memory_bytes=1 << 31, compression=compression),
            loop,
            wake=lambda: None,
            on_batch_done=lambda: None,
        )
        info = TopicInfo(
            "t",
            "id",
            (0, 1, 2),
            (0, 1, 2),
            common_pb2.TopicMetadata(name="t"),
            0,
            tuple(TopicPartition("t", p) for p in range(3)),
        )
        sink = type("Sink", (), {"settle": lambda *args: None})()
        encoded = 0
        started = time.perf_counter()
        for _ in range(rounds):
            _, runs, prepared, headers = core.prepare_runs(info, values, None, None, None, None)
            run_key, all_values, run_timestamp_ms = prepared
            for tp, start, end, size in runs:
                run = (run_key, all_values[start:end], run_timestamp_ms)
                core.try_append_run(tp, run, headers, size, sink, start)
            ready, _ = core.accumulator.ready(10**12, set())
            while ready:
                for batch in core.accumulator.drain(ready, core.config.max_request_bytes):
                    batches.append(encode_producer_batch(batch, compression))
                    encoded += batch.record_count
                    core.accumulator.complete(batch)
                ready, _ = core.accumulator.ready(10**12, set())
        elapsed = time.perf_counter() - started
    finally:
        loop.close()
    return encoded / elapsed, batches


def decode(batches: list[bytes]) -> float:
    started = time.perf_counter()
    count = 0
    for b in batches:
        for _ in records.decode_batches(b):
            count += 1
    return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--records", type=int, default=2_000_000, help="records per measurement")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    parser.add_argument("--runs", type=int, default=3, help="measurements; the median is reported")
    args = parser.parse_args()
    values = [b"x" * args.value_bytes] * 10_000
    rounds = max(1, args.records // len(values))
    encode_rates, decode_rates = [], []
    for _ in range(args.runs):
        rate, batches = encode(values, rounds, args.compression)
        encode_rates.append(rate)
        decode_rates.append(decode(batches))
    enc = sorted(encode_rates)[len(encode_rates) // 2]
    dec = sorted(decode_rates)[len(decode_rates) // 2]
    print(f"machine: {common.machine()}  load average {common.load_average():.1f}")
    print(f"accelerated codec: {records.codec_is_accelerated()}")
    print(
        f"encode (Producer bulk path, 1 thread): {enc:,.0f} records/s  "
        f"(target {ENCODE_TARGET_RECORDS_PER_S:,}, ratio {enc / ENCODE_TARGET_RECORDS_PER_S:.2f})"
    )
    print(f"decode (decode_batches, CRC checked):  {dec:,.0f} records/s")
    common.write_result(
        "client_bench",
        {
            **common.header(),
            "value_bytes": args.value_bytes,
            "compression": args.compression,
            "encode_records_per_s": enc,
            "decode_records_per_s": dec,
            "encode_runs": encode_rates,
            "decode_runs": decode_rates,
        },
    )


if __name__ == "__main__":
    main()
