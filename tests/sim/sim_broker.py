"""A broker in the simulation: ReplicaManager's and ReplicaFetcher's glue, message-driven and synchronous.

The rules are the real ones. Partition, Log (on MemoryStorage), PartitionFetchState
and truncation_offset are the imported modules; ReplicaManager methods that never
wait and never read a clock (answering Fetch reads, OffsetsForLeaderEpoch, controller
fencing, UpdateMetadata, StopReplica, the follower callbacks) are the real functions,
bound to this class below. What is re-implemented here is only what in the real broker
awaits or reads the clock, kept in the same order as replica_manager.py and fetcher.py:

- leader_and_isr / _make_leader / _make_follower / _create_partition (they read
  monotonic_ms() and open files);
- produce's acks=all wait and fetch's long-poll (the purgatory: here a table of
  waiting requests re-checked on every notify() and at their deadline);
- _record_follower_fetches and _alter_partition (an awaited RPC to the controller);
- append_fetched (it reads now_ms());
- the ISR-shrink/HW-checkpoint loop, and ReplicaFetcher's maybe_truncate/maybe_fetch
  loop, as timers and RPC callbacks.

A crash drops every volatile structure (a new incarnation); the MemoryStorage is the
disk and survives, losing its unflushed bytes on a power loss.

Test switch: with `Safety.leader_epoch_truncation` off, a truncating follower skips
OffsetsForLeaderEpoch and truncates to its own high watermark (Kafka before KIP-101).
"""

from __future__ import annotations

import dataclasses
import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from coordinator.election import current_controller
from coordinator.store import CoordinatorError, Get, Put, compare_missing, json_bytes
from protos.highwater.v1 import broker_pb2, common_pb2, controller_pb2
from services.broker.fetch_state import (
    FetchPhase,
    PartitionFetchState,
    backoff_after_error,
    truncation_offset,
)
from services.broker.log import Log, MemoryStorage
from services.broker.log.checkpoints import HighWatermarkCheckpoint
from services.broker.partition import (
    IsrChange,
    LeaderAndIsrAction,
    LeaderAndIsrState,
    Partition,
    Role,
    decide_leader_and_isr,
)
from services.broker.replica_manager import ReplicaManager, log_config_from
from services.common import limits
from services.common.errors import HighwaterError
from services.common.metadata_cache import MetadataCache
from tests.sim.clock import EventLoop
from tests.sim.config import WALL_CLOCK_BASE_MS, SimConfig
from tests.sim.network import Envelope, Network, RpcError, RpcNode
from tests.sim.sim_etcd import SimEtcd, SimLease, run_sync

if TYPE_CHECKING:
    from tests.sim.checker import Checker

TopicPartitionKey = tuple[str, int]

# The fetcher's sleep when every partition is delayed (fetcher.py: min(backoff, 100) ms).
FETCHER_IDLE_SLEEP_MS_MAX = 100
# The fetcher's wait for a first partition (fetcher.py: wait_for(wakeup, timeout=1.0)).
FETCHER_EMPTY_WAIT_MS = 1_000
# HW checkpoint and retention run every this many ISR checks (replica_manager.py: ticks % 5).
CHECKPOINT_EVERY_ISR_TICKS = 5
CONTROLLED_SHUTDOWN_ATTEMPTS_MAX = 3  # services/broker/server.py
# Bytes of log between offset-index entries in simulated logs (LogConfig's default is 4096).
SIM_INDEX_INTERVAL_BYTES = 512


def controller_node(controller_id: int) -> str:
    return f"c{controller_id}"


def broker_node(broker_id: int) -> str:
    return f"b{broker_id}"


@dataclass(slots=True)
class AppendRecord:
    """What a leader appended for one produce partition: for the checker's acks=all rule."""

    tp: TopicPartitionKey
    leader_epoch: int
    first_offset: int
    next_offset: int
    # Incarnation of every broker when the leader appended: a member that restarted
    # since may legitimately lack the record (its lease still counts it in the ISR).
    incarnations: dict[int, int]
    # An idempotent retry answered with the offsets of the first write (nothing appended now).
    duplicate: bool = False


@dataclass(slots=True)
class _WaitingProduce:
    request: Envelope
    results: dict[TopicPartitionKey, common_pb2.ProducePartitionResponse]
    waiting: dict[TopicPartitionKey, int]
    appended: dict[TopicPartitionKey, AppendRecord]
    deadline_ms: int
    timeout_ms: int
    done: bool = False


@dataclass(slots=True)
class _WaitingFetch:
    request: Envelope
    fetch: common_pb2.FetchRequest
    is_follower: bool
    deadline_ms: int
    done: bool = False


@dataclass(slots=True)
class _Purgatory:
    """Requests waiting on partitions (replica_manager.py's per-partition 'changed' events)."""

    by_tp: dict[TopicPartitionKey, list[_WaitingProduce | _WaitingFetch]] = field(default_factory=dict)

    def add(self, tps: list[TopicPartitionKey], waiter: _WaitingProduce | _WaitingFetch) -> None:
        for tp in set(tps):
            self.by_tp.setdefault(tp, []).append(waiter)


class SimBroker(RpcNode):
    """One broker process; a crash starts a new incarnation on the same MemoryStorage."""

    # ---- the real ReplicaManager's synchronous rules, reused as they are --------------
    # They touch only self.partitions / self.metadata / self.controller_epoch /
    # self.broker_epoch and never wait, so they run here unchanged.
    _check_controller = ReplicaManager._check_controller
    _read_all = ReplicaManager._read_all
    _leader_partition = ReplicaManager._leader_partition
    _fetchable_partition = ReplicaManager._fetchable_partition
    offsets_for_leader_epoch = ReplicaManager.offsets_for_leader_epoch
    update_metadata = ReplicaManager.update_metadata
    stop_replica = ReplicaManager.stop_replica
    checkpoint_high_watermarks = ReplicaManager.checkpoint_high_watermarks
    local_leo = ReplicaManager.local_leo
    local_log_start = ReplicaManager.local_log_start
    latest_local_epoch = ReplicaManager.latest_local_epoch
    local_end_offset_for_epoch = ReplicaManager.local_end_offset_for_epoch
    truncate = ReplicaManager.truncate
    truncate_fully_and_start_at = ReplicaManager.truncate_fully_and_start_at

    def __init__(self, broker_id: int, loop: EventLoop, network: Network, etcd: SimEtcd, config: SimConfig,
                 rng: random.Random, checker: Checker) -> None:
        super().__init__(broker_node(broker_id), loop, network)
        self.broker_id = broker_id
        self.config = config
        self.rng = rng
        self.checker = checker
        self.etcd = etcd
        self.etcd_client = etcd.client(self)
        self.storage = MemoryStorage()  # the disk: outlives every incarnation
        self.data_dir = PurePosixPath(f"/sim/{self.name}")
        self.replica_lag_time_max_ms = config.replica_lag_time_max_ms
        # Fault knobs.
        self.disk_delay_ms = 0
        self.shutting_down = False
        self._start_process()

    # ---- process lifecycle ---------------------------------------------------------------

    def _start_process(self) -> None:
        """What `highwater broker` does at start: fresh state, timers, then registration."""
        # A new process listens on a new port: peers still dialling the old one are refused.
        self.port = 9092 + self.incarnation
        self.address = f"{self.name}:{self.port}"
        self.broker_epoch = -1
        self.partitions: dict[TopicPartitionKey, Partition] = {}
        self.hw_checkpoint = HighWatermarkCheckpoint(self.storage, str(self.data_dir))
        self.fetchers: dict[int, SimFetcher] = {}
        self.metadata = MetadataCache()
        self.controller_epoch = -1
        self.lease: SimLease | None = None
        self.purgatory = _Purgatory()
        self._isr_ticks = 0
        self.shutting_down = False
        self.after(self.config.isr_check_interval_ms, self._isr_and_checkpoint_tick)
        self._register()

    def wall_ms(self) -> int:
        return WALL_CLOCK_BASE_MS + self.loop.now_ms

    def crash_process(self, *, power_loss: bool) -> None:
        """kill -9 (files keep what was written) or a power cut (unflushed bytes are lost)."""
        for p in self.partitions.values():
            p.log.abandon()
        if power_loss:
            self.storage.crash(self.rng)
        self.trace("CRASH%s", " (power loss)" if power_loss else "")
        self.crash()

    def restart_process(self) -> None:
        self.restart()
        self.trace("restart")
        self._start_process()

    def _register(self) -> None:
        """coordinator/registration.register_broker: a lease, then the key if missing."""
        if not self.up:
            return
        key = self.etcd.keys.broker(self.broker_id)
        try:
            lease = SimLease(self, self.etcd_client, self.config.lease_ttl_s, on_lost=self._on_lease_lost)
        except CoordinatorError:
            self.after(self.config.register_retry_ms, self._register)
            return
        info = {"broker_id": self.broker_id, "host": self.name, "port": self.port, "rack": "", "metrics_port": 0}
        try:
            result = run_sync(self.etcd_client.txn(
                [compare_missing(key)], [Put(key, json_bytes(info), lease=lease.lease_id), Get(key)], [Get(key)]))
        except CoordinatorError:
            lease.stop(revoke=True)
            self.after(self.config.register_retry_ms, self._register)
            return
        if not result.succeeded:
            lease.stop(revoke=True)  # BrokerIdInUse: the old incarnation's lease has not expired yet
            self.after(self.config.register_retry_ms, self._register)
            return
        self.lease = lease
        self.broker_epoch = result.gets[0][0].create_revision
        self.trace("registered, broker epoch %d", self.broker_epoch)

    def _on_lease_lost(self) -> None:
        """server.py watch_lease: register again as a new incarnation (same data, new broker epoch)."""
        if not self.shutting_down:
            self._register()

    # ---- the purgatory ----------------------------------------------------------------------

    def notify(self, tp: TopicPartitionKey) -> None:
        """New data, HW moved or leadership changed on tp: re-check every request waiting on it."""
        waiters = self.purgatory.by_tp.get(tp)
        if not waiters:
            return
        for waiter in list(waiters):
            if waiter.done:
                continue
            if isinstance(waiter, _WaitingProduce):
                self._check_produce(waiter)
            else:
                self._check_fetch(waiter)
        self.purgatory.by_tp[tp] = [w for w in waiters if not w.done]

    def _update_gauges(self) -> None:
        pass  # metrics are not simulated

    # ---- periodic leader duties (_isr_and_checkpoint_loop) --------------------------------

    def _isr_and_checkpoint_tick(self) -> None:
        self._isr_ticks += 1
        now = self.loop.now_ms
        wall = self.wall_ms()
        for p in list(self.partitions.values()):
            p.log.maybe_roll(wall)
            p.log.maybe_flush(wall)
            change = p.check_isr_shrink(now, self.replica_lag_time_max_ms)
            if change is not None:
                self.trace("shrink ISR of %s-%d %s -> %s", p.topic, p.partition, list(p.isr), list(change.new_isr))
                self._alter_partition(p, change)
            if self._isr_ticks % CHECKPOINT_EVERY_ISR_TICKS == 0 and p.role in (Role.LEADER, Role.FOLLOWER):
                p.log.delete_old_segments(self.wall_ms(), p.high_watermark)
        if self._isr_ticks % CHECKPOINT_EVERY_ISR_TICKS == 0:
            self.checkpoint_high_watermarks()
        self.after(self.config.isr_check_interval_ms, self._isr_and_checkpoint_tick)

    # ---- requests --------------------------------------------------------------------------

    def on_request(self, env: Envelope) -> None:
        rpc = env.rpc
        if rpc == "Fetch":
            self._fetch(env)
        elif rpc == "Produce":
            self._produce(env)
        elif rpc == "OffsetsForLeaderEpoch":
            self.reply(env, self.offsets_for_leader_epoch(env.body))
        elif rpc == "LeaderAndIsr":
            self.reply(env, self._leader_and_isr(env.body))
        elif rpc == "UpdateMetadata":
            self.reply(env, run_sync(self.update_metadata(env.body)))
        elif rpc == "StopReplica":
            self.reply(env, run_sync(self.stop_replica(env.body)))
        elif rpc == "Metadata":
            self.reply(env, self.metadata.metadata_response(list(env.body.topics)))
        else:
            raise ValueError(f"{self.name}: unknown rpc {rpc}")

    # ---- control plane (leader_and_isr and friends) -----------------------------------------

    def _leader_and_isr(self, req: broker_pb2.LeaderAndIsrRequest) -> broker_pb2.LeaderAndIsrResponse:
        """replica_manager.leader_and_isr, with the simulation clock."""
        err = self._check_controller(req.header)
        if err is not None:
            return broker_pb2.LeaderAndIsrResponse(error_code=err.code, error_message=err.message)
        for node in req.live_leaders:
            self.metadata.brokers[node.broker_id] = node
        results = []
        mono = self.loop.now_ms
        for item in req.partitions:
            s = item.state
            tp = (s.topic, s.partition)
            code, message = common_pb2.NONE, ""
            state = LeaderAndIsrState(s.leader, s.leader_epoch, tuple(s.isr), tuple(s.replicas),
                                      s.partition_epoch, s.controller_epoch)
            try:
                action = decide_leader_and_isr(self.broker_id, self.partitions.get(tp), state)
                if action is LeaderAndIsrAction.NOT_A_REPLICA:
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
        return broker_pb2.LeaderAndIsrResponse(partitions=results)

    def _create_partition(self, s: common_pb2.PartitionState, config: common_pb2.TopicConfig) -> Partition:
        directory = str(self.data_dir / f"{s.topic}-{s.partition}")
        # A denser offset index than the default: the same lookup logic, shorter header scans
        # per read (our batches are ~100 bytes, so 4 KiB apart would mean ~40 headers a read).
        log_config = dataclasses.replace(log_config_from(config), index_interval_bytes=SIM_INDEX_INTERVAL_BYTES)
        plog = Log.open(directory, log_config, storage=self.storage, now_ms=self.wall_ms())
        p = Partition(topic=s.topic, partition=s.partition, local_broker_id=self.broker_id, log=plog)
        p.high_watermark = min(self.hw_checkpoint.stored_at_start((s.topic, s.partition)), plog.log_end_offset)
        p.rebuild_producer_state()
        self.partitions[(s.topic, s.partition)] = p
        return p

    def _make_leader(self, p: Partition, state: LeaderAndIsrState, mono: int) -> None:
        self._remove_from_fetchers((p.topic, p.partition))
        p.become_leader(state, mono)
        p.maybe_advance_high_watermark()
        self.trace("leader of %s-%d at epoch %d, LEO %d, HW %d, ISR %s", p.topic, p.partition, p.leader_epoch,
                   p.log.log_end_offset, p.high_watermark, list(p.isr))
        self.checker.on_become_leader(self, p)

    def _make_follower(self, p: Partition, state: LeaderAndIsrState) -> None:
        tp = (p.topic, p.partition)
        self._remove_from_fetchers(tp)
        p.become_follower(state)
        if state.leader < 0:
            self.trace("%s-%d has no leader at epoch %d", p.topic, p.partition, state.leader_epoch)
            return
        leader = self.metadata.brokers.get(state.leader)
        if leader is None:
            self.trace("leader %d of %s-%d unknown; waiting for metadata", state.leader, *tp)
            return
        fetcher = self._fetcher_for(state.leader, f"{leader.host}:{leader.port}")
        fetcher.add_partition(tp, state.leader_epoch, p.log.log_end_offset)
        self.trace("follow %d for %s-%d at epoch %d from LEO %d HW %d", state.leader, *tp, state.leader_epoch,
                   p.log.log_end_offset, p.high_watermark)

    def _fetcher_for(self, leader_id: int, address: str) -> SimFetcher:
        """replica_manager._fetcher_for: a restarted leader's partitions move to a new fetcher."""
        fetcher = self.fetchers.get(leader_id)
        if fetcher is not None and fetcher.endpoint.address == address:
            return fetcher
        moved = dict(fetcher.partitions) if fetcher is not None else {}
        if fetcher is not None:
            fetcher.stop()
        fetcher = SimFetcher(self, leader_id, address)
        self.fetchers[leader_id] = fetcher
        for tp, st in moved.items():
            leo = self.local_leo(tp)
            if leo is not None:
                fetcher.add_partition(tp, st.current_leader_epoch, leo)
        return fetcher

    def _remove_from_fetchers(self, tp: TopicPartitionKey) -> None:
        for fetcher in self.fetchers.values():
            fetcher.remove_partition(tp)

    # ---- AlterPartition (an awaited RPC in the real broker) ---------------------------------

    def _controller_address(self) -> str | None:
        """ControllerClient._address: the active controller as etcd names it."""
        try:
            info = run_sync(current_controller(self.etcd_client))
        except CoordinatorError:
            return None
        return controller_node(int(info["controller_id"])) if info else None

    def _alter_partition(self, p: Partition, change: IsrChange, backoff_ms: int = 100) -> None:
        req = controller_pb2.AlterPartitionRequest(
            broker_id=self.broker_id, broker_epoch=self.broker_epoch,
            partitions=[controller_pb2.AlterPartitionItem(
                topic=p.topic, partition=p.partition, leader_epoch=change.leader_epoch,
                partition_epoch=change.partition_epoch, new_isr=list(change.new_isr))])
        address = self._controller_address()
        if address is None:  # "no active controller registered in etcd": ask again later (KI-4)
            self.after(backoff_ms, self._alter_partition_retry, p, change, min(backoff_ms * 2, 2000))
            return
        self.call(address, "AlterPartition", req, self.config.control_rpc_timeout_ms,
                  lambda resp: self._alter_partition_done(p, resp, change, backoff_ms))

    def _alter_partition_retry(self, p: Partition, change: IsrChange, backoff_ms: int) -> None:
        if p.pending_isr == change.new_isr and p.role is Role.LEADER and p.leader_epoch == change.leader_epoch:
            self._alter_partition(p, change, backoff_ms)

    def _alter_partition_done(self, p: Partition, resp: controller_pb2.AlterPartitionResponse | RpcError,
                              change: IsrChange | None = None, backoff_ms: int = 100) -> None:
        if isinstance(resp, RpcError) or resp.error_code != common_pb2.NONE or not resp.partitions:
            # ReplicaManager._alter_partition: no answer for the partition (the RPC failed, or
            # NOT_CONTROLLER): the controller may have committed an earlier copy, so the
            # proposal stays pending and is sent again until answered or leadership moves
            # (KI-4, seed 340).
            if change is not None and p.pending_isr == change.new_isr and p.role is Role.LEADER \
                    and p.leader_epoch == change.leader_epoch:
                self.after(backoff_ms, self._alter_partition_retry, p, change, min(backoff_ms * 2, 2000))
            return
        result = resp.partitions[0]
        if result.HasField("state"):
            st = result.state
            p.update_isr(tuple(st.isr), st.partition_epoch, st.leader_epoch)
        p.isr_change_failed()  # clears pending either way; the next check proposes again if needed
        p.maybe_advance_high_watermark()
        self.notify((p.topic, p.partition))

    # ---- produce ----------------------------------------------------------------------------

    def _produce(self, env: Envelope) -> None:
        req: common_pb2.ProduceRequest = env.body
        timeout_ms = min(req.timeout_ms or limits.PRODUCE_TIMEOUT_MS_DEFAULT, limits.PRODUCE_TIMEOUT_MS_MAX)
        results: dict[TopicPartitionKey, common_pb2.ProducePartitionResponse] = {}
        waiting: dict[TopicPartitionKey, int] = {}
        appended: dict[TopicPartitionKey, AppendRecord] = {}
        wall = self.wall_ms()
        for topic in req.topics:
            for pd in topic.partitions:
                tp = (topic.topic, pd.partition)
                res = common_pb2.ProducePartitionResponse(partition=pd.partition, log_append_time_ms=-1,
                                                          base_offset=-1)
                try:
                    p = self._leader_partition(tp)
                    info = p.append_as_leader(pd.records, acks=req.acks, now_ms=wall)
                    res.base_offset = info.first_offset
                    res.log_start_offset = p.log.log_start_offset
                    self.trace("append %s-%d [%d, %d) epoch %d acks=%d%s", *tp, info.first_offset, info.next_offset,
                               p.leader_epoch, req.acks, " (duplicate)" if info.duplicate else "")
                    if not info.duplicate:
                        self.notify(tp)
                        self._disk_write()
                    if req.acks == -1:
                        waiting[tp] = info.next_offset
                        appended[tp] = AppendRecord(tp, p.leader_epoch, info.first_offset, info.next_offset,
                                                    self.checker.incarnations(), info.duplicate)
                except HighwaterError as exc:
                    res.error_code, res.error_message = exc.code, exc.message
                results[tp] = res
        waiter = _WaitingProduce(env, results, waiting, appended, self.loop.now_ms + timeout_ms, timeout_ms)
        self._check_produce(waiter)
        if not waiter.done:
            self.purgatory.add(list(waiting), waiter)
            self.after(timeout_ms, self._expire, waiter)

    def _check_produce(self, w: _WaitingProduce) -> None:
        """The body of produce()'s wait loop: done when every partition is answered."""
        for tp, required in list(w.waiting.items()):
            p = self.partitions.get(tp)
            res = w.results[tp]
            if p is None or p.role is not Role.LEADER:
                res.error_code = common_pb2.NOT_LEADER_OR_FOLLOWER
                res.error_message = "leadership moved before the write was replicated to the ISR"
                del w.waiting[tp]
            elif p.high_watermark >= required:
                if len(p.isr) < p.min_insync_replicas:
                    res.error_code = common_pb2.NOT_ENOUGH_REPLICAS_AFTER_APPEND
                    res.error_message = (f"written, but the ISR {list(p.isr)} shrank below "
                                         f"min.insync.replicas={p.min_insync_replicas}")
                else:
                    self.checker.on_acks_all_success(self, p, w.appended[tp])
                del w.waiting[tp]
        if w.waiting and self.loop.now_ms >= w.deadline_ms:
            for tp in w.waiting:
                w.results[tp].error_code = common_pb2.REQUEST_TIMED_OUT
                w.results[tp].error_message = f"the ISR did not acknowledge within {w.timeout_ms} ms"
            w.waiting.clear()
        if not w.waiting:
            w.done = True
            by_topic: dict[str, list[common_pb2.ProducePartitionResponse]] = {}
            for (topic, _), res in w.results.items():
                by_topic.setdefault(topic, []).append(res)
            self.reply(w.request, common_pb2.ProduceResponse(
                topics=[common_pb2.ProduceTopicResponse(topic=t, partitions=ps) for t, ps in by_topic.items()]))

    def _expire(self, waiter: _WaitingProduce | _WaitingFetch) -> None:
        if waiter.done:
            return
        if isinstance(waiter, _WaitingProduce):
            self._check_produce(waiter)
        else:
            self._check_fetch(waiter)

    def _disk_write(self) -> None:
        """Slow-disk fault: a write blocks the broker's event loop for disk_delay_ms."""
        if self.disk_delay_ms:
            token = self.pause()
            self.loop.call_at(self.loop.now_ms + self.disk_delay_ms, self.resume, token)

    # ---- fetch (leader side) -----------------------------------------------------------------

    def _fetch(self, env: Envelope) -> None:
        req: common_pb2.FetchRequest = env.body
        is_follower = req.replica_id >= 0
        if is_follower:
            self._record_follower_fetches(req)
        max_wait_ms = min(req.max_wait_ms, limits.FETCH_MAX_WAIT_MS_MAX)
        waiter = _WaitingFetch(env, req, is_follower, self.loop.now_ms + max_wait_ms)
        self._check_fetch(waiter)
        if not waiter.done:
            self.purgatory.add([(t.topic, p.partition) for t in req.topics for p in t.partitions], waiter)
            self.after(max_wait_ms, self._expire, waiter)

    def _check_fetch(self, w: _WaitingFetch) -> None:
        """The body of fetch()'s loop: answer when min_bytes, an error, or the deadline is reached."""
        req = w.fetch
        resp, total_bytes, has_error = self._read_all(req, w.is_follower)
        has_tps = any(t.partitions for t in req.topics)
        if (req.max_wait_ms <= 0 or not has_tps or total_bytes >= max(req.min_bytes, 1) or has_error
                or self.loop.now_ms >= w.deadline_ms):
            w.done = True
            self.reply(w.request, resp)

    def _record_follower_fetches(self, req: common_pb2.FetchRequest) -> None:
        mono = self.loop.now_ms
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
                    self.trace("expand ISR of %s-%d %s -> %s", *tp, list(p.isr), list(change.new_isr))
                    self._alter_partition(p, change)
                if p.high_watermark != hw_before:
                    self.notify(tp)

    # ---- follower callbacks used by the fetcher ---------------------------------------------

    def append_fetched(self, tp: TopicPartitionKey, fetch_offset: int,
                       response: common_pb2.FetchPartitionResponse) -> None:
        p = self.partitions.get(tp)
        if p is None or p.role is not Role.FOLLOWER:
            return
        if response.records:
            p.append_as_follower(response.records, now_ms=self.wall_ms())
            self._disk_write()
        if p.update_follower_high_watermark(response.high_watermark):
            self.notify(tp)

    # ---- controlled shutdown (services/broker/server.py on_stop) -------------------------

    def controlled_shutdown(self, then: Callable[[], None]) -> None:
        """Ask the controller to move leaderships away, then stop cleanly and call then()."""
        self.shutting_down = True
        self.trace("controlled shutdown requested")
        self._controlled_shutdown_attempt(1, then)

    def _controlled_shutdown_attempt(self, attempt: int, then: Callable[[], None]) -> None:
        if attempt > CONTROLLED_SHUTDOWN_ATTEMPTS_MAX:
            self._stop_cleanly(then)
            return
        address = self._controller_address()
        req = controller_pb2.ControlledShutdownRequest(broker_id=self.broker_id, broker_epoch=self.broker_epoch)

        def answered(resp: Any) -> None:
            if (not isinstance(resp, RpcError) and resp.error_code == common_pb2.NONE
                    and not resp.remaining_partitions):
                self._stop_cleanly(then)
            else:
                self.after(200 * attempt, self._controlled_shutdown_attempt, attempt + 1, then)

        if address is None:
            answered(RpcError("UNAVAILABLE", "no controller"))
            return
        self.call(address, "ControlledShutdown", req, self.config.control_rpc_timeout_ms * 2, answered)

    def _stop_cleanly(self, then: Callable[[], None]) -> None:
        """ReplicaManager.close + revoking the lease: checkpoints, clean-shutdown markers, key deleted."""
        for tp, p in self.partitions.items():
            p.role = Role.NONE  # waiting requests answer NOT_LEADER_OR_FOLLOWER now
            self.notify(tp)
        self.checkpoint_high_watermarks()
        for p in self.partitions.values():
            p.log.close()
        if self.lease is not None:
            self.lease.stop(revoke=True)
        self.trace("stopped cleanly")
        self.crash()  # the process is gone; the disk keeps everything (close flushed it)
        then()

    # ---- for the checker --------------------------------------------------------------------

    def describe(self) -> str:
        parts = []
        for (topic, partition), p in sorted(self.partitions.items()):
            parts.append(f"{topic}-{partition}:{p.role.value[0].upper()}e{p.leader_epoch} leo{p.log.log_end_offset} "
                         f"hw{p.high_watermark} isr{list(p.isr)}")
        return f"{self.name} {'up' if self.up else 'down'} be{self.broker_epoch} " + "; ".join(parts)


@dataclass(slots=True)
class _Endpoint:
    """The fetcher's LeaderEndpoint, reduced to what the replica manager reads from it."""

    address: str


class SimFetcher:
    """ReplicaFetcher for one leader: maybe_truncate then maybe_fetch, as RPC callbacks.

    At most one RPC is in flight (the real loop awaits each), so the state moves only
    between iterations, exactly where the real loop's awaits are.
    """

    def __init__(self, broker: SimBroker, leader_id: int, address: str) -> None:
        self.broker = broker
        self.leader_id = leader_id
        self.leader = broker_node(leader_id)
        self.endpoint = _Endpoint(address)
        self.stopped = False
        self.partitions: OrderedDict[TopicPartitionKey, PartitionFetchState] = OrderedDict()
        self.backoff_ms = broker.config.replica_fetch_backoff_ms
        # True while the loop waits for a first partition (the real loop's _wakeup).
        self._waiting_for_partitions = False
        self._idle_generation = 0
        broker.after(0, self._iteration)

    def add_partition(self, tp: TopicPartitionKey, leader_epoch: int, fetch_offset: int) -> None:
        self.partitions[tp] = PartitionFetchState(tp[0], tp[1], fetch_offset, leader_epoch)
        if self._waiting_for_partitions:
            self._waiting_for_partitions = False
            self._idle_generation += 1
            self.broker.after(0, self._iteration)

    def remove_partition(self, tp: TopicPartitionKey) -> None:
        self.partitions.pop(tp, None)

    def stop(self) -> None:
        """ReplicaFetcher.stop: the task is cancelled; an answer still in flight is ignored."""
        self.stopped = True

    def _call(self, rpc: str, request: Any, timeout_ms: int, on_reply: Callable[[Any], None]) -> None:
        def answered(resp: Any) -> None:
            if not self.stopped:
                on_reply(resp)

        self.broker.call(self.leader, rpc, request, timeout_ms, answered, address=self.endpoint.address)

    # ---- the loop -----------------------------------------------------------------------

    def _iteration(self) -> None:
        if self.stopped:
            return
        if not self.partitions:
            self._waiting_for_partitions = True
            self._idle_generation += 1
            self.broker.after(FETCHER_EMPTY_WAIT_MS, self._idle_timeout, self._idle_generation)
            return
        self._maybe_truncate()

    def _idle_timeout(self, generation: int) -> None:
        if self._waiting_for_partitions and generation == self._idle_generation:
            self._waiting_for_partitions = False
            self._iteration()

    def _rpc_failed(self) -> None:
        """AioRpcError: every partition not yet delayed backs off; the loop sleeps the back-off."""
        now = self.broker.loop.now_ms
        for st in self.partitions.values():
            if st.phase is not FetchPhase.DELAYED:
                st.delay(now, self.backoff_ms, st.phase)
        self.broker.after(self.backoff_ms, self._iteration)

    # ---- maybe_truncate -------------------------------------------------------------------

    def _maybe_truncate(self) -> None:
        b = self.broker
        now = b.loop.now_ms
        truncating = {tp: st for tp, st in self.partitions.items()
                      if st.ready(now) and st.phase is FetchPhase.TRUNCATING}
        if not truncating:
            self._maybe_fetch()
            return
        if not b.config.safety.leader_epoch_truncation:
            self._truncate_to_high_watermark(truncating)
            self._maybe_fetch()
            return
        by_topic: dict[str, list[broker_pb2.OffsetsForLeaderEpochPartition]] = {}
        no_epoch: list[TopicPartitionKey] = []
        asked: dict[TopicPartitionKey, int] = {}
        for tp, st in truncating.items():
            epoch = b.latest_local_epoch(tp)
            if epoch is None:
                no_epoch.append(tp)
                continue
            asked[tp] = epoch
            by_topic.setdefault(tp[0], []).append(broker_pb2.OffsetsForLeaderEpochPartition(
                partition=tp[1], current_leader_epoch=st.current_leader_epoch, leader_epoch=epoch))
        for tp in no_epoch:
            st = truncating[tp]
            st.fetch_offset = b.local_leo(tp) or 0
            st.move(FetchPhase.FETCHING)
        if not by_topic:
            self._maybe_fetch()
            return
        request = broker_pb2.OffsetsForLeaderEpochRequest(
            replica_id=b.broker_id,
            topics=[broker_pb2.OffsetsForLeaderEpochTopic(topic=t, partitions=ps) for t, ps in by_topic.items()])
        self._call("OffsetsForLeaderEpoch", request, b.config.control_rpc_timeout_ms,
                   lambda resp: self._truncate_answered(resp, asked))

    def _truncate_answered(self, response: broker_pb2.OffsetsForLeaderEpochResponse | RpcError,
                           asked: dict[TopicPartitionKey, int]) -> None:
        if isinstance(response, RpcError):
            self._rpc_failed()
            return
        b = self.broker
        now = b.loop.now_ms
        for topic in response.topics:
            for result in topic.partitions:
                tp = (topic.topic, result.partition)
                st = self.partitions.get(tp)
                if st is None or tp not in asked:
                    continue
                if result.error_code != common_pb2.NONE:
                    st.delay(now, backoff_after_error(result.error_code, self.backoff_ms), FetchPhase.TRUNCATING)
                    continue
                local_leo = b.local_leo(tp)
                if local_leo is None:
                    continue
                if result.leader_epoch < 0 or result.end_offset < 0:
                    offset = local_leo
                else:
                    offset = truncation_offset(
                        local_leo=local_leo, requested_epoch=asked[tp], leader_epoch=result.leader_epoch,
                        leader_end_offset=result.end_offset,
                        local_end_offset_for_leader_epoch=b.local_end_offset_for_epoch(tp, result.leader_epoch))
                if offset < local_leo:
                    b.trace("truncate %s-%d from %d to %d (leader epoch %d ends at %d)", *tp, local_leo, offset,
                            result.leader_epoch, result.end_offset)
                    b.checker.before_truncation(b, tp, offset)
                # fetcher.maybe_truncate: always, so epochs starting at the offset go too (KI-2).
                b.truncate(tp, offset)
                st.fetch_offset = offset
                st.move(FetchPhase.FETCHING)
                b.checker.after_truncation(b, tp, self.leader_id, st.current_leader_epoch)
        self._maybe_fetch()

    def _truncate_to_high_watermark(self, truncating: dict[TopicPartitionKey, PartitionFetchState]) -> None:
        """Safety switch off: Kafka before KIP-101 cut a new follower's log at its own HW."""
        b = self.broker
        for tp, st in truncating.items():
            p = b.partitions.get(tp)
            if p is None:
                continue
            local_leo = p.log.log_end_offset
            offset = min(p.high_watermark, local_leo)
            if offset < local_leo:
                b.trace("truncate %s-%d from %d to HW %d (epoch truncation off)", *tp, local_leo, offset)
                b.checker.before_truncation(b, tp, offset)
                b.truncate(tp, offset)
            st.fetch_offset = offset
            st.move(FetchPhase.FETCHING)
            b.checker.after_truncation(b, tp, self.leader_id, st.current_leader_epoch)

    # ---- maybe_fetch ----------------------------------------------------------------------

    def _maybe_fetch(self) -> None:
        b = self.broker
        now = b.loop.now_ms
        ready = [(tp, st) for tp, st in self.partitions.items() if st.ready(now) and st.phase is FetchPhase.FETCHING]
        if not ready:
            b.after(min(self.backoff_ms, FETCHER_IDLE_SLEEP_MS_MAX), self._iteration)
            return
        by_topic: dict[str, list[common_pb2.FetchPartition]] = {}
        for tp, st in ready:
            by_topic.setdefault(tp[0], []).append(common_pb2.FetchPartition(
                partition=tp[1], fetch_offset=st.fetch_offset,
                partition_max_bytes=limits.REPLICA_FETCH_PARTITION_MAX_BYTES,
                current_leader_epoch=st.current_leader_epoch, log_start_offset=b.local_log_start(tp)))
        wait_ms = b.config.replica_fetch_wait_max_ms
        request = common_pb2.FetchRequest(
            replica_id=b.broker_id, replica_epoch=b.broker_epoch, max_wait_ms=wait_ms,
            min_bytes=limits.REPLICA_FETCH_MIN_BYTES, max_bytes=limits.REPLICA_FETCH_MAX_BYTES,
            topics=[common_pb2.FetchTopic(topic=t, partitions=ps) for t, ps in by_topic.items()])
        self._call("Fetch", request, wait_ms + b.config.control_rpc_timeout_ms, self._fetch_answered)

    def _fetch_answered(self, response: common_pb2.FetchResponse | RpcError) -> None:
        if isinstance(response, RpcError):
            self._rpc_failed()
            return
        b = self.broker
        now = b.loop.now_ms
        for topic in response.topics:
            for pr in topic.partitions:
                tp = (topic.topic, pr.partition)
                st = self.partitions.get(tp)
                if st is None or st.phase is not FetchPhase.FETCHING:
                    continue
                code = pr.error_code
                if code == common_pb2.NONE:
                    local_leo = b.local_leo(tp)
                    if local_leo != st.fetch_offset:
                        st.move(FetchPhase.TRUNCATING)
                        continue
                    b.append_fetched(tp, st.fetch_offset, pr)
                    new_leo = b.local_leo(tp)
                    if new_leo is not None and new_leo > st.fetch_offset:
                        st.fetch_offset = new_leo
                        self.partitions.move_to_end(tp)
                elif code == common_pb2.OFFSET_OUT_OF_RANGE:
                    self._handle_out_of_range(tp, st, pr)
                else:
                    st.delay(now, backoff_after_error(code, self.backoff_ms), FetchPhase.TRUNCATING)
        b.after(0, self._iteration)

    def _handle_out_of_range(self, tp: TopicPartitionKey, st: PartitionFetchState,
                             pr: common_pb2.FetchPartitionResponse) -> None:
        b = self.broker
        if st.fetch_offset > pr.log_end_offset >= 0:
            b.trace("%s-%d: fetch offset %d above leader LEO %d; truncating", *tp, st.fetch_offset,
                    pr.log_end_offset)
            b.checker.before_truncation(b, tp, pr.log_end_offset)
            b.truncate(tp, pr.log_end_offset)
            st.fetch_offset = pr.log_end_offset
        else:
            b.trace("%s-%d: fetch offset %d below leader log start %d; restarting there", *tp, st.fetch_offset,
                    pr.log_start_offset)
            b.truncate_fully_and_start_at(tp, pr.log_start_offset)
            st.fetch_offset = pr.log_start_offset
