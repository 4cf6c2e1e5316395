"""The log cleaner's kernels (services/broker/log/cleaner_kernels.py) and its CPU budget.

The whole-pass behaviour (what is kept, tombstones, codecs, producers) is in test_cleaner.py and
the cleaner simulation, which run through these kernels; here: the key hash against an
independent implementation, the offset map's table growing and shrinking, damage reported as
damage, the kernels holding no GIL, and the CPU share the cleaner thread is held to.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from clients.common.errors import CorruptMessage, InvariantViolation
from clients.common.record_batch import BATCH_HEADER_SIZE, CRC_POS, batch_crc
from clients.common.records import Record, encode_batch
from services.broker.log import MemoryStorage
from services.broker.log import cleaner_kernels as kernels
from services.broker.log.cleaner import OffsetMap, Throttler, build_offset_map
from services.broker.log_cleaner import parse_cpu_pressure
from services.common import limits
from tests.unit.test_cleaner import DIR, Seg, write_segments

# MurmurHash3 x64-128 answers of the reference implementation (the mmh3 package,
# mmh3.hash128(data, seed, x64arch=True): h1 is the low 64 bits, h2 the high).
MURMUR3_VECTORS = [
    (b"", 0, 0x0, 0x0),
    (b"hello", 0, 0xCBD8A7B341BD9B02, 0x5B1E906A48AE1D19),
    (b"key-00000042", 7, 0x98771F50454C57B2, 0xFF6ADAD8194BB35E),
    (bytes(range(31)), 12345, 0x340CFC4FCBE927EB, 0x64802A4C64A36BDE),
    (b"x" * 100, 2**32 - 1, 0xD73657BB0501DF72, 0x9352E91799746D43),
]


@pytest.mark.parametrize(("data", "seed", "h1", "h2"), MURMUR3_VECTORS)
def test_the_key_hash_is_murmur3_x64_128(data: bytes, seed: int, h1: int, h2: int) -> None:
    # Hashed in place at an odd position: keys sit anywhere in a records section.
    buf = np.frombuffer(b"abc" + data + b"def", dtype=np.uint8)
    got = kernels.murmur3_128(buf, 3, len(data), np.uint64(seed))
    assert (int(got[0]), int(got[1])) == (h1, h2)


def digest(n: int) -> bytes:
    return struct.pack("<QQ", n * 0x9E3779B97F4A7C15 % 2**64, n)


def test_the_map_table_grows_with_its_keys_and_release_gives_it_back() -> None:
    offset_map = OffsetMap(limits.LOG_CLEANER_DEDUPE_BUFFER_BYTES_DEFAULT)
    small = offset_map.table_bytes
    keys = 200_000  # past the first table size: it doubles twice
    for n in range(keys):
        assert offset_map.put(digest(n), n)
    assert len(offset_map) == keys
    assert all(offset_map.get(digest(n)) == n for n in range(0, keys, 997))
    assert offset_map.get(digest(keys + 1)) == -1
    # Bounded by its keys, not by the 128 MiB it may use: 32 bytes a key and a doubling's slack.
    assert offset_map.table_bytes <= 2 * keys * limits.LOG_CLEANER_OFFSET_MAP_ENTRY_BYTES
    offset_map.release()
    assert (offset_map.table_bytes, len(offset_map), offset_map.get(digest(5))) == (small, 0, -1)


def test_a_map_at_its_capacity_refuses_new_keys_but_moves_known_ones() -> None:
    offset_map = OffsetMap(1000 * limits.LOG_CLEANER_OFFSET_MAP_ENTRY_BYTES)
    for n in range(1000):
        assert offset_map.put(digest(n), n)
    assert not offset_map.put(digest(5000), 5000)
    assert offset_map.put(digest(3), 6000)
    assert (offset_map.get(digest(3)), offset_map.get(digest(5000)), len(offset_map)) == (6000, -1, 1000)
    with pytest.raises(InvariantViolation):
        offset_map.put(digest(4), 10)  # a pass reads forward


def test_a_pass_whose_map_fills_mid_batch_ends_at_the_record_it_could_not_take() -> None:
    storage = MemoryStorage()
    records = [Record(b"k%d" % i, b"v", [], 1_000) for i in range(10)]
    segments = write_segments(storage, [[encode_batch(records, base_offset=0)]])
    offset_map = OffsetMap(4 * limits.LOG_CLEANER_OFFSET_MAP_ENTRY_BYTES)
    mapped = build_offset_map(storage, segments, offset_map, start_offset=2, end_offset=10, throttler=None)
    assert (mapped.end_offset, mapped.full, mapped.records, len(offset_map)) == (6, True, 4, 4)


def _damaged(batch: bytes, section_bytes: bytes, count: int) -> bytes:
    """`batch`'s header over another records section and count, its CRC made right again: damage
    the framing checks cannot see, only the record walk."""
    out = bytearray(batch[:BATCH_HEADER_SIZE] + section_bytes)
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">i", out, BATCH_HEADER_SIZE - 4, count)
    struct.pack_into(">I", out, CRC_POS, batch_crc(out, 0, len(out)))
    return bytes(out)


@pytest.mark.parametrize(
    ("records_kept", "cut", "why"),
    [
        (2, 3, "runs past"),  # the last record's bytes cut short
        (1, 0, "fewer records"),  # two records declared, one there
    ],
)
def test_a_damaged_records_section_is_corrupt_not_read_past(records_kept: int, cut: int, why: str) -> None:
    storage = MemoryStorage()
    records = [Record(b"a", b"1", [], 1), Record(b"b", b"2", [], 1)]
    good = encode_batch(records, base_offset=0)
    section = encode_batch(records[:records_kept], base_offset=0)[BATCH_HEADER_SIZE:]
    bad = _damaged(good, section[: len(section) - cut], 2)
    storage.mkdir(DIR)
    handle = storage.open(f"{DIR}/0.log")
    handle.append(bad)
    handle.close()
    segments = [Seg(0, 2, 2, f"{DIR}/0.log", len(bad), 1)]
    with pytest.raises(CorruptMessage, match=why):
        build_offset_map(storage, segments, OffsetMap(1 << 20), start_offset=0, end_offset=2, throttler=None)


def test_the_record_kernels_hold_no_gil() -> None:
    """What lets the event loop run while the cleaner works (the module docstring says why)."""
    for kernel in (kernels.map_records, kernels.filter_records, kernels.encode_kept, kernels.murmur3_128):
        assert kernel.targetoptions.get("nogil") is True, kernel


def test_the_cpu_budget_holds_the_cleaner_thread_to_its_share() -> None:
    wall_ms = [0.0]
    cpu_s = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        wall_ms[0] += seconds * 1000  # sleeping passes time, spends no CPU

    throttler = Throttler(
        0,
        monotonic_ms=lambda: wall_ms[0],
        sleep_s=sleep,
        check_interval_ms=100,
        cpu_share=0.1,
        thread_cpu_s=lambda: cpu_s[0],
    )
    for _ in range(1000):  # batches of 5 ms of pure CPU work each
        wall_ms[0] += 5
        cpu_s[0] += 0.005
        throttler.between_batches()
    assert cpu_s[0] / (wall_ms[0] / 1000) == pytest.approx(0.1, rel=0.05)
    assert throttler.cpu_slept_s == pytest.approx(sum(slept), rel=1e-9)

    unlimited = Throttler(0, monotonic_ms=lambda: wall_ms[0], sleep_s=sleep, thread_cpu_s=lambda: cpu_s[0])
    before = len(slept)
    for _ in range(100):
        wall_ms[0] += 5
        cpu_s[0] += 0.005
        unlimited.between_batches()
    assert slept[before:] == [0] * 100  # it only yields the GIL


def test_the_cpu_budget_reads_one_threads_clock_and_starts_over_on_another() -> None:
    """A thread's CPU clock means nothing to another: a pass continued on another thread (one
    with far more CPU behind it) must not be charged the difference as the cleaner's work."""
    wall_ms = [0.0]
    clocks = {1: 0.0, 2: 500.0}  # thread 2 has spent 500 s of CPU (a broker's main thread, say)
    thread = [1]
    slept: list[float] = []
    throttler = Throttler(
        0,
        monotonic_ms=lambda: wall_ms[0],
        sleep_s=slept.append,
        check_interval_ms=100,
        cpu_share=0.1,
        thread_cpu_s=lambda: clocks[thread[0]],
        thread_id=lambda: thread[0],
    )
    for _ in range(10):  # idle batches on thread 1: no CPU spent, nothing to hold back
        wall_ms[0] += 50
        throttler.between_batches()
    thread[0] = 2
    for _ in range(10):
        wall_ms[0] += 50
        throttler.between_batches()
    assert slept == [0] * 20


def test_the_cpu_budget_drops_to_its_floor_while_the_machine_is_contended() -> None:
    """Under CPU pressure the cleaner holds to cpu_share_under_pressure, and takes back its full
    share once the pressure is gone: cycles it spends on a saturated machine are taken from
    produce and fetch (issue 39's busy-against-idle benchmark)."""
    wall_ms = [0.0]
    cpu_s = [0.0]
    pressure: list[float | None] = [0.5]

    def sleep(seconds: float) -> None:
        wall_ms[0] += seconds * 1000

    throttler = Throttler(
        0,
        monotonic_ms=lambda: wall_ms[0],
        sleep_s=sleep,
        check_interval_ms=100,
        cpu_share=0.1,
        thread_cpu_s=lambda: cpu_s[0],
        cpu_share_under_pressure=0.02,
        cpu_pressure=lambda: pressure[0],
    )

    def run(batches: int) -> float:
        start_wall, start_cpu = wall_ms[0], cpu_s[0]
        for _ in range(batches):
            wall_ms[0] += 5
            cpu_s[0] += 0.005
            throttler.between_batches()
        return (cpu_s[0] - start_cpu) / ((wall_ms[0] - start_wall) / 1000)

    assert run(1000) == pytest.approx(0.02, rel=0.05)
    assert throttler.pressured_checks > 0
    pressure[0] = 0.01  # below the threshold: spare cycles
    assert run(1000) == pytest.approx(0.1, rel=0.05)
    pressure[0] = None  # no pressure information (an old kernel): the full share
    assert run(1000) == pytest.approx(0.1, rel=0.05)


def test_cpu_pressure_is_read_from_the_psi_file(tmp_path: Path) -> None:
    psi = tmp_path / "cpu"
    psi.write_text(
        "some avg10=18.09 avg60=43.05 avg300=37.48 total=14965726595\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    assert parse_cpu_pressure(str(psi)) == pytest.approx(0.1809)
    assert parse_cpu_pressure(str(tmp_path / "missing")) is None
    psi.write_text("garbage\n")
    assert parse_cpu_pressure(str(psi)) is None
