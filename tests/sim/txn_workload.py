"""Transactional clients of the simulated cluster (issue 41).

- A TxnProducer runs Kafka's transactional producer loop against the simulated coordinator
  (tests/sim/txn_coordinator.py): InitProducerId with its transactional id, then transaction
  after transaction: AddPartitionsToTxn for 1..3 partitions, a transactional batch per
  partition to its leader ("ProduceTxn": the leader's KIP-890 check, then the append; the batch
  encoded with the transactional flag, producer id, epoch and per-partition sequence), maybe
  AddOffsetsToTxn + TxnOffsetCommit for its group, and EndTxn commit or abort at random. Some
  transactions stall past their timeout (the coordinator's tick aborts them and fences the
  epoch); retriable answers are retried, a fenced producer initializes again (KIP-360).
- A zombie: when the simulation starts a successor for the same transactional id, the old
  instance keeps going with its old epoch; once fenced it keeps sending batches for a while
  (every one must be refused or aborted), then stops.
- A TxnConsumer reads every partition from offset 0 with isolation_level read_committed and
  drops aborted data with the production function the clients use (`drop_aborted`), handing
  each answer and each record to the history (tests/sim/txn_checker.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder

from clients.common.control_records import drop_aborted
from clients.common.fetch_request import consumer_fetch_request
from clients.common.record_batch import iter_batch_headers
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from services.transactions.coordinator import (
    AddOffsetsToTxn,
    AddPartitionsToTxn,
    EndTxn,
    InitProducerId,
    PendingOffset,
    TxnAnswer,
    TxnError,
    TxnOffsetCommit,
    TxnRequest,
)
from tests.sim.checker import decode_records
from tests.sim.clock import EventLoop
from tests.sim.config import WALL_CLOCK_BASE_MS
from tests.sim.network import Network, RpcError, RpcNode
from tests.sim.sim_broker_seams import broker_node
from tests.sim.txn_checker import Txn, TxnHistory
from tests.sim.txn_coordinator import TXN_COORDINATOR
from tests.sim.workload import CLIENT_RETRY_BACKOFF_MS, CONSUMER_PARTITION_MAX_BYTES, MetadataView

# The transaction timeout producers ask for: a stalled transaction is aborted within a run.
TXN_TIMEOUT_MS = 3_000
# A transaction stalls (its producer waits past the timeout before ending it) this often.
STALL_FRACTION = 0.08
STALL_MS = (TXN_TIMEOUT_MS + 1_000, TXN_TIMEOUT_MS + 3_000)
COMMIT_FRACTION = 0.7
OFFSETS_FRACTION = 0.5
PARTITIONS_PER_TXN_MAX = 3
RECORDS_PER_BATCH_MAX = 3
# Between two steps of a transaction, and between transactions (ms).
STEP_GAP_MS = (1, 60)
TXN_GAP_MS = (10, 300)
TXN_RPC_TIMEOUT_MS = 3_000
PRODUCE_TIMEOUT_MS = 2_000
PRODUCE_RPC_TIMEOUT_MS = PRODUCE_TIMEOUT_MS + 1_000
# A batch is sent again this many times before its transaction is aborted.
PRODUCE_ATTEMPTS_MAX = 5
# A fenced zombie sends this many more batches with its old epoch before it stops.
ZOMBIE_WRITES_MAX = 4
CONSUMER_FETCH_WAIT_MS = 300
# Answers that mean "try the same call again".
RETRIABLE = frozenset(
    {TxnError.CONCURRENT_TRANSACTIONS, TxnError.COORDINATOR_NOT_AVAILABLE, TxnError.NOT_COORDINATOR}
)


def transactional_batch(
    values: list[bytes], producer_id: int, epoch: int, sequence: int, now_ms: int
) -> bytes:
    """A record batch v2 with the transactional flag (what a transactional producer sends)."""
    builder = DefaultRecordBatchBuilder(2, 0, 1, producer_id, epoch, sequence, 1 << 20)
    for i, value in enumerate(values):
        builder.append(i, timestamp=now_ms, key=None, value=value, headers=[])
    return bytes(builder.build())


class TxnProducer(RpcNode):
    def __init__(
        self,
        name: str,
        transactional_id: str,
        loop: EventLoop,
        network: Network,
        rng: random.Random,
        history: TxnHistory,
        broker_ids: list[int],
    ) -> None:
        super().__init__(name, loop, network)
        self.transactional_id = transactional_id
        self.group = f"g-{transactional_id}"
        self.rng = rng
        self.history = history
        self.metadata = MetadataView(self, broker_ids, rng)
        self.topics: list[str] = []
        self.producer_id = -1
        self.epoch = -1
        self.sequences: dict[TopicPartitionKey, int] = {}
        self.txn: Txn | None = None
        self.txns_begun = 0
        self.stopped = False
        self.zombie = False
        self.fenced = False
        self.zombie_writes = 0
        # A batch of the last transaction has an unknown outcome: bump the epoch before the next.
        self.bump_epoch = False

    def start(self, delay_ms: int = 0) -> None:
        self.after(delay_ms, self._init)

    def _gap(self, span: tuple[int, int]) -> int:
        return self.rng.randint(*span)

    def _txn_call(self, request: TxnRequest, answered: Callable[[TxnAnswer], None]) -> None:
        """A coordinator call; an unreachable coordinator reads as COORDINATOR_NOT_AVAILABLE."""

        def reply(resp: Any) -> None:
            if self.stopped:
                return
            if isinstance(resp, RpcError):
                resp = TxnAnswer(TxnError.COORDINATOR_NOT_AVAILABLE, str(resp))
            if resp.error is not TxnError.NONE:
                self.trace("%s: %s %s", type(request).__name__, resp.error.value, resp.message)
            answered(resp)

        self.call(TXN_COORDINATOR, "Txn", request, TXN_RPC_TIMEOUT_MS, reply)

    def _retry(self, fn: Callable[..., None], *args: Any) -> None:
        self.after(CLIENT_RETRY_BACKOFF_MS, fn, *args)

    # ---- InitProducerId ------------------------------------------------------------------------

    def _init(self) -> None:
        if self.stopped or self.zombie:
            return
        request = InitProducerId(self.transactional_id, TXN_TIMEOUT_MS, self.producer_id, self.epoch)

        def answered(answer: TxnAnswer) -> None:
            if answer.error is TxnError.NONE:
                self.producer_id, self.epoch = answer.producer_id, answer.producer_epoch
                self.sequences.clear()
                self.fenced = self.bump_epoch = False
                self.trace("%s: producer %d epoch %d", self.transactional_id, self.producer_id, self.epoch)
                self.after(self._gap(TXN_GAP_MS), self._begin)
            elif answer.error in RETRIABLE:
                self._retry(self._init)
            else:  # KIP-360 refused the expected epoch: start over as a new instance would
                self.producer_id = self.epoch = -1
                self._retry(self._init)

        self._txn_call(request, answered)

    def _fenced(self) -> None:
        """Another instance took over or the coordinator aborted us: initialize again (a zombie
        keeps writing with its old epoch instead)."""
        self.fenced = True
        self.txn = None
        if self.zombie:
            self.after(self._gap(STEP_GAP_MS), self._zombie_write)
        else:
            self._retry(self._init)

    def _on_error(self, answer: TxnAnswer, again: Callable[[], None]) -> None:
        if answer.error in RETRIABLE:
            self._retry(again)
        else:
            self._fenced()

    # ---- one transaction -----------------------------------------------------------------------

    def _begin(self) -> None:
        if self.stopped:
            return
        partitions = sorted(tp for tp in self.metadata.leaders if tp[0] in self.topics)
        if not partitions:
            self.metadata.refresh(lambda: self._retry(self._begin))
            return
        chosen = frozenset(
            self.rng.sample(partitions, self.rng.randint(1, min(PARTITIONS_PER_TXN_MAX, len(partitions))))
        )
        self.txns_begun += 1
        txn = Txn(
            f"{self.transactional_id}.{self.name}.{self.txns_begun}",
            self.transactional_id,
            self.producer_id,
            self.epoch,
            zombie=self.zombie,
        )
        self.txn = txn
        self.history.begin(txn)
        self._add_partitions(
            txn, AddPartitionsToTxn(self.transactional_id, self.producer_id, self.epoch, chosen)
        )

    def _add_partitions(self, txn: Txn, request: AddPartitionsToTxn) -> None:
        def added(answer: TxnAnswer) -> None:
            if answer.error is TxnError.NONE:
                self._produce(txn, sorted(request.partitions), 0)
            else:
                self._on_error(answer, lambda: self._add_partitions(txn, request))

        self._txn_call(request, added)

    def _produce(
        self, txn: Txn, todo: list[TopicPartitionKey], attempt: int, values: list[bytes] | None = None
    ) -> None:
        """Send one batch to todo[0] (again, with the same values and sequence, when `values`)."""
        if self.stopped or self.txn is not txn:
            return
        if not todo:
            self.after(self._gap(STEP_GAP_MS), self._maybe_offsets, txn)
            return
        tp = todo[0]
        if values is None:
            count = self.rng.randint(1, RECORDS_PER_BATCH_MAX)
            base = len(txn.sent.get(tp, []))
            values = [f"{txn.label}/{tp[0]}-{tp[1]}-{base + i}".encode() for i in range(count)]
        self.history.on_sent(txn, tp, values)
        sequence = self.sequences.get(tp, 0)
        leader = self.metadata.leaders.get(tp, -1)

        def answered(resp: Any) -> None:
            if self.stopped or self.txn is not txn:
                return
            pr = None if isinstance(resp, RpcError) else resp.topics[0].partitions[0]
            if pr is not None and pr.error_code == common_pb2.NONE:
                self.sequences[tp] = sequence + len(values)
                self.history.on_acked(txn, tp, pr.base_offset, values)
                self.after(self._gap(STEP_GAP_MS), self._produce, txn, todo[1:], 0)
            elif pr is not None and pr.error_code in (
                common_pb2.INVALID_PRODUCER_EPOCH,
                common_pb2.PRODUCER_FENCED,
            ):
                self._fenced()
            elif attempt + 1 < PRODUCE_ATTEMPTS_MAX:
                self.metadata.refresh(lambda: self._retry(self._produce, txn, todo, attempt + 1, values))
            else:
                # An abortable error: give the transaction up. Whether the batch was appended is
                # unknown, so its sequence cannot be used again at this epoch: the next
                # transaction starts with a new epoch (KIP-360), as Kafka's producer does.
                self.bump_epoch = True
                self._end(txn, commit=False)

        if leader < 0:
            answered(RpcError("UNAVAILABLE", "no leader known"))
            return
        self._send_batch(leader, tp, values, sequence, answered)

    def _send_batch(
        self,
        leader: int,
        tp: TopicPartitionKey,
        values: list[bytes],
        sequence: int,
        answered: Callable[[Any], None],
    ) -> None:
        records = transactional_batch(
            values, self.producer_id, self.epoch, sequence, WALL_CLOCK_BASE_MS + self.loop.now_ms
        )
        request = common_pb2.ProduceRequest(
            acks=-1,
            timeout_ms=PRODUCE_TIMEOUT_MS,
            topics=[
                common_pb2.ProduceTopicData(
                    topic=tp[0],
                    partitions=[common_pb2.ProducePartitionData(partition=tp[1], records=records)],
                )
            ],
        )
        self.call(
            broker_node(leader),
            "ProduceTxn",
            (self.transactional_id, request),
            PRODUCE_RPC_TIMEOUT_MS,
            answered,
        )

    def _maybe_offsets(self, txn: Txn) -> None:
        if self.stopped or self.txn is not txn:
            return
        if self.rng.random() >= OFFSETS_FRACTION:
            self._maybe_stall(txn)
            return
        add = AddOffsetsToTxn(self.transactional_id, self.producer_id, self.epoch, self.group)
        commit = TxnOffsetCommit(
            self.transactional_id,
            self.producer_id,
            self.epoch,
            self.group,
            {("t0", 0): PendingOffset(self.txns_begun, txn.label)},
        )

        def committed(answer: TxnAnswer) -> None:
            if answer.error is TxnError.NONE:
                txn.offsets_sent = True
                self._maybe_stall(txn)
            else:
                self._on_error(answer, lambda: self._txn_call(commit, committed))

        def added(answer: TxnAnswer) -> None:
            if answer.error is TxnError.NONE:
                self._txn_call(commit, committed)
            else:
                self._on_error(answer, lambda: self._txn_call(add, added))

        self._txn_call(add, added)

    def _maybe_stall(self, txn: Txn) -> None:
        commit = self.rng.random() < COMMIT_FRACTION
        wait = self._gap(STALL_MS) if self.rng.random() < STALL_FRACTION else self._gap(STEP_GAP_MS)
        self.after(wait, self._end, txn, commit)

    def _end(self, txn: Txn, commit: bool) -> None:
        if self.stopped or self.txn is not txn:
            return
        self.history.on_end_asked(txn, commit)
        request = EndTxn(self.transactional_id, txn.producer_id, txn.producer_epoch, commit)

        def ended(answer: TxnAnswer) -> None:
            if self.txn is not txn:
                return
            if answer.error is TxnError.NONE:
                self.history.on_ended(txn, commit)
                self.txn = None
                self.after(self._gap(TXN_GAP_MS), self._init if self.bump_epoch else self._begin)
            else:
                self._on_error(answer, lambda: self._txn_call(request, ended))

        self._txn_call(request, ended)

    # ---- the zombie ----------------------------------------------------------------------------

    def _zombie_write(self) -> None:
        """A fenced zombie sends a batch with its old epoch as if its transaction went on."""
        if self.stopped or self.zombie_writes >= ZOMBIE_WRITES_MAX:
            return
        self.zombie_writes += 1
        partitions = sorted(tp for tp, leader in self.metadata.leaders.items() if leader >= 0)
        if not partitions or self.producer_id < 0:
            return
        tp = self.rng.choice(partitions)
        txn = Txn(
            f"{self.transactional_id}.{self.name}.z{self.zombie_writes}",
            self.transactional_id,
            self.producer_id,
            self.epoch,
            zombie=True,
        )
        self.history.begin(txn)
        values = [f"{txn.label}/0".encode()]
        self.history.on_sent(txn, tp, values)

        def answered(resp: Any) -> None:
            pr = None if isinstance(resp, RpcError) else resp.topics[0].partitions[0]
            if pr is not None and pr.error_code == common_pb2.NONE:
                self.history.on_acked(txn, tp, pr.base_offset, values)
            self.after(self._gap(TXN_GAP_MS), self._zombie_write)

        self._send_batch(self.metadata.leaders[tp], tp, values, self.sequences.get(tp, 0), answered)


class TxnConsumer(RpcNode):
    """Reads every partition from 0 with read_committed; hands every answer and record to the history."""

    def __init__(
        self,
        name: str,
        loop: EventLoop,
        network: Network,
        rng: random.Random,
        history: TxnHistory,
        broker_ids: list[int],
    ) -> None:
        super().__init__(name, loop, network)
        self.rng = rng
        self.history = history
        self.metadata = MetadataView(self, broker_ids, rng)
        self.topics: list[str] = []
        self.positions: dict[TopicPartitionKey, int] = {}
        # The last stable offset of each partition's last answer: caught up when position reaches it.
        self.stable: dict[TopicPartitionKey, int] = {}
        self._running: set[TopicPartitionKey] = set()
        self.after(100, self._poll)

    def _poll(self) -> None:
        for tp in sorted(self.metadata.leaders):
            if tp[0] in self.topics and tp not in self._running:
                self._running.add(tp)
                self._fetch(tp)
        self.metadata.refresh(lambda: None)
        self.after(1_000, self._poll)

    def _fetch(self, tp: TopicPartitionKey) -> None:
        leader = self.metadata.leaders.get(tp, -1)
        if leader < 0:
            self._running.discard(tp)
            return
        position = self.positions.setdefault(tp, 0)
        # The consumers' own Fetch (clients/common/fetch_request.py), read_committed.
        request = consumer_fetch_request(
            {tp: position},
            max_wait_ms=CONSUMER_FETCH_WAIT_MS,
            min_bytes=1,
            max_bytes=CONSUMER_PARTITION_MAX_BYTES,
            partition_max_bytes=CONSUMER_PARTITION_MAX_BYTES,
            read_committed=True,
        )
        self.call(
            broker_node(leader),
            "Fetch",
            request,
            CONSUMER_FETCH_WAIT_MS + 2_000,
            lambda resp: self._answered(tp, position, resp),
        )

    def _answered(self, tp: TopicPartitionKey, position: int, resp: Any) -> None:
        pr = None if isinstance(resp, RpcError) else resp.topics[0].partitions[0]
        if pr is None or pr.error_code != common_pb2.NONE:
            self.metadata.refresh(lambda: None)
            self.after(CLIENT_RETRY_BACKOFF_MS, self._fetch, tp)
            return
        lso = pr.last_stable_offset if pr.HasField("last_stable_offset") else pr.high_watermark
        records = drop_aborted(pr.records, [(a.producer_id, a.first_offset) for a in pr.aborted_transactions])
        decoded = [
            (offset, value) for offset, value, _ in decode_records(bytes(records)) if offset >= position
        ]
        self.history.on_fetch_answer(self.name, tp, lso, [offset for offset, _ in decoded])
        for offset, value in decoded:
            self.history.on_consumed(self.name, tp, offset, value)
            position = offset + 1
        # Past a trailing marker or aborted batch: the next fetch starts after what was returned.
        self.positions[tp] = max(position, min(_end_of(pr.records, position), lso))
        self.stable[tp] = lso
        self.after(0 if decoded else 20, self._fetch, tp)


def _end_of(records: bytes, position: int) -> int:
    """The offset after the last whole batch of a Fetch answer (position when there is none)."""
    end = position
    for h in iter_batch_headers(records):
        end = max(end, h.last_offset + 1)
    return end
