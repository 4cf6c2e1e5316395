"""Spark batch read rate of the connector, next to Spark reading the same records from Parquet.

Loads N records of 100-byte values (default 10,000,000) into a topic of a local
3-broker cluster (raw Produce of big encode_values batches, acks=1), writes the same
rows (the connector's schema) to a Parquet file, then times the same Spark job on a
local[2] session over each:

    df.agg(count(*), sum(length(value)), sum(coalesce(length(key), 0)), sum(length(topic)),
           sum(partition), max(offset), max(timestamp), max(timestampType))

Why every column: a Python data source cannot prune columns (read() hands Spark whole
rows of the schema), while Parquet's vectorised reader skips every column the query does
not name. A query over `value` and `offset` alone (this bench's first version) timed the
connector delivering 7 columns against Parquet decoding 2. Here both sides deliver all
seven Kafka columns to the same aggregation, so the ratio compares reading the same data.
Parquet's aggregate pushdown (statistics answering max/count) stays off, as it is by
default, and both sides must give the same aggregate row, which is checked.

A third side is the floor of any Python data source: `highwater_floor`, a trivial Python
data source with the same schema whose read() yields the very Arrow batches the connector
produced (written once to Arrow IPC files, one per partition, and memory-mapped: the pages
are in the page cache, so a task only hands buffers to Spark). It costs what the connector
cannot avoid, Spark's side of a Python data source (Arrow over the worker socket, every row
copied into an UnsafeRow) and the worker writing Arrow, and nothing of Highwater's. The
connector's rate is reported as a ratio of the floor's (goal >= 80%) beside the Parquet one.

The figure is rows/s of each and their ratios (measured in one run, interleaved, as
FACTS.md advises on this shared machine), with the 1-minute load average before each
job and the CPU each process used (cores: CPU seconds per wall second). Targets:
>= 1,500,000 rows/s, >= 80% of the floor, and (the earlier target) >= 50% of Parquet.

The connector runs with its defaults, so its tasks use short-circuit local reads (the
cluster is on this host): the leaders name where the records lie and the tasks pread them
from the segment files. `--reader-option highwater.local.reads=false` times the records
fetched over gRPC instead, as executors on other hosts get them.
`--profile` also times one partition's read
outside Spark (Fetch only, decode_batches, decode_columns, read_range) to show what
bounds the rate.

Usage: python bench/spark_read.py --help
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrameReader, SparkSession

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/spark_read.py` from anywhere

RESULTS = Path(__file__).resolve().parent / "results"
TOPIC = "spark-bench"
# One Produce carries this much per partition: big requests keep per-RPC cost out of the load.
LOAD_REQUEST_BYTES = 8 * 1024 * 1024
# Records per encoded batch: ~500 KiB of 100-byte values, under the broker's 1 MiB max.message.bytes.
LOAD_BATCH_RECORDS = 5_000
PARQUET_ROW_GROUP_ROWS = 1_000_000
TARGET_ROWS_PER_S = 1_500_000
TARGET_RATIO = 0.5
TARGET_FLOOR_RATIO = 0.8
FLOOR_SOURCE = "highwater_floor"


def descendants(pid: int) -> list[int]:
    """`pid` and every live process below it (Spark's JVM forks the Python worker daemon and workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


class JobCpu:
    """CPU seconds of the cluster's processes and of Spark (JVM + Python workers) over one job."""

    def __init__(self, cluster: Any, spark_pid: int) -> None:
        self.named = {p.name: p.pid for kind in ("gateway", "broker") for p in cluster.by_kind(kind) if p.pid}
        self.spark_pid = spark_pid

    def _sample(self) -> dict[str, float]:
        from bench.common import process_cpu_s

        out = {name: process_cpu_s(pid) or 0.0 for name, pid in self.named.items()}
        jvm, *workers = descendants(self.spark_pid)
        out["spark-jvm"] = process_cpu_s(jvm) or 0.0
        out["spark-python-workers"] = sum(process_cpu_s(p) or 0.0 for p in workers)
        out["this-driver"] = process_cpu_s(os.getpid()) or 0.0
        return out

    def __enter__(self) -> JobCpu:
        self._t0 = time.monotonic()
        self._before = self._sample()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.monotonic() - self._t0
        after = self._sample()
        # Python workers forked during the job count from zero (their start is not in _before).
        self.cores = {
            name: round(max(after[name] - self._before.get(name, 0.0), 0.0) / wall, 2) for name in after
        }
        self.cores["total"] = round(sum(self.cores.values()), 2)


def floor_source(directory: Path) -> Any:
    """The floor: a Python data source with the connector's schema, reading `directory`'s Arrow IPC
    files (one per topic partition, the connector's own batches) memory-mapped, one task each."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class FloorPartition(InputPartition):
        def __init__(self, index: int, path: str) -> None:
            super().__init__(index)
            self.path = path

    class FloorReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [FloorPartition(i, str(p)) for i, p in enumerate(sorted(directory.glob("*.arrow")))]

        def read(self, partition: InputPartition) -> Any:
            import gc

            import pyarrow as pa

            # As the connector's tasks do (spark_connector/worker.py): keep PySpark's gc.collect()
            # after each task from walking what the reused worker already holds.
            gc.freeze()
            if not isinstance(partition, FloorPartition):
                raise TypeError(f"the floor source reads its own partitions, not {partition!r}")
            with pa.memory_map(partition.path) as source:
                reader = pa.ipc.open_file(source)
                for i in range(reader.num_record_batches):
                    yield reader.get_batch(i)

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return FLOOR_SOURCE

        def schema(self) -> Any:
            from spark_connector.schema import read_schema

            return read_schema(False)

        def reader(self, schema: Any) -> DataSourceReader:
            return FloorReader()

    return FloorSource


def load_topic(
    bootstrap: str, records: int, partitions: int, value_bytes: int, replication_factor: int
) -> float:
    """Create the topic and fill it round-robin; returns seconds taken."""
    import grpc

    from clients.admin import Admin
    from clients.common.records import encode_values
    from clients.connection import CHANNEL_OPTIONS
    from protos.highwater.v1 import common_pb2, gateway_pb2_grpc

    with Admin(bootstrap) as admin:
        admin.create_topics(TOPIC, partitions, replication_factor)
    channel = grpc.insecure_channel(bootstrap.split(",")[0], options=CHANNEL_OPTIONS)
    stub = gateway_pb2_grpc.GatewayServiceStub(channel)  # type: ignore[no-untyped-call]  # generated, unannotated
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
                values = [blob[i : i + value_bytes] for i in range(0, len(blob), value_bytes)]
                batches.append(encode_values(values, timestamp_ms=now_ms))
                left -= n
            if batches:
                parts.append(common_pb2.ProducePartitionData(partition=p, records=b"".join(batches)))
        topics.append(common_pb2.ProduceTopicData(topic=TOPIC, partitions=parts))
        response = stub.Produce(
            common_pb2.ProduceRequest(acks=1, timeout_ms=60_000, topics=topics), timeout=120
        )
        for t in response.topics:
            for pr in t.partitions:
                if pr.error_code != common_pb2.NONE:
                    raise RuntimeError(
                        f"load: Produce to {t.topic}-{pr.partition} failed: {pr.error_message}"
                    )
    return time.perf_counter() - started


def write_parquet(spark: Any, bootstrap: str, path: Path, floor_dir: Path) -> float:
    """The topic's records, as the connector reads them, into one Parquet dataset (via pyarrow), and
    the same batches, as the connector yields them to Spark, into one Arrow IPC file per partition
    for the floor source."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_connector.gateway import GatewayClient
    from spark_connector.options import ClientSettings
    from spark_connector.planning import OffsetRange
    from spark_connector.reader import read_range
    from spark_connector.schema import arrow_schema

    started = time.perf_counter()
    options = _read_options(bootstrap)
    with (
        GatewayClient(bootstrap, ClientSettings()) as client,
        pq.ParquetWriter(path, arrow_schema(False), compression="snappy") as writer,
    ):
        ends = client.list_offsets({(TOPIC, p): -1 for p in client.partitions([TOPIC])[TOPIC] or []})
        floor_dir.mkdir(parents=True, exist_ok=True)
        for (topic, p), (end, _) in sorted(ends.items()):
            pending = []
            rows = 0
            with (
                pa.OSFile(str(floor_dir / f"{topic}-{p}.arrow"), "wb") as sink,
                pa.ipc.new_file(sink, arrow_schema(False)) as floor,
            ):
                for batch in read_range(client, OffsetRange(topic, p, 0, end), options):
                    floor.write_batch(batch)
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


def _read_options(bootstrap: str, *, local_reads: bool = True) -> Any:
    from spark_connector.options import parse_read_options

    return parse_read_options(
        {"bootstrap": bootstrap, "subscribe": TOPIC, "highwater.local.reads": str(local_reads).lower()},
        streaming=False,
    )


def timed_job(df: Any) -> tuple[float, dict[str, Any]]:
    """The bench query over every column of the Kafka schema; (seconds, the aggregate row)."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    row = df.agg(
        F.count("*").alias("n"),
        F.sum(F.length("value")).alias("value_bytes"),
        F.sum(F.coalesce(F.length("key"), F.lit(0))).alias("key_bytes"),
        F.sum(F.length("topic")).alias("topic_bytes"),
        F.sum("partition").alias("partition_sum"),
        F.max("offset").alias("offset_max"),
        F.max("timestamp").alias("timestamp_max"),
        F.max("timestampType").alias("timestamp_type_max"),
    ).collect()[0]
    return time.perf_counter() - started, row.asDict()


def profile_task(bootstrap: str) -> dict[str, float]:
    """One partition read outside Spark, one thread, in records/s: Fetch only, through the
    gateway, straight from the leader, and from the leader's file (short-circuit local read,
    what tasks do by default); decode_batches (a Record per record, the reader's old decoder)
    and decode_columns (its decoder now) over the fetched bytes; read_range (Fetch in flight
    + decode_columns + Arrow batch) with the bytes fetched and read locally, with this
    process's CPU per record."""
    from clients.common.record_batch import next_fetch_offset
    from clients.common.records import decode_batches
    from spark_connector.columnar import decode_columns
    from spark_connector.gateway import GatewayClient
    from spark_connector.options import ClientSettings
    from spark_connector.planning import OffsetRange
    from spark_connector.reader import read_range

    out: dict[str, float] = {}
    settings = ClientSettings()
    with GatewayClient(bootstrap, settings) as client:
        ((end, _),) = client.list_offsets({(TOPIC, 0): -1}).values()
        for path in ("gateway", "leader", "local"):
            started = time.perf_counter()
            offset, chunks = 0, []
            while offset < end:
                if path == "gateway":
                    response = client.call(
                        "Fetch", client.fetch_request((TOPIC, 0), offset, settings.fetch_max_bytes)
                    )
                    records = response.topics[0].partitions[0].records
                else:  # the leader's bytes over gRPC, or read from its file (short-circuit local read)
                    records = client.fetch_future(
                        (TOPIC, 0), offset, settings.fetch_max_bytes, locate=path == "local"
                    )().records
                chunks.append(records)
                offset = next_fetch_offset(records, offset) or end
            out[f"fetch_only_{path}_records_per_s"] = round(end / (time.perf_counter() - started))
        started = time.perf_counter()
        decoded = sum(len(list(decode_batches(c))) for c in chunks)
        out["decode_batches_records_per_s"] = round(decoded / (time.perf_counter() - started))
        started = time.perf_counter()
        columns = sum(len(cols) for c in chunks for cols in decode_columns(c))
        out["decode_columns_records_per_s"] = round(columns / (time.perf_counter() - started))
        if columns != decoded or decoded != end:
            raise RuntimeError(
                f"decode_columns gave {columns} records, decode_batches {decoded}, expected {end}"
            )
    for local_reads in (False, True):
        # read_range as a task runs it; CPU of this process only (the leader's is apart).
        options = _read_options(bootstrap, local_reads=local_reads)
        with GatewayClient(bootstrap, options.client) as client:
            started, cpu_started = time.perf_counter(), time.process_time()
            rows = sum(b.num_rows for b in read_range(client, OffsetRange(TOPIC, 0, 0, end), options))
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        name = "read_range_local" if local_reads else "read_range_fetched"
        out[f"{name}_records_per_s"] = round(rows / wall)
        out[f"{name}_reader_cpu_us_per_record"] = round(cpu / rows * 1e6, 3)
    out["records"] = rows
    return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--records", type=int, default=10_000_000, help="records to load (default 10,000,000)"
    )
    parser.add_argument("--value-bytes", type=int, default=100, help="bytes per value (default 100)")
    parser.add_argument("--partitions", type=int, default=6, help="topic partitions (default 6)")
    parser.add_argument(
        "--replication-factor",
        type=int,
        default=1,
        help="replication factor of the bench topic (default 1: reads touch leaders only, and "
        "loading 3 copies costs minutes on 2 cores)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each job (default 3)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed passes of each job first (default 1): the first connector pass loads "
        "numba's cached kernels and the JVM compiles the Arrow paths, which is not reading",
    )
    parser.add_argument("--min-partitions", type=int, default=None, help="connector minPartitions option")
    parser.add_argument(
        "--reader-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another option for format('highwater'), e.g. highwater.fetch.max.bytes=16777216",
    )
    parser.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another Spark setting for the session both sides share",
    )
    parser.add_argument("--profile", action="store_true", help="also time one partition's read outside Spark")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the temporary directory (cluster data, Parquet, the floor's files; ~3 GB at the "
        "defaults) instead of removing it at the end",
    )
    parser.add_argument(
        "--json", type=Path, default=RESULTS / "spark_read.json", help="where to write results"
    )
    return parser.parse_args()


def start_spark(spark_conf: list[str]) -> tuple[SparkSession, int]:
    """The local[2] session both sides share (with --spark-conf's settings) and its JVM's pid."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("highwater-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        # Default false; said explicitly because with it Parquet would answer the
        # max()/count() from file statistics without reading the rows.
        .config("spark.sql.parquet.aggregatePushdown", "false")
    )
    for setting in spark_conf:
        key, _, value = setting.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    gateway = spark.sparkContext._gateway
    if gateway is None:
        raise SystemExit(
            "spark_read: the SparkSession has no py4j gateway (a remote session?), so the CPU of its "
            "JVM cannot be measured; run with a local session"
        )
    return spark, gateway.proc.pid  # spark-submit execs the JVM


def connector_reader(spark: SparkSession, bootstrap: str, args: argparse.Namespace) -> DataFrameReader:
    """format("highwater") on the bench topic with --min-partitions and --reader-option."""
    reader = spark.read.format("highwater").option("bootstrap", bootstrap).option("subscribe", TOPIC)
    if args.min_partitions:
        reader = reader.option("minPartitions", str(args.min_partitions))
    for setting in args.reader_option:
        key, _, value = setting.partition("=")
        reader = reader.option(key, value)
    return reader


def timed_passes(
    spark: SparkSession,
    reader: DataFrameReader,
    parquet: Path,
    job_cpu: Callable[[], JobCpu],
    args: argparse.Namespace,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """--warmup untimed passes, then --repeat timed ones of the three sides interleaved, printed as
    they go: (each side's runs, each side's aggregate row). Raises RuntimeError when a side reads
    a count other than --records."""
    from bench.common import load_average

    runs: dict[str, list[dict[str, Any]]] = {"highwater": [], "floor": [], "parquet": []}
    answers: dict[str, dict[str, Any]] = {}
    for _ in range(args.warmup):
        for df in (
            reader.load(),
            spark.read.format(FLOOR_SOURCE).load(),
            spark.read.parquet(str(parquet)),
        ):
            timed_job(df)
    for _ in range(args.repeat):  # interleaved, so all three see the same neighbours
        for name, df in (
            ("highwater", reader.load()),
            ("floor", spark.read.format(FLOOR_SOURCE).load()),
            ("parquet", spark.read.parquet(str(parquet))),
        ):
            load_before = load_average()
            with job_cpu() as cpu:
                seconds, row = timed_job(df)
            if row["n"] != args.records:
                raise RuntimeError(f"{name} read {row['n']} records, expected {args.records}")
            answers[name] = row
            # CPU µs per row holds better than rows/s on a shared machine (bench/common.py).
            us_per_row = {k: round(v * seconds / args.records * 1e6, 3) for k, v in cpu.cores.items()}
            runs[name].append(
                {
                    "rows_per_s": round(args.records / seconds),
                    "seconds": round(seconds, 2),
                    "load_1m_before": load_before,
                    "cores": cpu.cores,
                    "cpu_us_per_row": us_per_row,
                }
            )
            print(
                f"  {name:9s} {args.records / seconds:12,.0f} rows/s ({seconds:.2f} s, load "
                f"{load_before}); "
                "CPU µs/row: " + ", ".join(f"{k} {v:.2f}" for k, v in us_per_row.items() if v >= 0.005),
                flush=True,
            )
    return runs, answers


def rate_figures(runs: dict[str, list[dict[str, Any]]], answers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The rates, bests, medians and ratios of the timed passes, printed on one line."""
    from bench.common import load_average

    rates = {name: [r["rows_per_s"] for r in rs] for name, rs in runs.items()}
    best = {name: max(r) for name, r in rates.items()}
    median = {name: statistics.median(r) for name, r in rates.items()}
    ratio = best["highwater"] / best["parquet"]
    floor_ratio = best["highwater"] / best["floor"]
    # Per pass: the connector against the floor pass right after it (same neighbours).
    pass_ratios = [
        round(h["rows_per_s"] / f["rows_per_s"], 3)
        for h, f in zip(runs["highwater"], runs["floor"], strict=True)
    ]
    figures = {
        "runs": runs,
        "rows_per_s": rates,
        "best_rows_per_s": best,
        "median_rows_per_s": {n: round(r) for n, r in median.items()},
        "floor_ratio_best": round(floor_ratio, 3),
        "floor_ratio_median": round(median["highwater"] / median["floor"], 3),
        "floor_ratio_per_pass": pass_ratios,
        "ratio_best": round(ratio, 3),
        "ratio_median": round(median["highwater"] / median["parquet"], 3),
        "aggregate_row": {k: str(v) for k, v in answers["highwater"].items()},
        "load_1m_after": load_average(),
    }
    print(
        f"highwater best {best['highwater']:,.0f} rows/s (target {TARGET_ROWS_PER_S:,}), "
        f"median {median['highwater']:,.0f}; parquet best {best['parquet']:,.0f} rows/s, "
        f"median {median['parquet']:,.0f}; ratio best {ratio:.0%}, median "
        f"{median['highwater'] / median['parquet']:.0%} (target {TARGET_RATIO:.0%}); "
        f"floor best {best['floor']:,.0f} rows/s, median {median['floor']:,.0f}; connector / floor: best "
        f"{floor_ratio:.0%}, median {median['highwater'] / median['floor']:.0%}, per pass "
        f"{', '.join(f'{r:.0%}' for r in pass_ratios)} (goal {TARGET_FLOOR_RATIO:.0%}); "
        f"load {load_average()} (/proc/loadavg: {_loadavg()})"
    )
    return figures


def main() -> None:
    args = parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Spark binds to the host's first non-loopback address unless told: keep it on 127.0.0.1.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from bench.common import machine, versions
    from services.launcher.local_cluster import LocalCluster
    from spark_connector import register

    base = Path(tempfile.mkdtemp(prefix="spark-bench-"))
    cluster = LocalCluster(base / "cluster", brokers=3)
    cluster.start()
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine(),
        "versions": {**versions(), **_spark_versions()},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    try:
        bootstrap = cluster.gateway_address
        load_s = load_topic(
            bootstrap, args.records, args.partitions, args.value_bytes, args.replication_factor
        )
        print(f"loaded {args.records:,} records in {load_s:.1f} s ({args.records / load_s:,.0f} records/s)")
        spark, spark_pid = start_spark(args.spark_conf)
        register(spark)
        parquet = base / "records.parquet"
        floor_dir = base / "floor"
        parquet_s = write_parquet(spark, bootstrap, parquet, floor_dir)
        print(f"wrote the same records to {parquet} and {floor_dir} in {parquet_s:.1f} s")
        spark.dataSource.register(floor_source(floor_dir))

        reader = connector_reader(spark, bootstrap, args)
        runs, answers = timed_passes(spark, reader, parquet, lambda: JobCpu(cluster, spark_pid), args)
        spark.stop()
        if not answers["highwater"] == answers["floor"] == answers["parquet"]:
            raise RuntimeError(f"the three sides disagree: {answers}")
        result["load_s"] = round(load_s, 1)
        result.update(rate_figures(runs, answers))
        if args.profile:
            result["profile_one_partition"] = profile_task(bootstrap)
            print("one partition outside Spark:", result["profile_one_partition"])
    finally:
        cluster.stop()
        if args.keep:
            print(f"kept the cluster's data, the Parquet file and the floor's Arrow files in {base}")
        else:
            # ~3 GB a run at the defaults (the log, Parquet, the floor's Arrow IPC files).
            shutil.rmtree(base, ignore_errors=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results in {args.json}")


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return f.read().strip()


def _spark_versions() -> dict[str, str | None]:
    import importlib.metadata

    out: dict[str, str | None] = {}
    for name in ("pyspark", "pyarrow", "numba", "numpy"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


if __name__ == "__main__":
    main()
