"""What a consumer reads and where it stands in each partition (Kafka's SubscriptionState).

Plain state, no I/O and no asyncio: the topics subscribed to, the partitions assigned, each
partition's position (the offset of the next record poll() returns) and fetch offset (the
next offset to fetch: past what is buffered), the seek_to_* resets waiting for an offset,
paused partitions and the last high watermark seen. The fetcher (clients/consumer_fetcher.py)
moves positions as it hands records out; the group's coordinator
(clients/consumer_coordinator.py) changes the assignment; AsyncConsumer (clients/consumer.py)
resolves missing positions from committed offsets or auto_offset_reset.
"""

from __future__ import annotations

from collections.abc import Iterable

from clients.common.errors import OffsetOutOfRange
from clients.config import check_int, check_topic_name
from clients.errors import InvalidArgument
from clients.types import TopicPartition

EARLIEST = -2  # ListOffsets timestamp for the log start offset
LATEST = -1  # ListOffsets timestamp for the high watermark
RESET_TIMESTAMPS = {"earliest": EARLIEST, "latest": LATEST}


def check_partitions(partitions: Iterable[object], what: str = "partitions") -> list[TopicPartition]:
    """TopicPartitions (or (topic, partition) pairs) -> a checked list; InvalidArgument if not."""
    if isinstance(partitions, (str, bytes)):
        raise InvalidArgument(f"{what} must be a list of TopicPartition, got {type(partitions).__name__}")
    checked: dict[TopicPartition, None] = {}  # a list's `in` made assigning 10,000 take 1.5 s
    for item in partitions:
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidArgument(f"{what}: {item!r} is not a TopicPartition(topic, partition)")
        tp = TopicPartition(check_topic_name(item[0]), check_int("partition", item[1], minimum=0))
        checked.setdefault(tp, None)
    return list(checked)


class SubscriptionState:
    """The consumer's subscription, assignment and per-partition positions.

    Invariant kept by every method: every per-partition map holds assigned partitions only
    (assign() prunes the rest), so a partition given up leaves no position behind to be
    committed or fetched from.
    """

    __slots__ = (
        "_auto_offset_reset",
        "assignment",
        "fetch_offsets",
        "high_watermarks",
        "paused",
        "positions",
        "resets",
        "subscription",
    )

    def __init__(self, auto_offset_reset: str) -> None:
        self._auto_offset_reset = auto_offset_reset
        self.subscription: tuple[str, ...] | None = None
        self.assignment: list[TopicPartition] = []
        self.positions: dict[TopicPartition, int] = {}  # next offset poll() returns
        self.fetch_offsets: dict[TopicPartition, int] = {}  # next offset to fetch
        self.resets: dict[TopicPartition, int] = {}  # EARLIEST / LATEST asked by seek_to_*
        self.paused: set[TopicPartition] = set()
        self.high_watermarks: dict[TopicPartition, int] = {}

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Make `partitions` the assignment; the state of partitions kept is kept."""
        keep = set(partitions)
        for state in (self.positions, self.fetch_offsets, self.resets, self.high_watermarks):
            for tp in [tp for tp in state if tp not in keep]:
                del state[tp]
        self.paused &= keep
        self.assignment = partitions

    def check_assigned(self, tp: object) -> TopicPartition:
        checked = check_partitions([tp], "partition")[0]
        if checked not in self.assignment:
            raise InvalidArgument(f"{checked} is not assigned to this consumer")
        return checked

    def targets(self, partitions: tuple[TopicPartition, ...]) -> list[TopicPartition]:
        """The partitions named (each checked to be assigned), or every assigned one if none."""
        return [self.check_assigned(tp) for tp in partitions] if partitions else list(self.assignment)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """`offset` is the next record to hand out and to fetch (any reset asked is done)."""
        self.resets.pop(tp, None)
        self.positions[tp] = self.fetch_offsets[tp] = offset

    def reset(self, tp: TopicPartition, timestamp: int) -> None:
        """Forget tp's position: it is looked up again at `timestamp` (EARLIEST or LATEST)."""
        self.positions.pop(tp, None)
        self.fetch_offsets.pop(tp, None)
        self.resets[tp] = timestamp

    def missing_positions(self) -> list[TopicPartition]:
        return [tp for tp in self.assignment if tp not in self.positions]

    def reset_timestamps(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The ListOffsets timestamp each partition without a position (and without a committed
        offset) starts from: its seek_to_* reset, else auto_offset_reset; OffsetOutOfRange when
        auto_offset_reset is "none"."""
        wanted: dict[TopicPartition, int] = {}
        for tp in partitions:
            if tp in self.positions:
                continue
            if tp in self.resets:
                wanted[tp] = self.resets[tp]
            elif self._auto_offset_reset == "none":
                raise OffsetOutOfRange(f"{tp} has no committed offset and auto_offset_reset is 'none'")
            else:
                wanted[tp] = RESET_TIMESTAMPS[self._auto_offset_reset]
        return wanted
