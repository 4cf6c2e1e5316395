"""The transactional history checker (issue 41), in the spirit of Jepsen's Kafka checker.

The history: every transaction a transactional producer began (its label, producer id and
epoch, the values it sent and the ones acknowledged per partition with the first acknowledged
offset, whether EndTxn commit or abort was asked for and answered, whether its offsets were sent
with TxnOffsetCommit), and what each read_committed consumer saw, in order. Record values name
their transaction (`<label>/<n>`), so a value seen tells which transaction it belongs to.

Properties, each a TxnInvariantBroken naming the transaction, partition and consumer:
1. aborted: no read_committed consumer sees a record of a transaction whose producer never asked
   to commit it (an abort asked for, a timed-out, fenced or abandoned one), checked as each
   record arrives: before its commit was even asked for is as wrong as after its abort;
2. atomic: at the end every consumer has caught up, and sees each transaction whole or not at
   all, over all of its partitions;
3. lost: every record of a transaction whose EndTxn commit was answered NONE is seen by every
   consumer at the end;
4. zombie: in every final log, a producer id's batches and markers never go down in epoch
   (nothing a fenced producer sent was appended after its successor's epoch reached the
   partition) (a zombie's later calls are fenced, so its records are also held to 1-3: a commit
   it could not ask for is never seen);
5. LSO: every read_committed Fetch answer's last stable offset (and every record in it) stays at
   or below the first offset of each transaction the coordinator still holds Ongoing (its state
   in etcd) on that partition, checked as each answer arrives;
6. offsets: a group's committed offset sent in a transaction (its metadata is the label) appears
   in etcd only for a transaction whose commit was asked for, checked every OFFSETS_CHECK_MS,
   and at the end it is the last such transaction of its producer that committed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from clients.common.record_batch import iter_batch_headers
from clients.common.types import TopicPartitionKey
from coordinator.values import decode_consumer_offset
from services.broker.partition import Partition, Role
from services.transactions.coordinator import TxnState
from services.transactions.state import read_transaction
from tests.sim.checker import FINAL_READ_BYTES
from tests.sim.sim_etcd import SimEtcd, run_sync

# The checker reads the groups' committed offsets from etcd this often (ms of simulated time).
OFFSETS_CHECK_MS = 100


class TxnInvariantBroken(AssertionError):
    """A transactional property failed; the message says which, where and what was seen."""


@dataclass
class Txn:
    label: str
    transactional_id: str
    producer_id: int
    producer_epoch: int
    sent: dict[TopicPartitionKey, list[bytes]] = field(default_factory=dict)
    acked: dict[TopicPartitionKey, list[bytes]] = field(default_factory=dict)
    first_offset: dict[TopicPartitionKey, int] = field(default_factory=dict)
    commit_asked: bool = False
    abort_asked: bool = False
    # The EndTxn answer NONE: True committed, False aborted, None not (yet) known.
    outcome: bool | None = None
    offsets_sent: bool = False
    zombie: bool = False


@dataclass
class TxnCounts:
    began: int = 0
    committed: int = 0
    aborted: int = 0
    unknown: int = 0
    records_seen: int = 0
    zombie_writes: int = 0
    lso_checks: int = 0
    offset_checks: int = 0


def label_of(value: bytes) -> str:
    return value.decode().rsplit("/", 1)[0]


class TxnHistory:
    """What happened, and the checks that run as it happens."""

    def __init__(self, etcd: SimEtcd, groups_of: Callable[[], Iterable[tuple[str, str]]]) -> None:
        self.etcd = etcd
        self.txns: dict[str, Txn] = {}
        # Per consumer, per partition: (offset, value) in the order seen.
        self.seen: dict[str, dict[TopicPartitionKey, list[tuple[int, bytes]]]] = {}
        self.counts = TxnCounts()
        # (group, transactional id) of every producer that sends offsets.
        self._groups_of = groups_of

    # ---- producers ----------------------------------------------------------------------------

    def begin(self, txn: Txn) -> None:
        self.txns[txn.label] = txn
        self.counts.began += 1

    def on_sent(self, txn: Txn, tp: TopicPartitionKey, values: list[bytes]) -> None:
        txn.sent.setdefault(tp, []).extend(v for v in values if v not in txn.sent.get(tp, []))

    def on_acked(self, txn: Txn, tp: TopicPartitionKey, base_offset: int, values: list[bytes]) -> None:
        txn.acked.setdefault(tp, []).extend(values)
        txn.first_offset.setdefault(tp, base_offset)
        if txn.zombie:
            self.counts.zombie_writes += 1

    def on_end_asked(self, txn: Txn, commit: bool) -> None:
        if commit:
            txn.commit_asked = True
        else:
            txn.abort_asked = True

    def on_ended(self, txn: Txn, commit: bool) -> None:
        txn.outcome = commit

    # ---- consumers ----------------------------------------------------------------------------

    def on_fetch_answer(
        self, consumer: str, tp: TopicPartitionKey, last_stable_offset: int, offsets: list[int]
    ) -> None:
        """Property 5, for one read_committed Fetch answer (before its records are handed on)."""
        self.counts.lso_checks += 1
        top = max([last_stable_offset - 1, *offsets])
        for txn in self.txns.values():
            first = txn.first_offset.get(tp)
            if first is None or first > top or not self._open_in_etcd(txn, tp):
                continue
            raise TxnInvariantBroken(
                f"LSO: {consumer} got a read_committed answer for {tp[0]}-{tp[1]} with last stable offset "
                f"{last_stable_offset} and records up to {max(offsets, default=-1)}, past offset {first}, "
                f"the first of transaction {txn.label} (producer {txn.producer_id}/{txn.producer_epoch}), "
                "which the coordinator still holds Ongoing"
            )

    def _open_in_etcd(self, txn: Txn, tp: TopicPartitionKey) -> bool:
        meta, _ = run_sync(read_transaction(self.etcd.store, txn.transactional_id))
        return (
            meta is not None
            and meta.state is TxnState.ONGOING
            and (meta.producer_id, meta.producer_epoch) == (txn.producer_id, txn.producer_epoch)
            and tp in meta.partitions
            and self._latest_of(txn) is txn
        )

    def _latest_of(self, txn: Txn) -> Txn | None:
        """The last transaction begun by txn's producer id at its epoch (one is open at a time)."""
        same = [
            t
            for t in self.txns.values()
            if (t.producer_id, t.producer_epoch) == (txn.producer_id, txn.producer_epoch)
        ]
        return same[-1] if same else None

    def on_consumed(self, consumer: str, tp: TopicPartitionKey, offset: int, value: bytes) -> None:
        """Property 1 (and 4's no zombie record seen), as each record arrives."""
        self.counts.records_seen += 1
        self.seen.setdefault(consumer, {}).setdefault(tp, []).append((offset, value))
        txn = self.txns.get(label_of(value))
        if txn is None:
            raise TxnInvariantBroken(
                f"{consumer} saw {value!r} at {tp[0]}-{tp[1]}@{offset}: no producer sent it"
            )
        if not txn.commit_asked:
            why = "its abort was asked for" if txn.abort_asked else "its commit was never asked for"
            raise TxnInvariantBroken(
                f"aborted: {consumer} saw {value!r} at {tp[0]}-{tp[1]}@{offset} of transaction "
                f"{txn.label} (producer {txn.producer_id}/{txn.producer_epoch}"
                f"{', a zombie' if txn.zombie else ''}): {why}"
            )

    # ---- offsets --------------------------------------------------------------------------------

    def committed_offset_labels(self) -> dict[str, str]:
        """Per transactional id, the label its group's committed offset names (none: absent)."""
        labels: dict[str, str] = {}
        store = self.etcd.store
        for group, tid in self._groups_of():
            kv = run_sync(store.get(store.keys.consumer_offset(group, "t0", 0)))
            if kv is not None:
                labels[tid] = str(decode_consumer_offset(kv.value)["metadata"])
        return labels

    def check_offsets(self) -> None:
        """Property 6 as the run goes: a published offset's transaction had its commit asked for."""
        self.counts.offset_checks += 1
        for tid, label in self.committed_offset_labels().items():
            txn = self.txns.get(label)
            if txn is None or not txn.commit_asked or not txn.offsets_sent:
                raise TxnInvariantBroken(
                    f"offsets: the group of {tid} has a committed offset of transaction {label}, whose "
                    f"commit was never asked for (or which sent no offsets): {txn}"
                )

    # ---- the end --------------------------------------------------------------------------------

    def final_check(self, consumers: Iterable[str], leaders: Iterable[Partition]) -> None:
        """Properties 2, 3, 4 and 6 once every consumer has read up to its leader's LSO."""
        visible_by: dict[str, set[str]] = {}
        for consumer in consumers:
            seen = {v for records in self.seen.get(consumer, {}).values() for _, v in records}
            visible_by[consumer] = {label_of(v) for v in seen}
            self._check_whole(consumer, seen)
        self._check_offsets_final(visible_by)
        for p in leaders:
            self._check_epochs(p)
        for txn in self.txns.values():
            if txn.outcome is True:
                self.counts.committed += 1
            elif txn.outcome is False:
                self.counts.aborted += 1
            else:
                self.counts.unknown += 1

    def _check_whole(self, consumer: str, seen: set[bytes]) -> None:
        for txn in self.txns.values():
            acked = {v for values in txn.acked.values() for v in values}
            sent = {v for values in txn.sent.values() for v in values}
            got = seen & sent
            if txn.outcome is True and not acked <= got:
                missing = sorted(acked - got)[:5]
                raise TxnInvariantBroken(
                    f"lost: transaction {txn.label} committed (EndTxn answered NONE) but {consumer} never "
                    f"saw {len(acked - got)} of its acknowledged records, e.g. {missing} "
                    f"(first offsets {txn.first_offset})"
                )
            if got and not acked <= got:
                raise TxnInvariantBroken(
                    f"atomic: {consumer} saw {len(got)} records of transaction {txn.label} but not "
                    f"{sorted(acked - got)[:5]} (first offsets {txn.first_offset}): a transaction is seen "
                    "whole or not at all"
                )

    def _check_offsets_final(self, visible_by: dict[str, set[str]]) -> None:
        self.check_offsets()
        visible = set.intersection(*visible_by.values()) if visible_by else set()
        labels = self.committed_offset_labels()
        for tid in {t.transactional_id for t in self.txns.values()}:
            with_offsets = [
                t
                for t in self.txns.values()
                if t.transactional_id == tid and t.offsets_sent and t.label in visible
            ]
            expected = with_offsets[-1].label if with_offsets else None
            if labels.get(tid) != expected:
                raise TxnInvariantBroken(
                    f"offsets: the group of {tid} ends at the offset of transaction {labels.get(tid)}, but "
                    f"the last of its committed transactions that sent offsets is {expected}"
                )

    def _check_epochs(self, p: Partition) -> None:
        """Property 4 on one final leader log: per producer id, epochs never go down."""
        highest: dict[int, tuple[int, int]] = {}
        log = p.log
        offset = log.log_start_offset
        while offset < log.log_end_offset:
            info = log.read(offset, max_bytes=FINAL_READ_BYTES)
            if info.is_empty:
                break
            for h in iter_batch_headers(info.records):
                if h.producer_id < 0:
                    continue
                before = highest.get(h.producer_id)
                if before is not None and h.producer_epoch < before[0]:
                    raise TxnInvariantBroken(
                        f"zombie: {p.topic}-{p.partition}@{h.base_offset} holds a "
                        f"{'marker' if h.is_control else 'batch'} of producer {h.producer_id} at epoch "
                        f"{h.producer_epoch}, after epoch {before[0]} reached the partition at "
                        f"offset {before[1]}"
                    )
                if before is None or h.producer_epoch > before[0]:
                    highest[h.producer_id] = (h.producer_epoch, h.base_offset)
            offset = info.next_offset


def leaders_of(partitions: Iterable[Partition]) -> list[Partition]:
    return [p for p in partitions if p.role is Role.LEADER]
