"""The partition log across offset holes (issue 39): a compacted log's offsets have gaps.

A follower copies a compacted leader's log with append_as_follower, whose batches then start
past the previous batch's next offset. Every read, locate, timestamp lookup, truncation,
log start move, epoch entry and reopen (clean and after a crash) must answer from the right
batch: at an offset inside a hole, the first batch after it. Runs on MemoryStorage (crash
semantics) and on real files.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from clients.common.errors import InvariantViolation
from clients.common.record_batch import assign_offsets, iter_batch_headers, validate_batches
from clients.common.records import decode_batches, encode_values
from services.broker.log import Log, LogConfig, MemoryStorage
from services.broker.log.checkpoints import RECOVERY_POINT_CHECKPOINT
from services.broker.log.file_storage import FileStorage
from services.broker.log.storage import Storage

# Small segments and a dense index: holes fall inside segments and between them.
# Holes exist only in compacted logs: recovery of any other log takes a gap for damage.
SMALL = LogConfig(
    segment_bytes=1_000,
    index_interval_bytes=150,
    retention_ms=-1,
    max_message_bytes=1_500,
    cleanup_policy="compact",
)


@dataclass(frozen=True)
class Batch:
    base: int
    count: int
    epoch: int
    timestamp_ms: int

    @property
    def next_offset(self) -> int:
        return self.base + self.count


def encode(spec: Batch) -> bytes:
    """A batch as a leader assigned it: base offset and leader epoch stamped."""
    values = [b"v%d" % (spec.base + i) for i in range(spec.count)]
    buf = bytearray(encode_values(values, timestamp_ms=spec.timestamp_ms))
    assign_offsets(buf, validate_batches(buf, max_batch_bytes=None), spec.base, spec.epoch)
    return bytes(buf)


def holey_batches(seed: int = 7, count: int = 60) -> list[Batch]:
    """Batches with a hole before about every other one, epochs rising now and then."""
    rng = random.Random(seed)
    batches: list[Batch] = []
    offset = rng.choice([0, 5])
    epoch = 1
    for i in range(count):
        if rng.random() < 0.2:
            epoch += 1
        batches.append(Batch(offset, rng.randint(1, 4), epoch, 1_000 + 10 * i))
        offset = batches[-1].next_offset + (rng.choice([1, 2, 7, 30]) if rng.random() < 0.5 else 0)
    return batches


def holding(batches: list[Batch], offset: int) -> Batch | None:
    """The model: the first batch whose last offset is >= offset."""
    return next((b for b in batches if b.next_offset > offset), None)


@pytest.fixture(params=["memory", "file"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Storage, str]:
    if request.param == "memory":
        return MemoryStorage(open_files_max=2), "/data/topic-0"
    return FileStorage(open_files_max=2), str(tmp_path / "topic-0")


def follower_log(place: tuple[Storage, str], batches: list[Batch], *, per_append: int = 3) -> Log:
    storage, directory = place
    log = Log.open(directory, SMALL, storage=storage, now_ms=0)
    if batches[0].base:
        log.truncate_fully_and_start_at(0)
    for i in range(0, len(batches), per_append):
        group = batches[i : i + per_append]
        log.append_as_follower(b"".join(encode(b) for b in group), now_ms=i)
    return log


def check_reads(log: Log, batches: list[Batch]) -> None:
    """Every offset from the log start to the LEO answers from the model's batch."""
    assert log.log_end_offset == batches[-1].next_offset
    for offset in range(log.log_start_offset, log.log_end_offset):
        want = holding(batches, offset)
        assert want is not None
        fetched = log.read(offset, max_bytes=1)
        assert fetched.first_offset == want.base, offset
        assert fetched.next_offset == want.next_offset, offset
        assert [r.offset for r in decode_batches(fetched.records)] == list(range(want.base, want.next_offset))
        assert next(r.value for r in decode_batches(fetched.records)) == b"v%d" % want.base
        located = log.locate(offset)
        assert located is not None and located[2] == want.base, offset
        # A bigger read goes on from there, whole batches, holes skipped.
        wide = log.read(offset, max_bytes=600)
        got = [h.base_offset for h in iter_batch_headers(wide.records)]
        assert got == [b.base for b in batches if b.base >= want.base][: len(got)]
    assert log.read(log.log_end_offset, max_bytes=100).is_empty


def read_everything(log: Log) -> list[tuple[int, bytes | None]]:
    offset = log.log_start_offset
    seen: list[tuple[int, bytes | None]] = []
    while offset < log.log_end_offset:
        fetched = log.read(offset, max_bytes=500)
        if fetched.is_empty:
            break  # a hole up to an empty active segment: nothing after it yet
        seen.extend((r.offset, r.value) for r in decode_batches(fetched.records) if r.offset >= offset)
        offset = fetched.next_offset
    return seen


def model_records(batches: list[Batch], start: int = 0) -> list[tuple[int, bytes | None]]:
    return [(o, b"v%d" % o) for b in batches for o in range(b.base, b.next_offset) if o >= start]


def test_a_follower_log_with_holes_answers_every_offset_from_the_right_batch(
    place: tuple[Storage, str],
) -> None:
    batches = holey_batches()
    log = follower_log(place, batches)
    bases = log.segment_base_offsets
    assert len(bases) > 3
    # Segments past a hole start at the batch after it, not at the previous segment's end.
    segment_starts = {b.base for b in batches}
    assert set(bases[1:]) <= segment_starts
    assert any(b.base != prev.next_offset for prev, b in itertools.pairwise(batches) if b.base in bases)
    check_reads(log, batches)
    assert read_everything(log) == model_records(batches)
    # Headers from an offset inside a hole start at the batch after it.
    hole = next(prev.next_offset for prev, b in itertools.pairwise(batches) if b.base > prev.next_offset)
    assert next(log.batch_headers(hole)).base_offset == holding(batches, hole).base  # type: ignore[union-attr]


def test_read_location_in_a_hole_names_the_next_batchs_bytes(tmp_path: Path) -> None:
    batches = holey_batches(seed=3)
    log = follower_log((FileStorage(), str(tmp_path / "t-0")), batches)
    for offset in range(0, log.log_end_offset):
        located = log.read_location(offset, max_bytes=300)
        fetched = log.read(offset, max_bytes=300)
        assert located is not None
        assert (located.first_offset, located.next_offset) == (fetched.first_offset, fetched.next_offset)
        with open(located.path, "rb") as file:
            file.seek(located.position)
            assert file.read(located.size) == fetched.records


def test_follower_takes_a_batch_past_its_leo_but_not_before(place: tuple[Storage, str]) -> None:
    log = follower_log(place, [Batch(0, 3, 1, 1_000)])
    log.append_as_follower(encode(Batch(10, 2, 1, 1_001)), now_ms=0)
    assert log.log_end_offset == 12
    with pytest.raises(InvariantViolation, match="expected at least 12"):
        log.append_as_follower(encode(Batch(11, 2, 1, 1_002)), now_ms=0)
    # A gap between two batches of one append is a hole too; going back inside one is not.
    log.append_as_follower(encode(Batch(20, 1, 2, 1_003)) + encode(Batch(25, 1, 2, 1_004)), now_ms=0)
    with pytest.raises(InvariantViolation):
        log.append_as_follower(encode(Batch(30, 3, 2, 1_005)) + encode(Batch(31, 1, 2, 1_006)), now_ms=0)
    assert log.log_end_offset == 26
    assert log.leader_epoch_cache.entries() == [(1, 0), (2, 20)]
    # The leader's own appends stay contiguous from the LEO.
    info = log.append_as_leader(encode_values([b"x"], timestamp_ms=2_000), leader_epoch=3, now_ms=0)
    assert (info.first_offset, info.next_offset) == (26, 27)


def test_epoch_cache_names_the_first_batch_of_each_epoch_across_holes(place: tuple[Storage, str]) -> None:
    batches = holey_batches(seed=11)
    log = follower_log(place, batches)
    expected: list[tuple[int, int]] = []
    for b in batches:
        if not expected or expected[-1][0] != b.epoch:
            expected.append((b.epoch, b.base))
    assert log.leader_epoch_cache.entries() == expected


def test_offset_for_timestamp_across_holes(place: tuple[Storage, str]) -> None:
    batches = holey_batches(seed=5)
    log = follower_log(place, batches)
    for b in batches:
        assert log.offset_for_timestamp(b.timestamp_ms) == (b.base, b.timestamp_ms)
        # A time between two batches answers the later one.
        later = holding(batches, b.next_offset)
        expected = (later.base, later.timestamp_ms) if later is not None else None
        assert log.offset_for_timestamp(b.timestamp_ms + 1) == expected


def test_truncate_into_a_hole_keeps_the_batch_before_it(place: tuple[Storage, str]) -> None:
    batches = holey_batches(seed=9)
    holes = [
        (i, prev.next_offset, b.base)
        for i, (prev, b) in enumerate(itertools.pairwise(batches))
        if b.base > prev.next_offset + 1
    ]
    assert len(holes) >= 3
    log = follower_log(place, batches)
    # From the end: each truncation cuts into a hole, then the follower refills.
    for i, hole_start, hole_end in reversed(holes[-3:]):
        target = (hole_start + hole_end) // 2
        log.truncate_to(target)
        kept = batches[: i + 1]
        assert log.log_end_offset == kept[-1].next_offset
        check_reads(log, kept)
        assert log.leader_epoch_cache.latest_epoch() == kept[-1].epoch
        # The leader answers the follower's LEO from its batch after the hole: it fits.
        log.append_as_follower(encode(batches[i + 1]), now_ms=0)
        assert log.log_end_offset == batches[i + 1].next_offset
        log.truncate_to(target)
    # A truncation to the base of a segment whose previous segment ends before it (a hole
    # between them): that segment is emptied and stays, so the LEO is its base.
    log2 = follower_log((place[0], place[1] + "-b"), batches)
    bases = log2.segment_base_offsets
    later = next(
        base
        for base in bases[1:]
        if holding(batches, base - 1).base == base  # type: ignore[union-attr]
    )
    kept = [b for b in batches if b.base < later]
    log2.truncate_to(later)
    assert log2.log_end_offset == later
    assert read_everything(log2) == model_records(kept)
    for offset in range(kept[-1].next_offset, later):
        assert log2.read(offset, max_bytes=100).is_empty
    log2.append_as_follower(encode(holding(batches, later)), now_ms=0)  # type: ignore[arg-type]
    assert read_everything(log2) == model_records([*kept, holding(batches, later)])  # type: ignore[list-item]


def test_log_start_offset_inside_a_hole(place: tuple[Storage, str]) -> None:
    batches = holey_batches(seed=13)
    log = follower_log(place, batches)
    bases = log.segment_base_offsets
    hole = next(
        prev.next_offset
        for prev, b in itertools.pairwise(batches)
        if b.base > prev.next_offset and b.base > bases[2]
    )
    log.advance_log_start_offset(hole)
    assert log.log_start_offset == hole
    assert log.segment_base_offsets[0] > bases[0]  # whole segments below it went
    fetched = log.read(hole, max_bytes=1)
    assert fetched.first_offset == holding(batches, hole).base  # type: ignore[union-attr]
    assert read_everything(log) == model_records(batches, hole)
    assert log.leader_epoch_cache.entries()[0][1] == hole


@pytest.mark.parametrize("how", ["clean", "crash", "full-scan"])
def test_reopen_keeps_every_hole(how: str, place: tuple[Storage, str]) -> None:
    storage, directory = place
    batches = holey_batches(seed=17)
    log = follower_log(place, batches)
    bases = log.segment_base_offsets
    epochs = log.leader_epoch_cache.entries()
    if how == "clean":
        log.close()
    else:
        log.flush(now_ms=0)
        log.abandon()
        if isinstance(storage, MemoryStorage):
            storage.crash()
        if how == "full-scan":
            # No recovery point: every segment is scanned batch by batch (segment.recover).
            storage.delete(f"{directory}/{RECOVERY_POINT_CHECKPOINT}")
    reopened = Log.open(directory, SMALL, storage=storage, now_ms=0)
    report = reopened.recovery_report
    assert report.bytes_dropped == 0 and report.segments_dropped == 0, report
    if how == "full-scan":
        assert report.segments_recovered == len(bases)
    assert reopened.segment_base_offsets == bases
    assert reopened.leader_epoch_cache.entries() == epochs
    check_reads(reopened, batches)
    # And it goes on taking batches past holes.
    more = Batch(batches[-1].next_offset + 50, 2, batches[-1].epoch, 9_000)
    reopened.append_as_follower(encode(more), now_ms=0)
    assert read_everything(reopened) == model_records([*batches, more])


def test_unflushed_batches_past_a_hole_are_lost_whole_in_a_crash() -> None:
    storage = MemoryStorage()
    batches = holey_batches(seed=19)
    half = len(batches) // 2
    log = follower_log((storage, "/d/t-0"), batches[:half])
    log.flush(now_ms=0)
    for b in batches[half:]:
        log.append_as_follower(encode(b), now_ms=0)
    storage.crash()
    reopened = Log.open("/d/t-0", SMALL, storage=storage, now_ms=0)
    check_reads(reopened, batches[:half])


def test_a_hole_wider_than_an_index_can_span_starts_a_new_segment(place: tuple[Storage, str]) -> None:
    wide = 2**31 + 10
    # An empty log whose first batch lies past the int32 span of its empty segment.
    log = Log.open(place[1], SMALL, storage=place[0], now_ms=0)
    far = Batch(wide, 2, 1, 1_000)
    log.append_as_follower(encode(far), now_ms=0)
    assert log.segment_base_offsets == [wide]
    assert log.log_start_offset == wide
    # A non-empty segment rolls at the far batch; batches of one append past the span split too.
    farther = Batch(2 * wide, 1, 1, 1_001)
    farthest = Batch(3 * wide, 1, 2, 1_002)
    log.append_as_follower(encode(farther) + encode(farthest), now_ms=0)
    assert log.segment_base_offsets == [wide, 2 * wide, 3 * wide]
    batches = [far, farther, farthest]
    assert read_everything(log) == model_records(batches)
    assert log.read(wide + 5, max_bytes=1).first_offset == 2 * wide
    log.close()
    reopened = Log.open(place[1], SMALL, storage=place[0], now_ms=0)
    assert read_everything(reopened) == model_records(batches)
    assert reopened.log_start_offset == wide
