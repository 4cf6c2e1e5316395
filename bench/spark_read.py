"""Spark batch read rate of the connector, next to Spark reading the same records from Parquet.

Loads N records of 100-byte values (default 10,000,000) into a topic of a local
3-broker cluster (raw Produce of big encode_values batches, acks=1), writes the same
rows (the connector's schema) to a Parquet file, then times the same Spark job on a
local[2] session over each:

    df.agg(count(*), sum(length(value)), max(offset))

The figure is rows/s of each and their ratio (measured in one run, as FACTS.md
advises on this shared machine). Targets: >= 1,500,000 rows/s and >= 50% of Parquet.
`--profile` also times one task's work outside Spark (Fetch only, + decode, + Arrow)
to show what bounds the rate.

Usage: python bench/spark_read.py --help
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
TOPIC = "spark-bench"
# One Produce carries this much per partition: big requests keep per-RPC cost out of the load.
LOAD_REQUEST_BYTES = 8 * 1024 * 1024
# Records per encoded batch: ~500 KiB of 100-byte values, under the broker's 1 MiB max.message.bytes.
LOAD_BATCH_RECORDS = 5_000
PARQUET_ROW_GROUP_ROWS = 1_000_000
TARGET_ROWS_PER_S = 1_500_000
TARGET_RATIO = 0.5


def machine() -> dict[str, Any]:
    mem_kib = 0
    try:
        with open("/proc/meminfo") as f:
            mem_kib = int(f.readline().split()[1])
    except OSError:
        pass
    return {"cores": os.cpu_count(), "memory_gib": round(mem_kib / 2**20, 1), "python": platform.python_version(),
            "machine": platform.machine(), "load_average": os.getloadavg()}


def load_topic(bootstrap: str, records: int, partitions: int, value_bytes: int, replication_factor: int) -> float:
    """Create the topic and fill it round-robin; returns seconds taken."""
    import grpc

    from clients.admin import Admin
    from clients.connection import CHANNEL_OPTIONS
    from clients.records import encode_values
    from protos.highwater.v1 import common_pb2, gateway_pb2_grpc

    with Admin(bootstrap) as admin:
        admin.create_topics(TOPIC, partitions, replication_factor)
    stub = gateway_pb2_grpc.GatewayServiceStub(grpc.insecure_channel(bootstrap.split(",")[0], options=CHANNEL_OPTIONS))
    started = time.perf_counter()
    per_request = max(LOAD_REQUEST_BYTES // (LOAD_BATCH_RECORDS * value_bytes), 1)
    left = records
    now_ms = int(time.time() * 1000)
    while left > 0:
        topics = []
        parts = []
        for p in range(partitions):
            batches = []
            for _ in range(per_request):
                n = min(LOAD_BATCH_RECORDS, left)
                if n <= 0:
                    break
                blob = os.urandom(n * value_bytes)
                values = [blob[i:i + value_bytes] for i in range(0, len(blob), value_bytes)]
                batches.append(encode_values(values, timestamp_ms=now_ms))
                left -= n
            if batches:
                parts.append(common_pb2.ProducePartitionData(partition=p, records=b"".join(batches)))
        topics.append(common_pb2.ProduceTopicData(topic=TOPIC, partitions=parts))
        response = stub.Produce(common_pb2.ProduceRequest(acks=1, timeout_ms=60_000, topics=topics), timeout=120)
        for t in response.topics:
            for pr in t.partitions:
                if pr.error_code != common_pb2.NONE:
                    raise RuntimeError(f"load: Produce to {t.topic}-{pr.partition} failed: {pr.error_message}")
    return time.perf_counter() - started


def write_parquet(spark: Any, bootstrap: str, path: Path) -> float:
    """The topic's records, as the connector reads them, into one Parquet dataset (via pyarrow)."""
    import pyarrow.parquet as pq

    from spark_connector.gateway import GatewayClient
    from spark_connector.options import ClientSettings
    from spark_connector.planning import OffsetRange
    from spark_connector.reader import read_range
    from spark_connector.schema import arrow_schema

    started = time.perf_counter()
    options = _read_options(bootstrap)
    with GatewayClient(bootstrap, ClientSettings()) as client, \
            pq.ParquetWriter(path, arrow_schema(False), compression="snappy") as writer:
        ends = client.list_offsets({(TOPIC, p): -1 for p in client.partitions([TOPIC])[TOPIC] or []})
        for (topic, p), (end, _) in sorted(ends.items()):
            pending = []
            rows = 0
            for batch in read_range(client, OffsetRange(topic, p, 0, end), options):
                pending.append(batch)
                rows += batch.num_rows
                if rows >= PARQUET_ROW_GROUP_ROWS:
                    writer.write_batch(_concat(pending))
                    pending, rows = [], 0
            if pending:
                writer.write_batch(_concat(pending))
    return time.perf_counter() - started


def _concat(batches: list[Any]) -> Any:
    import pyarrow as pa

    return pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def _read_options(bootstrap: str) -> Any:
    from spark_connector.options import parse_read_options

    return parse_read_options({"bootstrap": bootstrap, "subscribe": TOPIC}, streaming=False)


def timed_job(df: Any) -> tuple[float, int]:
    from pyspark.sql import functions as F

    started = time.perf_counter()
    row = df.agg(F.count("*").alias("n"), F.sum(F.length("value")).alias("bytes"), F.max("offset")).collect()[0]
    return time.perf_counter() - started, int(row["n"])


def profile_task(bootstrap: str) -> dict[str, float]:
    """One partition read outside Spark: Fetch only, Fetch + decode, Fetch + decode + Arrow (records/s)."""
    from clients.consumer import next_fetch_offset
    from clients.records import decode_batches
    from spark_connector.gateway import GatewayClient
    from spark_connector.options import ClientSettings
    from spark_connector.planning import OffsetRange
    from spark_connector.reader import read_range

    out: dict[str, float] = {}
    with GatewayClient(bootstrap, ClientSettings()) as client:
        (end, _), = client.list_offsets({(TOPIC, 0): -1}).values()
        started = time.perf_counter()
        offset, chunks = 0, []
        while offset < end:
            part = client.call("Fetch", client.fetch_request((TOPIC, 0), offset, ClientSettings().fetch_max_bytes))
            part = part.topics[0].partitions[0]
            chunks.append(part.records)
            offset = next_fetch_offset(part.records, offset) or end
        fetch_s = time.perf_counter() - started
        started = time.perf_counter()
        decoded = sum(len(list(decode_batches(c))) for c in chunks)
        decode_s = time.perf_counter() - started
        started = time.perf_counter()
        rows = sum(b.num_rows for b in read_range(client, OffsetRange(TOPIC, 0, 0, end), _read_options(bootstrap)))
        full_s = time.perf_counter() - started
    out["records"] = rows
    out["fetch_only_records_per_s"] = round(decoded / fetch_s)
    out["decode_only_records_per_s"] = round(decoded / decode_s)
    out["read_range_records_per_s"] = round(rows / full_s)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000_000, help="records to load (default 10,000,000)")
    parser.add_argument("--value-bytes", type=int, default=100, help="bytes per value (default 100)")
    parser.add_argument("--partitions", type=int, default=6, help="topic partitions (default 6)")
    parser.add_argument("--replication-factor", type=int, default=1,
                        help="replication factor of the bench topic (default 1: reads touch leaders only, and "
                             "loading 3 copies costs minutes on 2 cores)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each job (default 3)")
    parser.add_argument("--min-partitions", type=int, default=None, help="connector minPartitions option")
    parser.add_argument("--profile", action="store_true", help="also time one partition's read outside Spark")
    parser.add_argument("--json", type=Path, default=RESULTS / "spark_read.json", help="where to write results")
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Spark binds to the host's first non-loopback address unless told: keep it on 127.0.0.1.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from clients.local_cluster import LocalCluster
    from spark_connector import register

    base = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    cluster = LocalCluster(base / "cluster", brokers=3)
    cluster.start()
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "machine": machine(), "args": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    try:
        bootstrap = cluster.gateway_address
        load_s = load_topic(bootstrap, args.records, args.partitions, args.value_bytes, args.replication_factor)
        print(f"loaded {args.records:,} records in {load_s:.1f} s ({args.records / load_s:,.0f} records/s)")
        spark = (SparkSession.builder.master("local[2]").appName("highwater-spark-bench")
                 .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
                 .config("spark.driver.memory", "2g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        parquet = base / "records.parquet"
        parquet_s = write_parquet(spark, bootstrap, parquet)
        print(f"wrote the same records to {parquet} in {parquet_s:.1f} s")

        reader = spark.read.format("highwater").option("bootstrap", bootstrap).option("subscribe", TOPIC)
        if args.min_partitions:
            reader = reader.option("minPartitions", str(args.min_partitions))
        runs: dict[str, list[float]] = {"highwater": [], "parquet": []}
        for _ in range(args.repeat):  # interleaved, so both see the same neighbours
            for name, df in (("highwater", reader.load()), ("parquet", spark.read.parquet(str(parquet)))):
                seconds, n = timed_job(df)
                if n != args.records:
                    raise RuntimeError(f"{name} read {n} records, expected {args.records}")
                runs[name].append(args.records / seconds)
                print(f"  {name:9s} {args.records / seconds:12,.0f} rows/s ({seconds:.2f} s)")
        spark.stop()
        best = {name: max(rates) for name, rates in runs.items()}
        median = {name: statistics.median(rates) for name, rates in runs.items()}
        ratio = best["highwater"] / best["parquet"]
        result.update({"load_s": round(load_s, 1), "rows_per_s": {n: [round(r) for r in rs] for n, rs in runs.items()},
                       "best_rows_per_s": {n: round(r) for n, r in best.items()},
                       "median_rows_per_s": {n: round(r) for n, r in median.items()},
                       "ratio_best": round(ratio, 3),
                       "ratio_median": round(median["highwater"] / median["parquet"], 3)})
        print(f"highwater best {best['highwater']:,.0f} rows/s (target {TARGET_ROWS_PER_S:,}), parquet best "
              f"{best['parquet']:,.0f} rows/s, ratio {ratio:.0%} (target {TARGET_RATIO:.0%})")
        if args.profile:
            result["profile_one_partition"] = profile_task(bootstrap)
            print("one partition outside Spark:", result["profile_one_partition"])
    finally:
        cluster.stop()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results in {args.json}")


if __name__ == "__main__":
    main()
