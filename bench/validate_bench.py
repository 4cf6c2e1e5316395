"""What the leader's record check costs on the produce path (issue 17), per MiB of batch.

For batches of 100-byte records (16 KiB, Kafka's default batch.size, and 1 MiB, the
default max.message.bytes), measured in one run, as CPU time of this process (user +
system, so a shared machine's other load counts less than in wall time):

- validation: services/common/record_validation.validate_records on one batch (header
  checks are already done by validate_batches, as on the broker);
- leader append without it: Partition.append_as_leader on a real Log in a temporary
  directory, with validate_records replaced by a no-op (the produce path before issue 17:
  header and CRC checks, offsets, the write to the segment file and its indexes);
- the ratio of the two, and the same append with the check in place.

The broker's whole produce path costs more than the append (gRPC, protobuf, purgatory,
replication: ~0.5 µs of broker CPU per 100-byte record in bench/RESULTS.md, ~4.8 ms per
MiB), so the ratio against the append alone overstates the share of the produce path;
both are printed. Compressed batches (--codecs) are measured too: they add a bounded
decompression. Runs alternate with and without the check so drift hits both alike.

A script, not a test: `python bench/validate_bench.py --help`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import services.broker.partition as partition_module
from clients.common.record_batch import validate_batches
from clients.common.record_validation import TimestampRules, validate_records
from clients.common.records import encode_values
from services.broker.log import Log, LogConfig
from services.broker.log.file_storage import FileStorage
from services.broker.partition import LeaderAndIsrState, Partition

MIB = 1024 * 1024
RECORD_BYTES = 100
NOW_MS = 1_700_000_000_000
# The produce path's broker CPU per 100-byte record (bench/RESULTS.md, "Side by side").
PRODUCE_PATH_US_PER_RECORD = 0.5
RULES = TimestampRules(log_append_time=False, before_max_ms=2**63 - 1, after_max_ms=3_600_000)


def make_batch(target_bytes: int, compression: str) -> tuple[bytes, int, int]:
    """(batch, records, uncompressed bytes): 100-byte records (random hex, so they compress
    about 2:1) whose uncompressed batch fits in target_bytes."""
    per_record = len(encode_values([b"x" * RECORD_BYTES] * 100, timestamp_ms=0)) / 100
    count = max(1, int((target_bytes - 61) / per_record))
    values = [os.urandom(RECORD_BYTES // 2).hex().encode() for _ in range(count)]
    plain = encode_values(values, timestamp_ms=NOW_MS)
    while len(plain) > target_bytes:  # offset deltas grow with the count: trim to fit
        values = values[: -max(1, (len(plain) - target_bytes) // RECORD_BYTES)]
        plain = encode_values(values, timestamp_ms=NOW_MS)
    return encode_values(values, timestamp_ms=NOW_MS, compression=compression), len(values), len(plain)


def cpu_seconds(action: Callable[[], object], calls: int) -> float:
    """CPU seconds per call of `action`, over `calls` calls."""
    start = time.process_time()
    for _ in range(calls):
        action()
    return (time.process_time() - start) / calls


def append_seconds(batch: bytes, calls: int, *, check: bool) -> float:
    """CPU seconds per Partition.append_as_leader of `batch` on a fresh real log."""
    # Without the check: the partition's own reference to validate_records, replaced for this call.
    skip_check: contextlib.AbstractContextManager[object] = (
        mock.patch.object(partition_module, "validate_records", lambda *args, **kwargs: [])
        if not check
        else contextlib.nullcontext()
    )
    with skip_check, tempfile.TemporaryDirectory(prefix="validate-bench-") as directory:
        log = Log.open(Path(directory) / "t-0", LogConfig(), storage=FileStorage(), now_ms=0)
        p = Partition("t", 0, 1, log)
        p.become_leader(LeaderAndIsrState(1, 0, (1,), (1,), 1, 1), now_ms=0)
        seconds = cpu_seconds(lambda: p.append_as_leader(batch, acks=1, now_ms=NOW_MS), calls)
        log.close()
        return seconds


def measure(target_bytes: int, compression: str, total_bytes: int, rounds: int) -> dict[str, float]:
    batch, count, plain_bytes = make_batch(target_bytes, compression)
    uncompressed_mib = plain_bytes / MIB
    headers = validate_batches(batch, max_batch_bytes=None)
    calls = max(3, total_bytes // target_bytes)
    validate_records(batch, headers, rules=RULES, now_ms=NOW_MS)  # warm (the kernel is loaded at import)
    validation, without, with_check = [], [], []
    for _ in range(rounds):
        validation.append(
            cpu_seconds(lambda: validate_records(batch, headers, rules=RULES, now_ms=NOW_MS), calls)
        )
        without.append(append_seconds(batch, calls, check=False))
        with_check.append(append_seconds(batch, calls, check=True))
    per_mib = 1e6 / uncompressed_mib
    return {
        "records": count,
        "bytes": len(batch),
        "validation_us_per_mib": statistics.median(validation) * per_mib,
        "append_us_per_mib": statistics.median(without) * per_mib,
        "append_checked_us_per_mib": statistics.median(with_check) * per_mib,
        "produce_path_us_per_mib": PRODUCE_PATH_US_PER_RECORD * count / uncompressed_mib,
        "validation_ns_per_record": statistics.median(validation) * 1e9 / count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total-mib", type=int, default=64, help="MiB appended per measurement (default 64)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds; medians are printed")
    parser.add_argument(
        "--codecs", default="none,lz4,zstd", help="comma-separated: none,gzip,snappy,lz4,zstd"
    )
    args = parser.parse_args()
    print(
        f"load average {os.getloadavg()[0]:.1f}; CPU time; medians of {args.rounds} rounds; "
        f"µs per MiB of uncompressed batch"
    )
    print(
        f"{'batch':>8} {'codec':>6} {'records':>7} | {'validation':>10} {'append (today)':>14} {'ratio':>6} "
        f"| {'append+check':>12} {'append slower':>13} | {'vs produce path':>15} | {'ns/record':>9}"
    )
    for codec in args.codecs.split(","):
        for target in (16 * 1024, MIB):
            r = measure(target, codec, args.total_mib * MIB, args.rounds)
            ratio = r["validation_us_per_mib"] / r["append_us_per_mib"]
            slower = r["append_checked_us_per_mib"] / r["append_us_per_mib"] - 1
            path_share = r["validation_us_per_mib"] / r["produce_path_us_per_mib"]
            label = "16 KiB" if target < MIB else "1 MiB"
            print(
                f"{label:>8} {codec:>6} {int(r['records']):>7} | {r['validation_us_per_mib']:>10.0f} "
                f"{r['append_us_per_mib']:>14.0f} {ratio:>6.1%} | {r['append_checked_us_per_mib']:>12.0f} "
                f"{slower:>13.1%} | {path_share:>15.1%} | {r['validation_ns_per_record']:>9.1f}"
            )


if __name__ == "__main__":
    main()
