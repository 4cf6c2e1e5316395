"""Replica start-up: rebuilding the idempotent producers' state, from its snapshot against from the log.

A broker that opens a partition rebuilds each producer's sequence state before it may lead.
Since producer state snapshots, a clean stop writes the state at the log end and the next
start replays no batch; without a snapshot (a release before them, or a crash before any
log start move) every batch header of the log is read. This script writes a log of
idempotent batches from --producers producers, stops it cleanly, and times Log.open plus
Partition.rebuild_producer_state twice: with the snapshot, then with it removed (the
previous release's way). Prints both and their ratio. Page cache is not dropped (that needs
root), so "from the log" is the warm-cache best case; a cold start reads the whole log from disk.

A script, not a test: `python bench/producer_state_rebuild.py --help`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clients.common.records import Record, encode_batch
from services.broker.log import Log, LogConfig
from services.broker.log.checkpoints import PRODUCER_SNAPSHOT
from services.broker.log.file_storage import FileStorage
from services.broker.partition import LeaderAndIsrState, Partition

MIB = 1024 * 1024
RECORDS_PER_BATCH = 16


def write_log(directory: str, size_mib: int, producers: int, record_bytes: int) -> int:
    """A cleanly stopped log of about `size_mib` MiB; returns the number of batches."""
    log = Log.open(directory, LogConfig(), storage=FileStorage(), now_ms=0)
    p = Partition("bench", 0, 1, log)
    p.become_leader(LeaderAndIsrState(1, 0, (1,), (1,), 1, 1), now_ms=0)
    value = b"x" * record_bytes
    records = [Record(None, value, [], 1) for _ in range(RECORDS_PER_BATCH)]
    sequences = [0] * producers
    batches = 0
    while log.size_bytes < size_mib * MIB:
        producer = batches % producers
        batch = encode_batch(
            records, producer_id=producer, producer_epoch=0, base_sequence=sequences[producer]
        )
        p.append_as_leader(batch, acks=1, now_ms=0)
        sequences[producer] += RECORDS_PER_BATCH
        batches += 1
    log.close()
    return batches


def time_start(directory: str) -> tuple[float, int]:
    """Seconds to open the log and rebuild its producer state; producers found."""
    started = time.perf_counter()
    log = Log.open(directory, LogConfig(), storage=FileStorage(), now_ms=0)
    p = Partition("bench", 0, 1, log)
    p.rebuild_producer_state()
    elapsed = time.perf_counter() - started
    log.close()  # writes the snapshot again, as a clean stop does
    return elapsed, len(p.producers.producers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mib", type=int, default=512, help="log size in MiB (default 512)")
    parser.add_argument("--producers", type=int, default=20, help="idempotent producers (default 20)")
    parser.add_argument("--record-bytes", type=int, default=1000, help="value size (default 1000)")
    parser.add_argument("--repeat", type=int, default=3, help="timed starts of each kind (default 3)")
    parser.add_argument("--dir", default=None, help="where to write the log (default: a temporary directory)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="producer-state-rebuild-") as root:
        directory = os.path.join(root, "bench-0")
        batches = write_log(directory, args.size_mib, args.producers, args.record_bytes)
        print(
            f"log: {args.size_mib} MiB, {batches} batches of {RECORDS_PER_BATCH} records, "
            f"{args.producers} producers"
        )
        with_snapshot: list[float] = []
        from_log: list[float] = []
        for _ in range(args.repeat):
            seconds, found = time_start(directory)
            assert found == args.producers, f"found {found} producers, wrote {args.producers}"
            with_snapshot.append(seconds)
        for _ in range(args.repeat):
            os.remove(os.path.join(directory, PRODUCER_SNAPSHOT))
            seconds, found = time_start(directory)
            assert found == args.producers, f"found {found} producers, wrote {args.producers}"
            from_log.append(seconds)
    snap, log = statistics.median(with_snapshot), statistics.median(from_log)
    print(f"start with the snapshot (this release):    {snap:.3f} s (median of {args.repeat})")
    print(f"start from the log alone (before snapshots): {log:.3f} s (median of {args.repeat})")
    print(f"ratio: the snapshot start takes {snap / log:.4f}x the time ({log / snap:.0f}x faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
