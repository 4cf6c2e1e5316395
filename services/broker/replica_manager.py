"""The broker's replica manager: every partition replica this broker holds.

Kafka's ReplicaManager. It runs on the broker's single asyncio event loop:
that loop is the one owner of all Partition objects, so no locks exist. Pure
rules live in partition.py and fetch_state.py; this module turns requests into
calls on them, waits (the purgatory) and talks to the controller and leaders.

The purgatory is a per-partition set of waiting futures: appends, HW moves and
leadership changes complete them (`notify`), and waiting Produce (acks=all) and
Fetch (long-poll) requests re-check their condition when woken or when their
deadline passes.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from protos.highwater.v1 import broker_pb2, common_pb2, controller_pb2
from services.broker import metrics
from services.broker.fetcher import GrpcLeaderEndpoint, ReplicaFetcher
from services.broker.log import FileStorage, Log, LogConfig
from services.broker.log.checkpoints import HighWatermarkCheckpoint
from services.broker.partition import (
    IsrChange,
    LeaderAndIsrAction,
    LeaderAndIsrState,
    Partition,
    Role,
    decide_leader_and_isr,
)
from services.common import limits
from services.common.errors import (
    FencedLeaderEpoch,
    HighwaterError,
    NotLeaderOrFollower,
    UnknownLeaderEpoch,
    UnknownTopicOrPartition,
)
from services.common.metadata_cache import MetadataCache

log = logging.getLogger("highwater.replica_manager")

TopicPartitionKey = tuple[str, int]
# LeaderAndIsr handles this many partitions between yields to the event loop.
LEADER_AND_ISR_PARTITIONS_PER_YIELD = 10
# The periodic ISR/checkpoint pass yields after this many log flushes (fsyncs) and after
# this many partitions in any case.
FLUSHES_PER_YIELD = 10
ISR_PASS_PARTITIONS_PER_YIELD = 100
# HWs are checkpointed (and retention applied) every this many passes (Kafka: every 5 s).
HW_CHECKPOINT_EVERY_ISR_TICKS = 5
# AlterPartition calls that failed in flight are retried with this back-off.
ALTER_PARTITION_RETRY_BACKOFF_S_MIN = 0.1
ALTER_PARTITION_RETRY_BACKOFF_S_MAX = 2.0
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3


def now_ms() -> int:
    return int(time.time() * 1000)


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


def log_config_from(config: common_pb2.TopicConfig) -> LogConfig:
    """The log settings of a topic config as the controller sent it (0 = default)."""
    defaults = LogConfig()
    return LogConfig(
        segment_bytes=config.segment_bytes or defaults.segment_bytes,
        segment_ms=config.segment_ms or defaults.segment_ms,
        retention_bytes=config.retention_bytes or defaults.retention_bytes,
        retention_ms=config.retention_ms or defaults.retention_ms,
        max_message_bytes=config.max_message_bytes or defaults.max_message_bytes,
    )


class ReplicaManager:
    """All replicas on this broker. Every method runs on the broker's event loop."""

    def __init__(self, *, broker_id: int, data_dir: Path,
                 send_alter_partition: Callable[[controller_pb2.AlterPartitionRequest],
                                                Awaitable[controller_pb2.AlterPartitionResponse]],
                 replica_lag_time_max_ms: int = limits.REPLICA_LAG_TIME_MAX_MS) -> None:
        self.broker_id = broker_id
        self.broker_epoch = -1
        self.data_dir = data_dir
        self.send_alter_partition = send_alter_partition
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.partitions: dict[TopicPartitionKey, Partition] = {}
        # Every replica's HW in one file of the data directory (Kafka's replication-offset-checkpoint).
        self.hw_checkpoint = HighWatermarkCheckpoint(FileStorage(), str(data_dir))
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self.metadata = MetadataCache()
        self.controller_epoch = -1
        self._waiters: dict[TopicPartitionKey, set[asyncio.Future[None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # ---- the purgatory's wake-ups ----------------------------------------------

    def notify(self, tp: TopicPartitionKey) -> None:
        """Wake every request waiting on tp (new data, HW moved, leadership changed)."""
        waiters = self._waiters.pop(tp, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def _wait_any(self, tps: list[TopicPartitionKey], timeout_s: float) -> None:
        """Wait until one of tps changes or timeout_s passes (one future, no task per partition)."""
        if timeout_s <= 0:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for tp in tps:
            self._waiters.setdefault(tp, set()).add(fut)
        try:
            await asyncio.wait([fut], timeout=timeout_s)
        finally:
            for tp in tps:
                waiters = self._waiters.get(tp)
                if waiters is not None:
                    waiters.discard(fut)
                    if not waiters:
                        del self._waiters[tp]

    # ---- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        self._spawn(self._isr_and_checkpoint_loop(), "isr-checker")

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        # Waiting produce and fetch requests answer now (NOT_LEADER_OR_FOLLOWER) instead of
        # hanging until the server's grace period cancels them.
        for tp, p in self.partitions.items():
            p.role = Role.NONE
            self.notify(tp)
        await asyncio.sleep(0)
        for task in list(self._tasks):
            task.cancel()
        for fetcher in list(self.fetchers.values()):
            await fetcher.stop()
        self.fetchers.clear()
        self.checkpoint_high_watermarks()
        for p in self.partitions.values():
            try:
                p.log.close()
            except Exception:
                log.exception("closing the log of %s-%d", p.topic, p.partition)

    def checkpoint_high_watermarks(self) -> None:
        """Write every replica's HW (one file, one fsync; skipped when nothing moved)."""
        try:
            self.hw_checkpoint.write({tp: p.high_watermark for tp, p in self.partitions.items()})
        except Exception:
            log.exception("writing the high watermark checkpoint of %s failed", self.data_dir)

    async def _isr_and_checkpoint_loop(self) -> None:
        """Periodic leader duties: ISR shrink, HW checkpoints, retention (Kafka's scheduler)."""
        ticks = 0
        while True:
            await asyncio.sleep(limits.ISR_CHECK_INTERVAL_MS / 1000)
            ticks += 1
            mono = monotonic_ms()
            wall = now_ms()
            flushed = 0
            for i, p in enumerate(list(self.partitions.values())):
                if flushed >= FLUSHES_PER_YIELD or (i and i % ISR_PASS_PARTITIONS_PER_YIELD == 0):
                    # Flushes fsync: keep requests (and the fetchers) moving.
                    flushed = 0
                    await asyncio.sleep(0)
                    if self.partitions.get((p.topic, p.partition)) is not p:
                        continue  # stopped or deleted while we yielded
                try:
                    p.log.maybe_roll(wall)
                    flushed += int(p.log.maybe_flush(wall))
                except Exception:
                    log.exception("roll/flush of %s-%d failed", p.topic, p.partition)
                change = p.check_isr_shrink(mono, self.replica_lag_time_max_ms)
                if change is not None:
                    log.info("shrinking ISR of %s-%d from %s to %s", p.topic, p.partition, list(p.isr),
                             list(change.new_isr))
                    metrics.ISR_SHRINKS.inc()
                    self._spawn(self._alter_partition(p, change), "alter-partition")
                if ticks % HW_CHECKPOINT_EVERY_ISR_TICKS == 0 and p.role in (Role.LEADER, Role.FOLLOWER):
                    try:
                        p.log.delete_old_segments(now_ms(), p.high_watermark)
                    except Exception:
                        log.exception("retention of %s-%d failed", p.topic, p.partition)
            if ticks % HW_CHECKPOINT_EVERY_ISR_TICKS == 0:
                self.checkpoint_high_watermarks()
            self._update_gauges()

    def _update_gauges(self) -> None:
        metrics.PARTITION_COUNT.set(len(self.partitions))
        metrics.LEADER_COUNT.set(sum(1 for p in self.partitions.values() if p.role is Role.LEADER))
        metrics.UNDER_REPLICATED.set(sum(1 for p in self.partitions.values() if p.under_replicated))
        metrics.FETCHER_MAX_LAG.set(max((f.max_lag for f in self.fetchers.values()), default=0))

    # ---- control plane -----------------------------------------------------------------

    def _check_controller(self, header: common_pb2.ControllerHeader) -> HighwaterError | None:
        from services.common.errors import StaleBrokerEpoch, StaleControllerEpoch
        if header.controller_epoch < self.controller_epoch:
            return StaleControllerEpoch(
                f"controller epoch {header.controller_epoch} is older than {self.controller_epoch} already seen")
        if header.broker_epoch not in (-1, self.broker_epoch):
            return StaleBrokerEpoch(
                f"request for broker epoch {header.broker_epoch}, this incarnation is {self.broker_epoch}")
        self.controller_epoch = header.controller_epoch
        return None

    async def leader_and_isr(self, req: broker_pb2.LeaderAndIsrRequest) -> broker_pb2.LeaderAndIsrResponse:
        """becomeLeaderOrFollower: fence, then split into make-leader and make-follower."""
        err = self._check_controller(req.header)
        if err is not None:
            return broker_pb2.LeaderAndIsrResponse(error_code=err.code, error_message=err.message)
        for node in req.live_leaders:
            # The controller's view is newer than our cache: a restarted leader has a new address.
            self.metadata.brokers[node.broker_id] = node
        results = []
        mono = monotonic_ms()
        for i, item in enumerate(req.partitions):
            if i and i % LEADER_AND_ISR_PARTITIONS_PER_YIELD == 0:
                # Opening logs is synchronous work: let the lease keep-alive and requests run
                # between slices, or a request for thousands of partitions costs the lease.
                await asyncio.sleep(0)
                mono = monotonic_ms()
            s = item.state
            tp = (s.topic, s.partition)
            code, message = common_pb2.NONE, ""
            state = LeaderAndIsrState(s.leader, s.leader_epoch, tuple(s.isr), tuple(s.replicas),
                                      s.partition_epoch, s.controller_epoch)
            try:
                action = decide_leader_and_isr(self.broker_id, self.partitions.get(tp), state)
                if action is LeaderAndIsrAction.NOT_A_REPLICA:
                    log.warning("LeaderAndIsr for %s-%d does not list broker %d among replicas %s; skipped",
                                *tp, self.broker_id, list(s.replicas))
                    code, message = common_pb2.UNKNOWN_TOPIC_OR_PARTITION, "this broker is not a replica"
                elif action is not LeaderAndIsrAction.ISR_UPDATED:
                    p = self.partitions.get(tp) or self._create_partition(s, item.config)
                    p.min_insync_replicas = max(1, item.config.min_insync_replicas or 1)
                    if action is LeaderAndIsrAction.BECOME_LEADER:
                        self._make_leader(p, state, mono)
                    else:
                        self._make_follower(p, state)
                    self.notify(tp)
            except HighwaterError as exc:
                code, message = exc.code, exc.message
            results.append(common_pb2.PartitionResult(topic=s.topic, partition=s.partition, error_code=code,
                                                      error_message=message))
        self._update_gauges()
        return broker_pb2.LeaderAndIsrResponse(partitions=results)

    def _create_partition(self, s: common_pb2.PartitionState, config: common_pb2.TopicConfig) -> Partition:
        directory = self.data_dir / f"{s.topic}-{s.partition}"
        plog = Log.open(directory, log_config_from(config), now_ms=now_ms())
        p = Partition(topic=s.topic, partition=s.partition, local_broker_id=self.broker_id, log=plog)
        p.high_watermark = min(self.hw_checkpoint.stored_at_start((s.topic, s.partition)), plog.log_end_offset)
        p.rebuild_producer_state()
        self.partitions[(s.topic, s.partition)] = p
        return p

    def _make_leader(self, p: Partition, state: LeaderAndIsrState, mono: int) -> None:
        self._remove_from_fetchers((p.topic, p.partition))
        p.become_leader(state, mono)
        p.maybe_advance_high_watermark()
        log.info("became leader of %s-%d at epoch %d, LEO %d, HW %d, ISR %s", p.topic, p.partition,
                 p.leader_epoch, p.log.log_end_offset, p.high_watermark, list(p.isr))

    def _make_follower(self, p: Partition, state: LeaderAndIsrState) -> None:
        tp = (p.topic, p.partition)
        self._remove_from_fetchers(tp)
        p.become_follower(state)
        if state.leader < 0:
            log.info("%s-%d has no leader at epoch %d; not fetching", *tp, state.leader_epoch)
            return
        leader = self.metadata.brokers.get(state.leader)
        if leader is None:
            log.warning("leader %d of %s-%d is not a live broker we know; waiting for metadata", state.leader, *tp)
            return
        fetcher = self._fetcher_for(state.leader, f"{leader.host}:{leader.port}")
        fetcher.add_partition(tp, state.leader_epoch, p.log.log_end_offset)
        log.info("following %d for %s-%d at epoch %d from LEO %d", state.leader, *tp, state.leader_epoch,
                 p.log.log_end_offset)

    def _fetcher_for(self, leader_id: int, address: str) -> ReplicaFetcher:
        """The fetcher for a leader at its current address.

        A leader that restarted listens on a new address: its old fetcher is
        stopped and its partitions move to a new one, starting over in
        TRUNCATING (they may have missed an epoch change).
        """
        fetcher = self.fetchers.get(leader_id)
        if fetcher is not None and fetcher.endpoint.address == address:
            return fetcher
        moved = dict(fetcher.partitions) if fetcher is not None else {}
        if fetcher is not None:
            self._spawn(fetcher.stop(), f"stop-fetcher-{leader_id}")
        fetcher = ReplicaFetcher(
            local_broker_id=self.broker_id, broker_epoch=lambda: self.broker_epoch, leader_id=leader_id,
            endpoint=GrpcLeaderEndpoint(address), callbacks=self)
        self.fetchers[leader_id] = fetcher
        fetcher.start()
        for tp, st in moved.items():
            leo = self.local_leo(tp)
            if leo is not None:
                fetcher.add_partition(tp, st.current_leader_epoch, leo)
        return fetcher

    def _remove_from_fetchers(self, tp: TopicPartitionKey) -> None:
        for fetcher in self.fetchers.values():
            fetcher.remove_partition(tp)

    async def stop_replica(self, req: broker_pb2.StopReplicaRequest) -> broker_pb2.StopReplicaResponse:
        err = self._check_controller(req.header)
        if err is not None:
            return broker_pb2.StopReplicaResponse(error_code=err.code, error_message=err.message)
        results = []
        for item in req.partitions:
            tp = (item.topic, item.partition)
            self._remove_from_fetchers(tp)
            p = self.partitions.get(tp)
            if p is not None:
                p.role = Role.NONE
                self.notify(tp)
                if item.delete_partition:
                    self.partitions.pop(tp, None)
                    self.hw_checkpoint.forget(tp)
                    p.log.close()
                    p.log.delete()
                    log.info("deleted replica %s-%d", *tp)
            elif item.delete_partition:
                self.hw_checkpoint.forget(tp)
                shutil.rmtree(self.data_dir / f"{item.topic}-{item.partition}", ignore_errors=True)
            results.append(common_pb2.PartitionResult(topic=item.topic, partition=item.partition))
        self._update_gauges()
        return broker_pb2.StopReplicaResponse(partitions=results)

    async def update_metadata(self, req: broker_pb2.UpdateMetadataRequest) -> broker_pb2.UpdateMetadataResponse:
        err = self._check_controller(req.header)
        if err is not None:
            return broker_pb2.UpdateMetadataResponse(error_code=err.code, error_message=err.message)
        self.metadata.apply(req)
        for leader_id, fetcher in list(self.fetchers.items()):
            node = self.metadata.brokers.get(leader_id)
            if node is not None and fetcher.endpoint.address != f"{node.host}:{node.port}":
                self._fetcher_for(leader_id, f"{node.host}:{node.port}")
        # ISR changes the controller made (shrinks after failures) reach leaders here too.
        for state in req.partitions:
            p = self.partitions.get((state.topic, state.partition))
            if p is not None and p.role is Role.LEADER:
                p.update_isr(tuple(state.isr), state.partition_epoch, state.leader_epoch)
        return broker_pb2.UpdateMetadataResponse()

    async def _alter_partition(self, p: Partition, change: IsrChange) -> None:
        """Ask the controller to commit an ISR and apply its answer, asking again until answered.

        Runs as its own task, so the retries never block the event loop or other partitions.
        """
        req = controller_pb2.AlterPartitionRequest(
            broker_id=self.broker_id, broker_epoch=self.broker_epoch,
            partitions=[controller_pb2.AlterPartitionItem(
                topic=p.topic, partition=p.partition, leader_epoch=change.leader_epoch,
                partition_epoch=change.partition_epoch, new_isr=list(change.new_isr))])
        backoff_s = ALTER_PARTITION_RETRY_BACKOFF_S_MIN
        while True:
            try:
                resp = await self.send_alter_partition(req)
            except Exception as exc:
                outcome = f"failed: {exc}"
            else:
                if resp.error_code == common_pb2.NONE and resp.partitions:
                    break
                outcome = f"refused: {common_pb2.ErrorCode.Name(resp.error_code)} {resp.error_message}"
            # No answer for the partition (the RPC failed, or NOT_CONTROLLER from a controller
            # that is not, or no longer, active): an earlier copy may have been committed and
            # its answer lost, so the proposal stays pending (the HW keeps counting the member
            # being added) and is asked again until answered or leadership moves on. Clearing
            # it here let a leader count an ISR smaller than the committed one (sim seeds
            # KI-4, 340).
            if p.pending_isr != change.new_isr or p.role is not Role.LEADER or \
                    p.leader_epoch != change.leader_epoch:
                return
            log.warning("AlterPartition for %s-%d %s; retrying in %.1f s", p.topic, p.partition, outcome, backoff_s)
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, ALTER_PARTITION_RETRY_BACKOFF_S_MAX)
        result = resp.partitions[0]
        if result.HasField("state"):
            st = result.state
            p.update_isr(tuple(st.isr), st.partition_epoch, st.leader_epoch)
        if result.error_code != common_pb2.NONE:
            log.info("AlterPartition for %s-%d: %s (%s); state re-read", p.topic, p.partition,
                     common_pb2.ErrorCode.Name(result.error_code), result.error_message)
        p.isr_change_failed()  # clears pending either way; the next check proposes again if needed
        p.maybe_advance_high_watermark()
        self.notify((p.topic, p.partition))

    # ---- produce ------------------------------------------------------------------------

    async def produce(self, req: common_pb2.ProduceRequest) -> common_pb2.ProduceResponse:
        timeout_ms = min(req.timeout_ms or limits.PRODUCE_TIMEOUT_MS_DEFAULT, limits.PRODUCE_TIMEOUT_MS_MAX)
        deadline = time.monotonic() + timeout_ms / 1000
        results: dict[TopicPartitionKey, common_pb2.ProducePartitionResponse] = {}
        waiting: dict[TopicPartitionKey, int] = {}
        wall = now_ms()
        for topic in req.topics:
            for pd in topic.partitions:
                tp = (topic.topic, pd.partition)
                # base_offset stays -1 unless the batches were appended: a gateway may retry
                # a failed partition on its own only when nothing of it was written.
                res = common_pb2.ProducePartitionResponse(partition=pd.partition, log_append_time_ms=-1,
                                                          base_offset=-1)
                try:
                    p = self._leader_partition(tp)
                    records = pd.records  # each read of a bytes field copies it: read once
                    info = p.append_as_leader(records, acks=req.acks, now_ms=wall)
                    res.base_offset = info.first_offset
                    res.log_start_offset = p.log.log_start_offset
                    if not info.duplicate:
                        metrics.BYTES_IN.labels(topic.topic).inc(len(records))
                        self.notify(tp)
                    if req.acks == -1:
                        waiting[tp] = info.next_offset
                except HighwaterError as exc:
                    res.error_code, res.error_message = exc.code, exc.message
                results[tp] = res
        while waiting:
            for tp, required in list(waiting.items()):
                p = self.partitions.get(tp)
                res = results[tp]
                if p is None or p.role is not Role.LEADER:
                    res.error_code = common_pb2.NOT_LEADER_OR_FOLLOWER
                    res.error_message = "leadership moved before the write was replicated to the ISR"
                    del waiting[tp]
                elif p.high_watermark >= required:
                    if len(p.isr) < p.min_insync_replicas:
                        res.error_code = common_pb2.NOT_ENOUGH_REPLICAS_AFTER_APPEND
                        res.error_message = (f"written, but the ISR {list(p.isr)} shrank below "
                                             f"min.insync.replicas={p.min_insync_replicas}")
                    del waiting[tp]
            remaining = deadline - time.monotonic()
            if waiting and remaining <= 0:
                for tp in waiting:
                    results[tp].error_code = common_pb2.REQUEST_TIMED_OUT
                    results[tp].error_message = f"the ISR did not acknowledge within {timeout_ms} ms"
                break
            if waiting:
                await self._wait_any(list(waiting), remaining)
        by_topic: dict[str, list[common_pb2.ProducePartitionResponse]] = {}
        for (topic, _), res in results.items():
            by_topic.setdefault(topic, []).append(res)
        return common_pb2.ProduceResponse(
            topics=[common_pb2.ProduceTopicResponse(topic=t, partitions=ps) for t, ps in by_topic.items()])

    def _leader_partition(self, tp: TopicPartitionKey) -> Partition:
        p = self.partitions.get(tp)
        if p is None:
            if tp[0] not in self.metadata.topics():
                raise UnknownTopicOrPartition(f"topic-partition {tp[0]}-{tp[1]} does not exist")
            state = self.metadata.partitions.get(tp)
            if state is None:
                raise UnknownTopicOrPartition(f"topic {tp[0]} has no partition {tp[1]}")
            raise NotLeaderOrFollower(f"broker {self.broker_id} holds no replica of {tp[0]}-{tp[1]} "
                                      f"(leader is {state.leader})")
        if p.role is not Role.LEADER:
            raise NotLeaderOrFollower(f"broker {self.broker_id} is not the leader of {tp[0]}-{tp[1]} "
                                      f"(leader is {p.leader_id})")
        return p

    # ---- fetch ----------------------------------------------------------------------------

    async def fetch(self, req: common_pb2.FetchRequest) -> common_pb2.FetchResponse:
        is_follower = req.replica_id >= 0
        if is_follower:
            self._record_follower_fetches(req)
        max_wait_s = min(req.max_wait_ms, limits.FETCH_MAX_WAIT_MS_MAX) / 1000
        deadline = time.monotonic() + max_wait_s
        tps = [(t.topic, p.partition) for t in req.topics for p in t.partitions]
        while True:
            resp, total_bytes, has_error = self._read_all(req, is_follower)
            remaining = deadline - time.monotonic()
            if (req.max_wait_ms <= 0 or not tps or total_bytes >= max(req.min_bytes, 1) or has_error
                    or remaining <= 0):
                return resp
            await self._wait_any(tps, remaining)

    def _record_follower_fetches(self, req: common_pb2.FetchRequest) -> None:
        mono = monotonic_ms()
        for t in req.topics:
            for fp in t.partitions:
                tp = (t.topic, fp.partition)
                p = self.partitions.get(tp)
                if p is None or p.role is not Role.LEADER:
                    continue
                if fp.current_leader_epoch >= 0 and fp.current_leader_epoch != p.leader_epoch:
                    continue
                hw_before = p.high_watermark
                change = p.record_follower_fetch(req.replica_id, fp.fetch_offset, mono)
                if change is not None:
                    log.info("expanding ISR of %s-%d from %s to %s", *tp, list(p.isr), list(change.new_isr))
                    metrics.ISR_EXPANDS.inc()
                    self._spawn(self._alter_partition(p, change), "alter-partition")
                if p.high_watermark != hw_before:
                    self.notify(tp)

    def _read_all(self, req: common_pb2.FetchRequest, is_follower: bool
                  ) -> tuple[common_pb2.FetchResponse, int, bool]:
        """Read every asked partition into one response, built in place.

        Building with .add() matters: composing finished sub-messages makes
        protobuf copy every record batch again at each level.
        """
        total = 0
        has_error = False
        budget = req.max_bytes or limits.FETCH_MAX_BYTES_DEFAULT
        resp = common_pb2.FetchResponse()
        for t in req.topics:
            out_topic = resp.topics.add(topic=t.topic)
            for fp in t.partitions:
                tp = (t.topic, fp.partition)
                pr = out_topic.partitions.add(partition=fp.partition, high_watermark=-1, log_start_offset=-1,
                                              log_end_offset=-1)
                try:
                    p = self._fetchable_partition(tp, fp.current_leader_epoch)
                    pr.high_watermark = p.high_watermark
                    pr.log_start_offset = p.log.log_start_offset
                    pr.log_end_offset = p.log.log_end_offset
                    pr.leader_epoch = p.leader_epoch
                    max_offset = None if is_follower else p.high_watermark
                    limit = min(fp.partition_max_bytes or limits.FETCH_PARTITION_MAX_BYTES_DEFAULT, budget)
                    if fp.fetch_offset == (p.log.log_end_offset if is_follower else p.high_watermark) \
                            and fp.fetch_offset >= p.log.log_start_offset:
                        continue
                    info = p.log.read(fp.fetch_offset, max_bytes=max(limit, 1), max_offset=max_offset,
                                      min_one_message=total == 0)
                    size = len(info.records)
                    if size:
                        pr.records = info.records
                        total += size
                        budget = max(budget - size, 0)
                        if not is_follower:
                            metrics.BYTES_OUT.labels(t.topic).inc(size)
                except HighwaterError as exc:
                    pr.error_code, pr.error_message = exc.code, exc.message
                    has_error = True
        return resp, total, has_error

    def _fetchable_partition(self, tp: TopicPartitionKey, current_leader_epoch: int) -> Partition:
        local = self.partitions.get(tp)
        if local is not None and current_leader_epoch > local.leader_epoch:
            # As Kafka (checkCurrentLeaderEpoch before the leader check): a follower that heard
            # of the new epoch first learns that we have not yet, and retries soon, instead of
            # being told we do not lead and backing off as from a wrong leader.
            raise UnknownLeaderEpoch(f"leader epoch {current_leader_epoch} is newer than {local.leader_epoch}")
        p = self._leader_partition(tp)
        if current_leader_epoch >= 0:
            if current_leader_epoch < p.leader_epoch:
                raise FencedLeaderEpoch(f"leader epoch {current_leader_epoch} is older than {p.leader_epoch}")
            if current_leader_epoch > p.leader_epoch:
                raise UnknownLeaderEpoch(f"leader epoch {current_leader_epoch} is newer than {p.leader_epoch}")
        return p

    # ---- fetcher callbacks (FollowerCallbacks) -------------------------------------------

    def local_leo(self, tp: TopicPartitionKey) -> int | None:
        p = self.partitions.get(tp)
        return p.log.log_end_offset if p is not None else None

    def local_log_start(self, tp: TopicPartitionKey) -> int:
        p = self.partitions.get(tp)
        return p.log.log_start_offset if p is not None else 0

    def latest_local_epoch(self, tp: TopicPartitionKey) -> int | None:
        p = self.partitions.get(tp)
        return p.log.leader_epoch_cache.latest_epoch() if p is not None else None

    def local_end_offset_for_epoch(self, tp: TopicPartitionKey, epoch: int) -> int:
        p = self.partitions.get(tp)
        if p is None:
            return 0
        _, end = p.log.leader_epoch_cache.end_offset_for_epoch(epoch)
        return end if end >= 0 else p.log.log_end_offset

    def truncate(self, tp: TopicPartitionKey, offset: int) -> None:
        p = self.partitions.get(tp)
        if p is not None:
            p.truncate_to(offset)

    def truncate_fully_and_start_at(self, tp: TopicPartitionKey, offset: int) -> None:
        p = self.partitions.get(tp)
        if p is not None:
            p.log.truncate_fully_and_start_at(offset)
            p.high_watermark = offset
            p.rebuild_producer_state()

    def append_fetched(self, tp: TopicPartitionKey, fetch_offset: int,
                       response: common_pb2.FetchPartitionResponse) -> None:
        p = self.partitions.get(tp)
        if p is None or p.role is not Role.FOLLOWER:
            return
        if response.records:
            p.append_as_follower(response.records, now_ms=now_ms())
        if p.update_follower_high_watermark(response.high_watermark):
            self.notify(tp)

    # ---- other reads --------------------------------------------------------------------------

    def list_offsets(self, req: common_pb2.ListOffsetsRequest) -> common_pb2.ListOffsetsResponse:
        topics = []
        for t in req.topics:
            parts = []
            for lp in t.partitions:
                tp = (t.topic, lp.partition)
                res = common_pb2.ListOffsetsPartitionResponse(partition=lp.partition, timestamp=-1, offset=-1)
                try:
                    p = self._fetchable_partition(tp, lp.current_leader_epoch)
                    res.leader_epoch = p.leader_epoch
                    if lp.timestamp == EARLIEST_TIMESTAMP:
                        res.offset = p.log.log_start_offset
                    elif lp.timestamp == LATEST_TIMESTAMP:
                        res.offset = p.high_watermark
                    else:
                        found = p.log.offset_for_timestamp(lp.timestamp if lp.timestamp >= 0 else 0)
                        if found is not None and found[0] < p.high_watermark:
                            res.offset, res.timestamp = found
                except HighwaterError as exc:
                    res.error_code, res.error_message = exc.code, exc.message
                parts.append(res)
            topics.append(common_pb2.ListOffsetsTopicResponse(topic=t.topic, partitions=parts))
        return common_pb2.ListOffsetsResponse(topics=topics)

    def offsets_for_leader_epoch(self, req: broker_pb2.OffsetsForLeaderEpochRequest
                                 ) -> broker_pb2.OffsetsForLeaderEpochResponse:
        topics = []
        for t in req.topics:
            parts = []
            for op in t.partitions:
                tp = (t.topic, op.partition)
                res = broker_pb2.EpochEndOffset(partition=op.partition, leader_epoch=-1, end_offset=-1)
                try:
                    p = self._fetchable_partition(tp, op.current_leader_epoch)
                    epoch, end = p.log.leader_epoch_cache.end_offset_for_epoch(op.leader_epoch)
                    if epoch == p.leader_epoch or (epoch >= 0 and end < 0):
                        end = p.log.log_end_offset
                    res.leader_epoch, res.end_offset = epoch, end
                except HighwaterError as exc:
                    res.error_code = exc.code
                parts.append(res)
            topics.append(broker_pb2.OffsetsForLeaderEpochTopicResult(topic=t.topic, partitions=parts))
        return broker_pb2.OffsetsForLeaderEpochResponse(topics=topics)
