"""Storage engine benchmark: the partition log against the disk it runs on, measured in one run.

Figures (each the median of --repeat runs, ratios taken within each run):
- raw disk write: 1 MiB os.write calls to a file in the same directory, one fsync at the end,
  measured right before each append run (the shared disk's speed drifts);
- append throughput: Log.append_as_leader of prebuilt batches of 100-byte records, 16 KiB
  and 1 MiB batches, one flush (fsync) at the end, as a ratio of the raw disk speed
  (target >= 60% for 1 MiB batches);
- sequential read from page cache: Log.read over the whole log, 1 MiB per call (target >= 1 GB/s);
- index lookup: Log.locate at random offsets (index binary search + short scan), and a full
  Log.read of the batch at a random offset, in microseconds;
- recovery scan: Log.open after an unclean stop with the recovery point at 0, so every
  batch's length and CRC is checked and every index rebuilt (target >= 300 MB/s).

A script, not a test: `python bench/log_bench.py --help`. Writes bench/results/log_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common
from clients.common.records import codec_is_accelerated, encode_values
from services.broker.log import Log, LogConfig
from services.broker.log.checkpoints import RECOVERY_POINT_CHECKPOINT
from services.broker.log.file_storage import FileStorage

MIB = 1024 * 1024
RECORD_BYTES = 100


def machine() -> dict[str, object]:
    memory_bytes = 0
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    memory_bytes = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(memory_bytes / 2**30, 1),
        "cpu": common.cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "codec_accelerated": codec_is_accelerated(),
    }


def make_batch(target_bytes: int) -> bytes:
    """One uncompressed batch of 100-byte records, as long as fits in target_bytes."""
    per_record = len(encode_values([b"x" * RECORD_BYTES] * 100, timestamp_ms=0)) / 100
    count = max(1, int((target_bytes - 61) / per_record))
    while True:
        values = [os.urandom(RECORD_BYTES) for _ in range(count)]
        batch = encode_values(values, timestamp_ms=1_700_000_000_000)
        if len(batch) <= target_bytes or count == 1:
            return batch
        count -= max(1, int((len(batch) - target_bytes) / per_record))


def raw_disk_write(directory: Path, total_bytes: int) -> float:
    """MB/s of 1 MiB writes plus one fsync at the end."""
    path = directory / "raw-disk-probe"
    chunk = os.urandom(MIB)
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(total_bytes // MIB):
            os.write(fd, chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - start
    path.unlink()
    return total_bytes / elapsed / 1e6


def append_run(directory: Path, batch: bytes, total_bytes: int, config: LogConfig) -> tuple[float, Log]:
    """MB/s of appending `batch` until total_bytes, with one flush at the end."""
    log = Log.open(directory, config, storage=FileStorage(), now_ms=0)
    count = max(1, total_bytes // len(batch))
    start = time.perf_counter()
    for i in range(count):
        log.append_as_leader(batch, leader_epoch=0, now_ms=i)
    log.flush(now_ms=count)
    elapsed = time.perf_counter() - start
    return count * len(batch) / elapsed / 1e6, log


def sequential_read(log: Log) -> float:
    """MB/s reading the whole log front to back, 1 MiB per read (page cache)."""
    offset = log.log_start_offset
    end = log.log_end_offset
    total = 0
    start = time.perf_counter()
    while offset < end:
        fetched = log.read(offset, max_bytes=MIB)
        total += len(fetched.records)
        offset = fetched.next_offset
    elapsed = time.perf_counter() - start
    return total / elapsed / 1e6


def lookups(log: Log, samples: int, rng: random.Random) -> tuple[float, float, float]:
    """(median µs, p99 µs) of Log.locate and median µs of a one-batch Log.read at random offsets."""
    end = log.log_end_offset
    offsets = [rng.randrange(log.log_start_offset, end) for _ in range(samples)]
    locate_us: list[float] = []
    for offset in offsets:
        start = time.perf_counter()
        log.locate(offset)
        locate_us.append((time.perf_counter() - start) * 1e6)
    read_us: list[float] = []
    for offset in offsets:
        start = time.perf_counter()
        log.read(offset, max_bytes=1)
        read_us.append((time.perf_counter() - start) * 1e6)
    locate_us.sort()
    return statistics.median(locate_us), locate_us[int(len(locate_us) * 0.99)], statistics.median(read_us)


def recovery_scan(directory: Path, config: LogConfig, log: Log) -> tuple[float, int]:
    """MB/s of an unclean open that scans every segment (recovery point forced to 0)."""
    size = log.size_bytes
    log.abandon()
    (directory / RECOVERY_POINT_CHECKPOINT).write_text("0\n1\n0\n")
    start = time.perf_counter()
    recovered = Log.open(directory, config, storage=FileStorage(), now_ms=0)
    elapsed = time.perf_counter() - start
    report = recovered.recovery_report
    assert report.bytes_scanned == size and report.bytes_dropped == 0, report
    recovered.abandon()
    return size / elapsed / 1e6, report.segments_recovered


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a new temp dir)")
    parser.add_argument("--total-mib", type=int, default=512, help="bytes written per append run, MiB")
    parser.add_argument(
        "--segment-mib", type=int, default=128, help="segment_bytes of the benchmark log, MiB"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure; the median is reported")
    parser.add_argument("--lookups", type=int, default=5_000, help="random offsets per lookup run")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random offsets")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "log_bench.json")
    return parser.parse_args()


def measure_run(
    run: int,
    base: Path,
    batches: tuple[bytes, bytes],
    total_bytes: int,
    config: LogConfig,
    lookup_count: int,
    rng: random.Random,
) -> dict[str, float]:
    """One run of every figure (16 KiB and 1 MiB batches), printed on one line; its logs are removed."""
    batch_16k, batch_1m = batches
    # Raw speed right before each append run: the shared disk drifts within minutes.
    raw_before_16k = raw_disk_write(base, total_bytes)
    directory_16k = base / f"bench-16k-{run}"
    append_16k, log_16k = append_run(directory_16k, batch_16k, total_bytes, config)
    raw_before_1m = raw_disk_write(base, total_bytes)
    directory_1m = base / f"bench-1m-{run}"
    append_1m, log_1m = append_run(directory_1m, batch_1m, total_bytes, config)
    raw = (raw_before_16k + raw_before_1m) / 2
    read = sequential_read(log_16k)
    locate_median, locate_p99, read_one = lookups(log_16k, lookup_count, rng)
    recovery, _ = recovery_scan(directory_16k, config, log_16k)
    log_1m.abandon()
    shutil.rmtree(directory_16k)
    shutil.rmtree(directory_1m)
    print(
        f"run {run + 1}: raw {raw_before_16k:.0f} MB/s, append 16 KiB {append_16k:.0f} MB/s "
        f"({append_16k / raw_before_16k:.0%}) | raw {raw_before_1m:.0f} MB/s, append 1 MiB "
        f"{append_1m:.0f} MB/s ({append_1m / raw_before_1m:.0%}) | read {read:.0f} MB/s "
        f"| locate {locate_median:.1f} µs (p99 {locate_p99:.1f}) | read one batch {read_one:.1f} µs "
        f"| recovery {recovery:.0f} MB/s"
    )
    return {
        "raw_disk_mb_s": raw,
        "append_16k_mb_s": append_16k,
        "append_1m_mb_s": append_1m,
        "ratio_16k": append_16k / raw_before_16k,
        "ratio_1m": append_1m / raw_before_1m,
        "read_mb_s": read,
        "locate_median_us": locate_median,
        "locate_p99_us": locate_p99,
        "read_one_batch_median_us": read_one,
        "recovery_mb_s": recovery,
    }


def report(repeat: int, medians: dict[str, float], records_16k: int) -> None:
    print()
    print(f"median of {repeat} runs:")
    print(f"  raw disk write (1 MiB writes + fsync)    {medians['raw_disk_mb_s']:8.0f} MB/s")
    print(
        f"  append, 16 KiB batches (~{records_16k} records) {medians['append_16k_mb_s']:8.0f} MB/s  "
        f"{medians['ratio_16k']:.0%} of raw"
    )
    print(
        f"  append, 1 MiB batches                    {medians['append_1m_mb_s']:8.0f} MB/s  "
        f"{medians['ratio_1m']:.0%} of raw (target >= 60%)"
    )
    print(f"  sequential read, page cache              {medians['read_mb_s']:8.0f} MB/s  (target >= 1000)")
    print(
        f"  index lookup (locate), random offsets    {medians['locate_median_us']:8.1f} µs median, "
        f"{medians['locate_p99_us']:.1f} µs p99"
    )
    print(f"  read of one batch at a random offset     {medians['read_one_batch_median_us']:8.1f} µs median")
    print(f"  recovery scan (CRC + index rebuild)      {medians['recovery_mb_s']:8.0f} MB/s  (target >= 300)")


def main() -> None:
    args = parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="log-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    total_bytes = args.total_mib * MIB
    # Default max_message_bytes (1 MiB + 12, as Kafka): the 1 MiB batch is the largest a producer may send.
    config = LogConfig(segment_bytes=args.segment_mib * MIB, retention_ms=-1)
    rng = random.Random(args.seed)
    info = machine()
    print(f"machine: {info['cores']} cores, {info['memory_gib']} GiB, {info['cpu']}, Python {info['python']}")
    print(
        f"codec accelerated: {info['codec_accelerated']}; {args.total_mib} MiB per run, {args.repeat} runs, "
        f"dir {base}"
    )

    batch_16k = make_batch(16 * 1024)
    batch_1m = make_batch(MIB)
    runs: dict[str, list[float]] = {
        key: []
        for key in (
            "raw_disk_mb_s",
            "append_16k_mb_s",
            "append_1m_mb_s",
            "ratio_16k",
            "ratio_1m",
            "read_mb_s",
            "locate_median_us",
            "locate_p99_us",
            "read_one_batch_median_us",
            "recovery_mb_s",
        )
    }
    try:
        for run in range(args.repeat):
            figures = measure_run(run, base, (batch_16k, batch_1m), total_bytes, config, args.lookups, rng)
            for key, value in figures.items():
                runs[key].append(value)
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)

    medians = {key: round(statistics.median(values), 3) for key, values in runs.items()}
    report(args.repeat, medians, records_16k=len(batch_16k) // (RECORD_BYTES + 8))

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "machine": info,
                "settings": {
                    "total_mib": args.total_mib,
                    "segment_mib": args.segment_mib,
                    "repeat": args.repeat,
                    "batch_16k_bytes": len(batch_16k),
                    "batch_1m_bytes": len(batch_1m),
                    "record_bytes": RECORD_BYTES,
                },
                "median": medians,
                "runs": runs,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
