"""The storage engine on real processes: SIGKILL mid-append, and damaged segment files.

DESIGN.md section 5: after an unclean stop every batch past the recovery point is
scanned, its length and CRC checked, and a torn or corrupt tail cut away. fsync is
off by default, so what a SIGKILLed process wrote is still in the OS page cache:
a process crash must lose no acknowledged batch and leave nothing corrupt readable
(invariant 7 with a single replica: acks=1 on RF 1 is acknowledged once written).

Both tests use one broker with RF 1, so every byte of the partition comes from
that broker's own log and recovery, not from a replica.
"""

from __future__ import annotations

import os
import random
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from clients.common.record_batch import BatchHeader, iter_batch_headers, valid_prefix
from protos.highwater.v1 import common_pb2
from services.broker.log.checkpoints import CLEAN_SHUTDOWN_MARKER
from tests.integration.conftest import TEST_LEASE_TTL_S
from tests.integration.helpers import (
    create_topic,
    describe_partition,
    etcd_value,
    fetch_all,
    gateway_stub,
    produce,
    wait_for,
)

pytestmark = pytest.mark.integration

# Enough restarts to hit appends at different moments, few enough to fit the ~2 min budget
# (each cycle waits out the lease TTL before the broker may register again).
CRASH_CYCLES = 10
# Produce requests during an outage give up after this; the producer then tries again.
OUTAGE_PRODUCE_TIMEOUT_MS = 2_000
# After a restart the controller re-elects the broker, the gateway refreshes its routing.
LEADER_BACK_TIMEOUT_S = 20.0


def segment_files(partition_dir: Path) -> list[Path]:
    return sorted(partition_dir.glob("*.log"))


def restart_after_crash(c, broker_id: int, gw, topic: str) -> None:
    """Wait for the killed broker's registration to expire, start it, and wait until it leads again."""
    key = f"/highwater/brokers/ids/{broker_id}"
    wait_for(
        lambda: etcd_value(c.etcd_endpoint, key) is None,
        timeout_s=TEST_LEASE_TTL_S + 5,
        what=f"broker {broker_id}'s registration to expire",
    )
    c.start_broker(broker_id)
    wait_for(
        lambda: describe_partition(gw, topic, 0).leader == broker_id,
        timeout_s=LEADER_BACK_TIMEOUT_S,
        what=f"broker {broker_id} to lead {topic}-0 again",
    )


@dataclass
class AckedBatches:
    """What the producer thread was told: base offset -> values of every batch answered with error 0."""

    batches: dict[int, list[bytes]] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)  # why each unacknowledged attempt failed

    def records(self) -> dict[int, bytes]:
        return {base + i: v for base, values in self.batches.items() for i, v in enumerate(values)}


def _produce_forever(
    gw, topic: str, name: str, rng: random.Random, stop: threading.Event, acked: AckedBatches
) -> None:
    """Append batches of varied size with acks=1 until stopped; failures (the broker is down) are retried."""
    seq = 0
    while not stop.is_set():
        # Mostly small batches (many appends, many kill points), sometimes one of ~0.5 MiB
        # (a long pwrite that a SIGKILL may tear).
        if rng.random() < 0.1:
            count, size = rng.randint(400, 600), 1000
        else:
            count, size = rng.randint(1, 40), rng.randint(10, 400)
        values = [f"{name}-{seq}-{i}:".encode() + rng.randbytes(size) for i in range(count)]
        seq += 1
        try:
            res = produce(gw, topic, 0, values, acks=1, timeout_ms=OUTAGE_PRODUCE_TIMEOUT_MS)
        except grpc.RpcError as exc:
            acked.failed.append(exc.code().name)
            continue
        if res.error_code == common_pb2.NONE:
            acked.batches[res.base_offset] = values
        else:
            acked.failed.append(common_pb2.ErrorCode.Name(res.error_code))


def check_disk_holds(partition_dir: Path, acked: dict[int, list[bytes]]) -> tuple[int, int]:
    """Every acknowledged batch lies, whole and with a good CRC, in the sound prefix of the segments.

    Returns (the offset where the sound prefix ends, the bytes of torn or corrupt tail that
    recovery will have to cut).
    """
    sound: dict[int, int] = {}  # base offset -> record count of every sound batch on disk
    sound_end = torn = 0
    for path in segment_files(partition_dir):
        data = path.read_bytes()
        headers, end, _ = valid_prefix(data)
        sound.update((h.base_offset, h.records_count) for h in headers)
        if headers:
            sound_end = headers[-1].next_offset
        torn += len(data) - end
    missing = {base: len(values) for base, values in acked.items() if sound.get(base) != len(values)}
    assert not missing, (
        f"acknowledged batches (base offset: records) not whole on disk after SIGKILL: {missing}"
    )
    return sound_end, torn


@pytest.mark.slow
def test_sigkill_during_appends_loses_no_acknowledged_batch_and_leaves_nothing_corrupt(make_cluster):
    seed = int(os.environ.get("HIGHWATER_CRASH_SEED", time.time_ns() % 2**32))
    print(f"crash test seed: {seed} (HIGHWATER_CRASH_SEED={seed} repeats the batch sizes and kill points)")
    rng = random.Random(seed)
    c = make_cluster(brokers=1)
    gw = gateway_stub(c.gateway_address)
    topic = "crash-appends"
    assert create_topic(gw, topic, partitions=1, replication_factor=1).error_code == 0
    partition_dir = c.base_dir / "broker-1" / f"{topic}-0"
    broker_log = c.processes["broker-1"].log_path
    acked = AckedBatches()
    stop = threading.Event()
    # Two producers, so a kill often lands while an append is in flight on the broker.
    producers = [
        threading.Thread(
            target=_produce_forever,
            args=(gw, topic, f"t{n}", random.Random(rng.random()), stop, acked),
            daemon=True,
        )
        for n in range(2)
    ]
    for producer in producers:
        producer.start()
    torn_per_cycle = []
    unacknowledged_survivors = []
    try:
        for cycle in range(1, CRASH_CYCLES + 1):
            # Kill at a random point of the stream: after a random number of further acknowledgements.
            target = len(acked.batches) + rng.randint(1, 30)
            wait_for(
                lambda t=target: len(acked.batches) >= t,
                timeout_s=20,
                what=f"{target} acknowledged batches before crash {cycle}",
            )
            c.kill_broker(1)
            # Copy: the producer thread may still record an answer that raced the kill.
            acked_before_kill = dict(acked.batches)
            assert not (partition_dir / CLEAN_SHUTDOWN_MARKER).exists(), (
                "SIGKILL leaves no clean-shutdown marker"
            )
            sound_end, torn = check_disk_holds(partition_dir, acked_before_kill)
            torn_per_cycle.append(torn)
            acked_end = max(base + len(values) for base, values in acked_before_kill.items())
            unacknowledged_survivors.append(sound_end - acked_end)

            restart_after_crash(c, 1, gw, topic)
            records = fetch_all(gw, topic, 0, timeout_s=20)  # decode_batches checks every batch's CRC
            assert [r.offset for r in records] == list(range(len(records))), (
                f"cycle {cycle}: offsets below the HW are not contiguous from 0"
            )
            by_offset = {r.offset: r.value for r in records}
            lost = [
                (base, len(values))
                for base, values in acked_before_kill.items()
                if any(by_offset.get(base + i) != v for i, v in enumerate(values))
            ]
            assert not lost, f"cycle {cycle} (seed {seed}): acknowledged batches lost or changed: {lost[:10]}"
            # Recovery really ran: one scan per unclean start, each saying what it dropped.
            recoveries = broker_log.read_text(errors="replace").count(f"log {partition_dir}: recovered")
            assert recoveries == cycle, f"expected {cycle} recovery scans in {broker_log}, found {recoveries}"
    finally:
        stop.set()
        for producer in producers:
            producer.join(timeout=OUTAGE_PRODUCE_TIMEOUT_MS / 1000 + 10)
    assert not any(producer.is_alive() for producer in producers)
    final = {r.offset: r.value for r in fetch_all(gw, topic, 0, timeout_s=20)}
    assert all(final.get(offset) == value for offset, value in acked.records().items())
    print(
        f"{CRASH_CYCLES} crashes, {len(acked.batches)} batches acknowledged, {len(acked.failed)} produce "
        "attempts "
        f"failed during outages; torn tail bytes on disk after each kill: {torn_per_cycle}; records written "
        f"past the last acknowledged one at each kill (in flight, answer lost): {unacknowledged_survivors}"
    )


# ---- damaged segment files --------------------------------------------------------------------

BATCHES_PER_PARTITION = 12


def _truncate_mid_last_batch(data: bytearray, headers: list[BatchHeader]) -> tuple[bytearray, int]:
    last = headers[-1]
    return data[: last.position + last.size_bytes // 2], len(headers) - 1


def _flip_byte_in_last_batch(data: bytearray, headers: list[BatchHeader]) -> tuple[bytearray, int]:
    last = headers[-1]
    data[last.end_position - 10] ^= 0xFF  # inside the last record: the CRC catches it
    return data, len(headers) - 1


def _flip_byte_in_middle_batch(data: bytearray, headers: list[BatchHeader]) -> tuple[bytearray, int]:
    victim = 5
    data[headers[victim].position + 30] ^= 0x01  # first_timestamp: covered by the CRC
    return data, victim


def _rewrite_base_offset_of_middle_batch(
    data: bytearray, headers: list[BatchHeader]
) -> tuple[bytearray, int]:
    # base_offset lies outside the CRC: only the offset-contiguity check can catch this.
    victim = 7
    struct.pack_into(">q", data, headers[victim].position, headers[victim].base_offset + 1000)
    return data, victim


# partition -> (what is done to its only segment, how to do it: returns the new bytes and the
# index of the first batch that must be gone)
DAMAGES = {
    0: ("tail truncated in the middle of the last batch", _truncate_mid_last_batch),
    1: ("one byte flipped inside the last batch's records", _flip_byte_in_last_batch),
    2: ("one CRC-covered byte flipped in batch 5 of 12", _flip_byte_in_middle_batch),
    3: ("base offset of batch 7 of 12 rewritten (outside the CRC)", _rewrite_base_offset_of_middle_batch),
}


def test_recovery_cuts_exactly_the_damaged_part_of_a_segment(make_cluster):
    c = make_cluster(brokers=1)
    gw = gateway_stub(c.gateway_address)
    topic = "damaged"
    assert create_topic(gw, topic, partitions=len(DAMAGES), replication_factor=1).error_code == 0
    rng = random.Random(7)
    produced: dict[int, list[tuple[int, list[bytes]]]] = {p: [] for p in DAMAGES}
    for p in DAMAGES:
        for b in range(BATCHES_PER_PARTITION):
            # 1-3 KiB batches: several offset-index entries (every 4 KiB) point into what gets cut.
            values = [f"p{p}-b{b}-r{i}:".encode() + rng.randbytes(rng.randint(50, 300)) for i in range(8)]
            res = produce(gw, topic, p, values, acks=1)
            assert res.error_code == common_pb2.NONE, res.error_message
            produced[p].append((res.base_offset, values))
    c.kill_broker(1)

    # partition -> (kept batches, the segment's bytes before the damage, kept bytes, dropped bytes)
    expected: dict[int, tuple[int, bytes, int, int]] = {}
    for p, (_, damage) in DAMAGES.items():
        directory = c.base_dir / "broker-1" / f"{topic}-{p}"
        assert not (directory / CLEAN_SHUTDOWN_MARKER).exists()
        segment = directory / "00000000000000000000.log"
        data = bytearray(segment.read_bytes())
        headers = list(iter_batch_headers(data))
        assert len(headers) == BATCHES_PER_PARTITION and headers[-1].end_position == len(data), (
            f"{segment} should hold exactly the {BATCHES_PER_PARTITION} batches produced"
        )
        original = bytes(data)
        damaged, first_bad = damage(data, headers)
        segment.write_bytes(damaged)
        kept_bytes = headers[first_bad].position
        expected[p] = (first_bad, original, kept_bytes, len(damaged) - kept_bytes)

    restart_after_crash(c, 1, gw, topic)
    for p in DAMAGES:
        wait_for(
            lambda p=p: describe_partition(gw, topic, p).leader == 1,
            timeout_s=LEADER_BACK_TIMEOUT_S,
            what=f"broker 1 to lead {topic}-{p} again",
        )
    for p, (what, _) in DAMAGES.items():
        kept_batches, original, kept_bytes, dropped_bytes = expected[p]
        directory = c.base_dir / "broker-1" / f"{topic}-{p}"
        records = fetch_all(gw, topic, p)
        want = [(base + i, v) for base, values in produced[p][:kept_batches] for i, v in enumerate(values)]
        assert [(r.offset, r.value) for r in records] == want, (
            f"{topic}-{p} ({what}): every batch before the damage at its offset, nothing after"
        )
        # Read after the fetch: the log opens (and recovers) when the controller's LeaderAndIsr arrives.
        broker_log = c.processes["broker-1"].log_path.read_text(errors="replace")
        message = f"log {directory}: dropped {dropped_bytes} bytes at byte {kept_bytes} of segment 0"
        assert message in broker_log, f"{topic}-{p} ({what}): the broker log should say '{message}'"
        # Recovery cut the file and left the sound prefix as it was, byte for byte.
        segment = directory / "00000000000000000000.log"
        assert segment.read_bytes() == original[:kept_bytes]
        # The log goes on at the cut: the next batch takes the first offset that was dropped.
        next_offset = produced[p][kept_batches][0]
        res = produce(gw, topic, p, [b"after recovery"], acks=1)
        assert (res.error_code, res.base_offset) == (common_pb2.NONE, next_offset)
        after = fetch_all(gw, topic, p, start=next_offset)
        assert [(r.offset, r.value) for r in after] == [(next_offset, b"after recovery")]
