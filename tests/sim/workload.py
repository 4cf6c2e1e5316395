"""Clients of the simulated cluster: producers, consumers, and an operator doing admin work.

- A Producer sends one batch at a time (max.in.flight = 1) to the leader it learned
  from a broker's Metadata answer: acks=all, acks=1, or acks=all with the idempotent
  producer (InitProducerId, then producer id / epoch / sequence in every batch). Every
  record value is unique (`p<n>-<seq>`), so the checker can follow each one. A failed
  batch is sent again with the same values: a few times by a plain producer (duplicates
  allowed, lost acknowledged records not), until it succeeds by an idempotent one (no
  duplicates allowed either, DESIGN.md rule 8).
- A Consumer reads every partition from offset 0 on with replica_id -1 (so only below
  the HW), handing every record to the checker as it arrives. When retention has passed
  its position (OFFSET_OUT_OF_RANGE below the leader's log start) it resets to the log
  start, as auto.offset.reset=earliest does, and tells the checker what it skipped.
- The Operator creates topics and, during the fault phase, asks for preferred leader
  elections, moves partitions (AlterPartitionReassignments), rolls brokers through
  a controlled shutdown and restart, and deletes topics (DeleteTopics) to create them
  again under the same name.

A deleted topic's clients drop it at once (`topic_deleted`): a batch or a fetch of the
old topic still in flight is dropped when it answers, so nothing of the old topic is
reported as the new one's; the re-created topic starts from offset 0 and sequence 0.

Clients learn where to send from broker metadata (UpdateMetadata-fed caches), as
the real clients do, and refresh it on NOT_LEADER_OR_FOLLOWER, timeouts and the like.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clients.common.records import encode_values
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import common_pb2
from tests.sim.checker import decode_records
from tests.sim.clock import EventLoop
from tests.sim.config import WALL_CLOCK_BASE_MS, SimConfig
from tests.sim.network import Network, RpcError, RpcNode
from tests.sim.sim_broker import SimBroker
from tests.sim.sim_broker_seams import broker_node, controller_node

if TYPE_CHECKING:
    from tests.sim.checker import Checker


# A failed batch is sent again this many times before the producer gives up on it.
PRODUCE_ATTEMPTS_MAX = 4
CLIENT_RETRY_BACKOFF_MS = 100
# A consumer asks for at most this much per partition: small answers keep each step cheap.
CONSUMER_PARTITION_MAX_BYTES = 64 * 1024
# Extra wait on top of a request's own timeout before the client gives up on the RPC.
CLIENT_RPC_SLACK_MS = 1_000
# The operator's admin calls wait this long for an answer (DeleteTopics waits for the deletion).
DELETE_TOPICS_TIMEOUT_MS = 5_000
ADMIN_RPC_TIMEOUT_MS = DELETE_TOPICS_TIMEOUT_MS + 5_000
# A deletion not finished within DeleteTopics' wait is asked about again after this long.
DELETE_TOPICS_RETRY_MS = 1_000


class MetadataView:
    """A client's idea of who leads what, refreshed from any live broker."""

    def __init__(self, node: RpcNode, broker_ids: list[int], rng: random.Random) -> None:
        self.node = node
        self.broker_ids = broker_ids
        self.rng = rng
        self.leaders: dict[TopicPartitionKey, int] = {}
        # Each topic's id, sent with a consumer's Fetch as our Consumer does (a zombie leader
        # of a deleted topic of the same name refuses it).
        self.topic_ids: dict[str, str] = {}
        self._waiting: list[Callable[[], None]] | None = None  # None: no refresh in flight

    def refresh(self, then: Callable[[], None]) -> None:
        """Ask a random broker for metadata; then() runs when the answer (or an error) is in."""
        if self._waiting is not None:
            self._waiting.append(then)
            return
        self._waiting = [then]
        target = broker_node(self.rng.choice(self.broker_ids))

        def answered(resp: Any) -> None:
            if not isinstance(resp, RpcError):
                for topic in resp.topics:
                    self.topic_ids[topic.name] = topic.topic_id
                    for pm in topic.partitions:
                        self.leaders[(topic.name, pm.partition)] = pm.leader
            waiting, self._waiting = self._waiting or [], None
            for callback in waiting:
                callback()

        self.node.call(target, "Metadata", common_pb2.MetadataRequest(), 2_000, answered)


@dataclass(slots=True)
class _Batch:
    tp: TopicPartitionKey
    values: list[bytes]
    # The topic's generation at the producer when the batch was made (bumped by a deletion).
    generation: int = 0
    base_sequence: int = -1  # idempotent producers only
    producer_epoch: int = -1
    attempt: int = 1


class _Client(RpcNode):
    """What producers and consumers share: the run's rng, config and checker, a metadata view, the
    topics it uses and how many times each was deleted."""

    def __init__(
        self,
        name: str,
        loop: EventLoop,
        network: Network,
        rng: random.Random,
        config: SimConfig,
        checker: Checker,
        broker_ids: list[int],
    ) -> None:
        super().__init__(name, loop, network)
        self.rng = rng
        self.config = config
        self.checker = checker
        self.metadata = MetadataView(self, broker_ids, rng)
        self.topics: list[str] = []
        # topic -> times it was deleted: a producer drops batches made for an older generation, a
        # consumer ends a fetch loop begun in one.
        self.generations: dict[str, int] = {}

    def topic_deleted(self, topic: str) -> None:
        """The operator deleted `topic`: stop using it and count a new generation of it."""
        if topic in self.topics:
            self.topics.remove(topic)
        self.generations[topic] = self.generations.get(topic, 0) + 1


class Producer(_Client):
    """acks=all or acks=1; with `idempotent`, batches carry producer id, epoch and sequence.

    The idempotent producer never gives up on a batch (it retries with the same sequence
    until the leader answers), so every value it sends is written once at most.
    OUT_OF_ORDER_SEQUENCE_NUMBER / INVALID_PRODUCER_EPOCH make it bump its epoch and
    number the batch again (clients/idempotence.py's rule); such a batch may then be
    written twice, and the checker is told so.
    """

    def __init__(
        self,
        index: int,
        acks: int,
        idempotent: bool,
        loop: EventLoop,
        network: Network,
        rng: random.Random,
        config: SimConfig,
        checker: Checker,
        broker_ids: list[int],
        controller_ids: list[int],
    ) -> None:
        super().__init__(f"p{index}", loop, network, rng, config, checker, broker_ids)
        self.acks = acks
        self.idempotent = idempotent
        self.controller_ids = controller_ids
        self.seq = 0
        self.stopped = False
        self._round_robin = 0
        self.producer_id = -1
        self.producer_epoch = -1
        self._sequences: dict[TopicPartitionKey, int] = {}
        self.after(
            rng.randint(0, config.produce_interval_ms_max),
            self._init_producer_id if idempotent else self._send_next,
            None,
        )

    # ---- InitProducerId (idempotent only) --------------------------------------------

    def _init_producer_id(self, then: _Batch | None, attempt: int = 0) -> None:
        """A new id (or, with one already, the next epoch); then send `then` or start producing."""
        target = controller_node(self.controller_ids[attempt % len(self.controller_ids)])
        request = common_pb2.InitProducerIdRequest(
            producer_id=self.producer_id, producer_epoch=self.producer_epoch
        )

        def answered(resp: Any) -> None:
            if isinstance(resp, RpcError) or resp.error_code != common_pb2.NONE:
                self.after(CLIENT_RETRY_BACKOFF_MS, self._init_producer_id, then, attempt + 1)
                return
            self.producer_id, self.producer_epoch = resp.producer_id, resp.producer_epoch
            self._sequences.clear()
            self.trace("producer id %d epoch %d", self.producer_id, self.producer_epoch)
            if then is None:
                self._send_next()
            elif not self._stale(then):
                self._number(then)
                self.checker.on_renumbered(then.values)
                self._send(then)

        self.call(target, "InitProducerId", request, 5_000, answered)

    def topic_deleted(self, topic: str) -> None:
        """The operator deleted `topic`: stop sending to it; a re-created one starts at sequence 0."""
        super().topic_deleted(topic)
        for tp in [tp for tp in self._sequences if tp[0] == topic]:
            del self._sequences[tp]

    def _stale(self, batch: _Batch) -> bool:
        """The batch's topic was deleted since it was made: drop it and go on with the next one."""
        if batch.generation == self.generations.get(batch.tp[0], 0):
            return False
        self.trace("drop batch of deleted topic %s-%d", *batch.tp)
        self.after(CLIENT_RETRY_BACKOFF_MS, self._send_next)
        return True

    def _number(self, batch: _Batch) -> None:
        base = self._sequences.get(batch.tp, 0)
        self._sequences[batch.tp] = base + len(batch.values)
        batch.base_sequence, batch.producer_epoch = base, self.producer_epoch

    # ---- producing ----------------------------------------------------------------------

    def _send_next(self, _: object = None) -> None:
        if self.stopped:
            return
        partitions = sorted(tp for tp in self.metadata.leaders if tp[0] in self.topics)
        if not partitions:
            self.metadata.refresh(lambda: self.after(CLIENT_RETRY_BACKOFF_MS, self._send_next))
            return
        tp = partitions[self._round_robin % len(partitions)]
        self._round_robin += 1
        count = self.rng.randint(1, self.config.records_per_batch_max)
        batch = _Batch(
            tp, [f"{self.name}-{self.seq + i}".encode() for i in range(count)], self.generations.get(tp[0], 0)
        )
        self.seq += count
        if self.idempotent:
            self._number(batch)
        self.checker.on_produce_attempt(batch.values, idempotent=self.idempotent)
        self._send(batch)

    def _send(self, batch: _Batch) -> None:
        if self._stale(batch):
            return
        tp = batch.tp
        leader = self.metadata.leaders.get(tp, -1)
        if leader < 0:
            self._failed(batch)
            return
        if self.idempotent:
            records = encode_values(
                batch.values,
                timestamp_ms=WALL_CLOCK_BASE_MS + self.loop.now_ms,
                producer_id=self.producer_id,
                producer_epoch=batch.producer_epoch,
                base_sequence=batch.base_sequence,
            )
        else:
            records = encode_values(batch.values, timestamp_ms=WALL_CLOCK_BASE_MS + self.loop.now_ms)
        request = common_pb2.ProduceRequest(
            acks=self.acks,
            timeout_ms=self.config.produce_timeout_ms,
            topics=[
                common_pb2.ProduceTopicData(
                    topic=tp[0],
                    partitions=[common_pb2.ProducePartitionData(partition=tp[1], records=records)],
                )
            ],
        )
        self.call(
            broker_node(leader),
            "Produce",
            request,
            self.config.produce_timeout_ms + CLIENT_RPC_SLACK_MS,
            lambda resp: self._answered(batch, resp),
        )

    def _answered(self, batch: _Batch, resp: Any) -> None:
        if self._stale(batch):
            return
        if isinstance(resp, RpcError):
            self._failed(batch)
            return
        pr = resp.topics[0].partitions[0]
        if pr.error_code == common_pb2.NONE:
            self.trace(
                "acked %s-%d @%d acks=%d %d records", *batch.tp, pr.base_offset, self.acks, len(batch.values)
            )
            self.checker.on_produce_ack(self, batch.tp, pr.base_offset, batch.values, self.acks)
            self.after(self.rng.randint(1, self.config.produce_interval_ms_max), self._send_next)
        elif self.idempotent and pr.error_code in (
            common_pb2.OUT_OF_ORDER_SEQUENCE_NUMBER,
            common_pb2.INVALID_PRODUCER_EPOCH,
        ):
            self.trace(
                "%s for %s-%d: bumping the producer epoch",
                common_pb2.ErrorCode.Name(pr.error_code),
                *batch.tp,
            )
            self._init_producer_id(batch)
        else:
            self._failed(batch)

    def _failed(self, batch: _Batch) -> None:
        """Refresh metadata, then send the same batch again (or give up on it and move on)."""

        def retry() -> None:
            if self.stopped:
                return
            if batch.attempt < PRODUCE_ATTEMPTS_MAX or self.idempotent:
                batch.attempt += 1
                self.after(CLIENT_RETRY_BACKOFF_MS, self._send, batch)
            else:
                self.after(CLIENT_RETRY_BACKOFF_MS, self._send_next)

        self.metadata.refresh(retry)


class Consumer(_Client):
    def __init__(
        self,
        index: int,
        loop: EventLoop,
        network: Network,
        rng: random.Random,
        config: SimConfig,
        checker: Checker,
        broker_ids: list[int],
    ) -> None:
        super().__init__(f"k{index}", loop, network, rng, config, checker, broker_ids)
        self.positions: dict[TopicPartitionKey, int] = {}
        self.seen: dict[TopicPartitionKey, dict[int, bytes]] = {}
        # [from, to) ranges a reset to the leader's log start skipped (deleted by retention).
        self.skipped: dict[TopicPartitionKey, list[tuple[int, int]]] = {}
        # Partitions whose fetch loop runs (a fetch in flight or a retry pending).
        self._running: set[TopicPartitionKey] = set()
        self.after(100, self._poll)

    def topic_deleted(self, topic: str) -> None:
        """The operator deleted `topic`: forget it; a re-created one is read from offset 0 again."""
        super().topic_deleted(topic)
        for table in (self.positions, self.seen, self.skipped):
            for tp in [tp for tp in table if tp[0] == topic]:
                del table[tp]
        self._running = {tp for tp in self._running if tp[0] != topic}

    def _poll(self) -> None:
        """Start a fetch loop for every known partition that has none running."""
        for tp in sorted(self.metadata.leaders):
            if tp[0] in self.topics and tp not in self._running:
                self._running.add(tp)
                self._fetch(tp, self.generations.get(tp[0], 0))
        self.metadata.refresh(lambda: None)
        self.after(1_000, self._poll)

    def _fetch(self, tp: TopicPartitionKey, generation: int) -> None:
        """One turn of a partition's fetch loop; the loop ends while the partition has no known leader."""
        if generation != self.generations.get(tp[0], 0):
            return  # the topic was deleted; _running no longer counts this loop
        leader = self.metadata.leaders.get(tp, -1)
        if leader < 0:
            self._running.discard(tp)
            return
        position = self.positions.setdefault(tp, 0)
        request = common_pb2.FetchRequest(
            replica_id=-1,
            max_wait_ms=self.config.consumer_fetch_wait_ms,
            min_bytes=1,
            max_bytes=CONSUMER_PARTITION_MAX_BYTES,
            topics=[
                common_pb2.FetchTopic(
                    topic=tp[0],
                    topic_id=self.metadata.topic_ids.get(tp[0], ""),
                    partitions=[
                        common_pb2.FetchPartition(
                            partition=tp[1],
                            fetch_offset=position,
                            partition_max_bytes=CONSUMER_PARTITION_MAX_BYTES,
                            current_leader_epoch=-1,
                        )
                    ],
                )
            ],
        )
        self.call(
            broker_node(leader),
            "Fetch",
            request,
            self.config.consumer_fetch_wait_ms + self.config.control_rpc_timeout_ms,
            lambda resp: self._answered(tp, generation, position, resp),
        )

    def _answered(self, tp: TopicPartitionKey, generation: int, position: int, resp: Any) -> None:
        if generation != self.generations.get(tp[0], 0):
            return  # an answer about the deleted topic
        if isinstance(resp, RpcError):
            self.after(CLIENT_RETRY_BACKOFF_MS, self._fetch, tp, generation)
            return
        pr = resp.topics[0].partitions[0]
        if pr.error_code == common_pb2.OFFSET_OUT_OF_RANGE and pr.log_start_offset > position:
            # Retention deleted what we had not read yet (auto.offset.reset=earliest).
            self.trace(
                "%s-%d: position %d below the log start %d; resetting", *tp, position, pr.log_start_offset
            )
            self.checker.on_consumer_reset(self, tp, position, pr.log_start_offset, pr.high_watermark)
            self.skipped.setdefault(tp, []).append((position, pr.log_start_offset))
            self.positions[tp] = pr.log_start_offset
            self.after(0, self._fetch, tp, generation)
            return
        if pr.error_code != common_pb2.NONE:
            # OFFSET_OUT_OF_RANGE above the log start included: consumers send no leader epoch
            # (-1), so a deposed leader that has not heard of its successor yet may answer;
            # fresh metadata fixes that. Records that are really gone show up in the final
            # check, not here.
            self.metadata.refresh(lambda: None)
            self.after(CLIENT_RETRY_BACKOFF_MS, self._fetch, tp, generation)
            return
        if pr.records:
            seen = self.seen.setdefault(tp, {})
            for offset, value, epoch in decode_records(pr.records):
                if offset < position:
                    continue  # whole batches come back; skip what we already have
                self.checker.on_consume(self, tp, position, offset, value, epoch, pr.high_watermark)
                seen[offset] = value
                position = offset + 1
            self.positions[tp] = position
        self.after(0, self._fetch, tp, generation)


class Operator(RpcNode):
    """Admin work: topics created and deleted, preferred elections, moves, rolling restarts."""

    def __init__(
        self,
        loop: EventLoop,
        network: Network,
        rng: random.Random,
        config: SimConfig,
        controller_ids: list[int],
        on_topic_created: Callable[[str], None],
    ) -> None:
        super().__init__("admin", loop, network)
        self.rng = rng
        self.config = config
        self.controller_ids = controller_ids
        self.on_topic_created = on_topic_created
        self.created: set[str] = set()
        # Topics whose DeleteTopics was sent and that are not created again yet.
        self.deleting: set[str] = set()
        # Overrides asked for at creation, per topic (kept for its re-creation).
        self.topic_configs: dict[str, dict[str, str]] = {}

    def _to_controller(self, rpc: str, request: Any, done: Callable[[Any], None], attempt: int = 0) -> None:
        """Try the candidates in turn until one is the active controller (NOT_CONTROLLER otherwise)."""
        target = controller_node(self.controller_ids[attempt % len(self.controller_ids)])

        def answered(resp: Any) -> None:
            if isinstance(resp, RpcError) or resp.error_code == common_pb2.NOT_CONTROLLER:
                self.after(200, self._to_controller, rpc, request, done, attempt + 1)
            else:
                done(resp)

        self.call(target, rpc, request, ADMIN_RPC_TIMEOUT_MS, answered)

    def create_topic(self, name: str, configs: dict[str, str] | None = None) -> None:
        """Create `name` (min.insync.replicas plus `configs`), retrying until the controller has it."""
        overrides = self.topic_configs.setdefault(
            name, {"min.insync.replicas": str(self.config.min_insync_replicas), **(configs or {})}
        )
        request = common_pb2.CreateTopicsRequest(
            topics=[
                common_pb2.CreatableTopic(
                    name=name,
                    num_partitions=self.config.partitions_per_topic,
                    replication_factor=self.config.replication_factor,
                    configs=overrides,
                )
            ]
        )

        def done(resp: Any) -> None:
            result = resp.topics[0]
            # TOPIC_ALREADY_EXISTS: an earlier attempt committed and its answer was lost. A
            # re-creation starts only once the deletion answered, so the old topic is gone.
            if result.error_code in (common_pb2.NONE, common_pb2.TOPIC_ALREADY_EXISTS):
                if name not in self.created:
                    self.created.add(name)
                    self.trace("topic %s created%s", name, f" {configs}" if configs else "")
                    self.on_topic_created(name)
            else:
                self.after(500, self.create_topic, name)  # e.g. too few live brokers for the RF

        self._to_controller("CreateTopics", request, done)

    def delete_topic(self, name: str, on_deleted: Callable[[str], None]) -> None:
        """DeleteTopics until the controller says the topic is gone; then on_deleted(name)."""
        self.created.discard(name)
        self.deleting.add(name)
        self.trace("delete topic %s", name)
        request = common_pb2.DeleteTopicsRequest(names=[name], timeout_ms=DELETE_TOPICS_TIMEOUT_MS)

        def done(resp: Any) -> None:
            result = resp.topics[0]
            if result.error_code in (common_pb2.NONE, common_pb2.UNKNOWN_TOPIC_OR_PARTITION):
                self.trace("topic %s deleted", name)
                on_deleted(name)
            else:  # REQUEST_TIMED_OUT: a replica's broker is down; the deletion goes on without us
                self.after(DELETE_TOPICS_RETRY_MS, self._to_controller, "DeleteTopics", request, done)

        self._to_controller("DeleteTopics", request, done)

    def recreate_topic(self, name: str) -> None:
        self.deleting.discard(name)
        self.create_topic(name)

    def preferred_election(self) -> None:
        self._to_controller(
            "ElectLeaders",
            common_pb2.ElectLeadersRequest(election_type=common_pb2.PREFERRED),
            lambda resp: None,
        )

    def reassign(self, tp: TopicPartitionKey, replicas: list[int]) -> None:
        """Move a partition to other brokers (AlterPartitionReassignments;
        the controller walks it through).
        """
        self.trace("reassign %s-%d to %s", *tp, replicas)
        request = common_pb2.AlterPartitionReassignmentsRequest(
            topics=[
                common_pb2.ReassignableTopic(
                    name=tp[0],
                    partitions=[common_pb2.ReassignablePartition(partition=tp[1], replicas=replicas)],
                )
            ]
        )
        self._to_controller("AlterPartitionReassignments", request, lambda resp: None)

    def rolling_restart(
        self, broker: SimBroker, restart_after_ms: int, on_restarted: Callable[[], None]
    ) -> None:
        def stopped() -> None:
            self.loop.call_at(self.loop.now_ms + restart_after_ms, restart)

        def restart() -> None:
            if not broker.up:
                broker.restart_process()
            on_restarted()

        broker.controlled_shutdown(stopped)
