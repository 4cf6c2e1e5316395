"""The active controller's single event loop (Kafka's ControllerEventManager).

One asyncio task takes events off a bounded queue and runs them one at a
time: a pure handler decides (handlers.py), then this module applies —
fenced etcd transactions first, replay into the context second, control
RPCs last. Being single-threaded is what makes the context safe without
locks. RPCs go through one sender task per broker (Kafka's
RequestSendThread), so a slow or paused broker never stalls the loop, and
requests reach each broker in the order they were decided.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from clients.common.errors import InvariantViolation
from clients.common.topics import topic_config_proto
from clients.common.types import TopicPartitionKey
from coordinator import values
from coordinator.election import ControllerFenced, fenced_txn
from coordinator.keys import Keys
from coordinator.store import (
    Delete as EtcdDelete,
)
from coordinator.store import (
    EtcdStore,
    Get,
    Op,
    Put,
    WatchCompacted,
    compare_missing,
    compare_mod_revision,
    compare_version,
)
from protos.highwater.v1 import broker_pb2, common_pb2
from services.common import limits
from services.common.peers import PeerChannels
from services.common.server import halt_on_invariant_violation
from services.controller import admin_requests, deletion, handlers, metrics, reassignment, sender_rules, wire
from services.controller.context import (
    NO_LEADER,
    BrokerInfo,
    ControllerContext,
    LeaderAndIsr,
    StateProtos,
    TopicInfo,
)
from services.controller.metadata_image import MetadataImage, broker_info, gateway_info, load_image
from services.controller.results import (
    AdminKeyDelete,
    ConfigWrite,
    ControllerResult,
    DeletionMark,
    ReplicaStatesWrite,
    ShuttingDownWrite,
    StateWrite,
    TopicDelete,
    TopicWrite,
    Write,
    apply_write,
)

log = logging.getLogger("highwater.controller")

# etcd refuses transactions with more operations than --max-txn-ops (default 128).
ETCD_TXN_OPS_MAX = 100
# An event that takes at least this long from decision to queued requests is logged with
# where its time went.
SLOW_EVENT_LOG_S = 0.1
# Producer ids reserved in etcd at a time: one etcd transaction per this many InitProducerId calls.
PRODUCER_ID_BLOCK_IDS = 1000
# After a watch on etcd breaks, wait this long before reading and watching again.
WATCH_RETRY_BACKOFF_S = 0.5


# ---- the context's types -> etcd values (reading them: metadata_image.py) --------------------


def encode_topic(topic: TopicInfo) -> bytes:
    return values.encode_topic_assignment(
        topic.topic_id, topic.assignment, topic.adding_replicas, topic.removing_replicas
    )


def encode_partition_state(state: LeaderAndIsr) -> bytes:
    return values.encode_partition_state(state.leader, state.leader_epoch, state.isr, state.controller_epoch)


def exc_name(exc: grpc.aio.AioRpcError) -> str:
    name: str = exc.code().name  # grpc is untyped: code() is a grpc.StatusCode
    return name


class ControllerResigned(Exception):
    """The loop stopped acting: its epoch was fenced or its lease lost."""


@dataclass
class _Event:
    name: str
    handler: Callable[[], ControllerResult]
    done: asyncio.Future[ControllerResult]
    enqueued_at: float = field(default_factory=time.monotonic)


class BrokerSender:
    """Delivers control requests to one incarnation of a broker (or a gateway) in order.

    sender_rules.retry_after_ms decides when a request is sent again; the sender is
    replaced when the broker re-registers (ControllerEventLoop._sync_senders).
    """

    def __init__(
        self, address: str, peers: PeerChannels, *, is_gateway: bool = False, broker_epoch: int = -1
    ) -> None:
        self.address = address
        self.broker_epoch = broker_epoch
        self.peers = peers
        self.is_gateway = is_gateway
        self.queue: asyncio.Queue[tuple[str, Any, asyncio.Future[Any]]] = asyncio.Queue(
            limits.CONTROLLER_SENDER_QUEUE_LENGTH_MAX
        )
        self.task = asyncio.create_task(self._run(), name=f"control-sender-{address}")

    def send(self, rpc: str, request: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait((rpc, request, fut))
        return fut

    async def _run(self) -> None:
        while True:
            rpc, request, fut = await self.queue.get()
            if isinstance(request, wire.Serialized):
                service = "GatewayService" if self.is_gateway else "BrokerService"
                call = self.peers.serialized(
                    self.address, f"/highwater.v1.{service}/{rpc}", wire.RESPONSE_TYPES[rpc]
                )
                payload: Any = request.data
            else:
                peers = self.peers
                stub = peers.gateway(self.address) if self.is_gateway else peers.broker(self.address)
                call, payload = getattr(stub, rpc), request
            attempt = 1
            while True:
                outcome: Any
                try:
                    outcome = await call(payload, timeout=limits.CONTROL_RPC_TIMEOUT_S)
                    error_code: int | None = getattr(outcome, "error_code", 0)
                except grpc.aio.AioRpcError as exc:
                    outcome, error_code = exc, None
                pause_ms = sender_rules.retry_after_ms(attempt, error_code=error_code)
                if pause_ms is None:
                    break
                if attempt == 1 or attempt % 10 == 0:
                    what = exc_name(outcome) if error_code is None else common_pb2.ErrorCode.Name(error_code)
                    log.info(
                        "%s to %s (broker epoch %d) got %s; sending it again",
                        rpc,
                        self.address,
                        self.broker_epoch,
                        what,
                    )
                await asyncio.sleep(pause_ms / 1000)
                attempt += 1
            if isinstance(outcome, grpc.aio.AioRpcError):
                log.warning(
                    "%s to %s failed %d times (%s); giving up", rpc, self.address, attempt, exc_name(outcome)
                )
                if not fut.done():
                    fut.set_exception(outcome)
                    # The warning above is the report of this failure. Whoever waits on the future
                    # (an admin call's propagation wait, a deletion's callback) may read it; most
                    # futures are dropped unread, and asyncio would log each one's traceback at
                    # ERROR ("Future exception was never retrieved") when it is collected.
                    fut.exception()
                continue
            if error_code:
                log.warning(
                    "%s to %s answered %s: %s",
                    rpc,
                    self.address,
                    common_pb2.ErrorCode.Name(error_code),
                    outcome.error_message,
                )
            if not fut.done():
                fut.set_result(outcome)

    async def stop(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except (asyncio.CancelledError, Exception):
            pass
        while not self.queue.empty():
            _, _, fut = self.queue.get_nowait()
            if not fut.done():
                fut.cancel()


@dataclass(frozen=True)
class Startup:
    """What begin() did: the failover's result (its requests still to queue) and the revision read."""

    result: ControllerResult
    revision: int
    taken_s: float
    decided_s: float


class ControllerEventLoop:
    """Everything the active controller does, serialised."""

    def __init__(
        self,
        *,
        store: EtcdStore,
        controller_id: int,
        epoch: int,
        peers: PeerChannels,
        delete_topic_enable: bool = True,
        auto_leader_rebalance: bool = True,
        leader_imbalance_check_interval_s: float = limits.LEADER_IMBALANCE_CHECK_INTERVAL_S,
        leader_imbalance_per_broker_percentage: int = limits.LEADER_IMBALANCE_PER_BROKER_PERCENTAGE,
    ) -> None:
        self.auto_leader_rebalance = auto_leader_rebalance
        self.leader_imbalance_check_interval_s = leader_imbalance_check_interval_s
        self.leader_imbalance_per_broker_percentage = leader_imbalance_per_broker_percentage
        self.store = store
        self.keys: Keys = store.keys
        self.peers = peers
        self.epoch = epoch
        self.delete_topic_enable = delete_topic_enable
        self.ctx = ControllerContext(controller_id=controller_id, epoch=epoch)
        self.queue: asyncio.Queue[_Event] = asyncio.Queue(limits.CONTROLLER_EVENT_QUEUE_LENGTH_MAX)
        self.senders: dict[tuple[str, int], BrokerSender] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.resigned = asyncio.Event()
        self._stopping_senders: set[asyncio.Future[None]] = set()
        self._producer_ids: tuple[int, int] = (0, 0)  # [next, end) of the block we own
        self.cluster_id = ""
        # Built protos of partition states and topic configs, each kept with what it was built
        # from (state_proto, config_proto); a warm standby hands over the ones it built.
        self.state_protos = StateProtos()
        # partition_wires() kept for a context and the count of write replays it has seen: a
        # DescribeCluster answer or full UpdateMetadata at 100,000 partitions reuses it until the
        # next write (0.1 s of lookups each otherwise, on a machine busy with the takeover).
        self._states_generation = 0
        self._partition_wires: tuple[ControllerContext, int, list[bytes]] | None = None
        self._config_protos: dict[str, tuple[dict[str, str], common_pb2.TopicConfig, bytes]] = {}

    # ---- start / stop ------------------------------------------------------------------

    async def start(self, image: MetadataImage | None = None) -> None:
        """Become active. image: a warm standby's metadata, caught up to at least the election's
        revision (metadata_image.MetadataFollower.take); without one, everything is read from etcd."""
        started = time.monotonic()
        startup = await self.begin(image)
        revision = startup.revision
        self._tasks.append(
            asyncio.create_task(
                self._watch(self.keys.brokers_prefix, revision, "BrokerChange"), name="watch-brokers"
            )
        )
        self._tasks.append(
            asyncio.create_task(
                self._watch(self.keys.gateways_prefix, revision, "GatewayChange"), name="watch-gateways"
            )
        )
        self._tasks.append(asyncio.create_task(self._watch_admin(revision), name="watch-admin"))
        if self.auto_leader_rebalance:
            self._tasks.append(asyncio.create_task(self._rebalance_ticks(), name="leader-rebalance"))
        # The context now holds the failover's decisions, committed: the controller answers from
        # here on (the caller activates it), while the loop's task first builds and queues the
        # failover's requests (seconds at 100,000 partitions), in slices, before any other event.
        self._tasks.append(
            asyncio.create_task(self._run(startup=startup.result), name="controller-event-loop")
        )
        log.info(
            "controller %d active at epoch %d (%s): %d brokers, %d topics, %d partitions, started in %.0f ms "
            "(metadata taken in %.0f ms, failover decided in %.0f ms)",
            self.ctx.controller_id,
            self.epoch,
            "metadata loaded" if image is None else f"standby's metadata at revision {revision}",
            len(self.ctx.live_brokers),
            len(self.ctx.topics),
            len(self.ctx.states),
            (time.monotonic() - started) * 1000,
            startup.taken_s * 1000,
            startup.decided_s * 1000,
        )

    async def begin(self, image: MetadataImage | None) -> Startup:
        """start()'s etcd part, also run by the simulation: the cluster id, the metadata (the
        standby's image or a load), the failover's decisions committed (their requests not yet
        queued), the admin requests found at start. The watches start after startup.revision."""
        started = time.monotonic()
        self.cluster_id = await self._cluster_id()
        revision = await self.take_metadata(image)
        deciding = time.monotonic()
        result = handlers.on_startup(self.ctx)
        decided = time.monotonic()
        await self.apply(result, event="Startup", decided_s=decided - deciding, send=False)
        self.queue_follow_ups("Startup")
        await self._admin_requests_at_start()
        # Before the caller activates this controller, while the brokers are idle: the first
        # DescribeCluster answers and the failover's UpdateMetadata then only join these.
        self.partition_wires()
        return Startup(result, revision, taken_s=deciding - started, decided_s=decided - deciding)

    async def _cluster_id(self) -> str:
        """The cluster's uuid, written once by the first controller ever (create-if-missing)."""
        key = self.keys.cluster_id
        await fenced_txn(
            self.store,
            self.epoch,
            [compare_missing(key)],
            [Put(key, values.encode_cluster_id(str(uuid.uuid4())))],
        )
        kv = await self.store.get(key)
        return values.decode_cluster_id(kv.value) if kv is not None else ""

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        for s in self.senders.values():
            await s.stop()
        self.senders.clear()
        while not self.queue.empty():
            ev = self.queue.get_nowait()
            if not ev.done.done():
                ev.done.set_exception(ControllerResigned("controller stopped"))

    async def take_metadata(self, image: MetadataImage | None) -> int:
        """The context from a standby's image (warm) or from etcd (cold); returns its revision."""
        if image is None:
            return await self.load()
        self.ctx = image.context(self.ctx.controller_id, self.epoch)
        self.state_protos = image.protos
        self._config_protos.clear()
        return image.revision

    async def load(self) -> int:
        """Read the whole cluster state from etcd into a fresh context; returns the revision read at."""
        return await self.take_metadata(await load_image(self.store))

    # ---- the loop --------------------------------------------------------------------------

    async def submit(self, name: str, handler: Callable[[], ControllerResult]) -> ControllerResult:
        """Queue an event and wait until the loop has decided and committed it."""
        if self.resigned.is_set():
            raise ControllerResigned("this controller is no longer active")
        fut: asyncio.Future[ControllerResult] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait(_Event(name, handler, fut))
        return await fut

    def enqueue(self, name: str, handler: Callable[[], ControllerResult]) -> None:
        """Queue an event nobody waits for (watches, ticks, follow-ups)."""
        self.queue.put_nowait(_Event(name, handler, asyncio.get_running_loop().create_future()))

    async def _run(self, startup: ControllerResult | None = None) -> None:
        if startup is not None:
            started = time.monotonic()
            self._sync_senders()
            await self._send_in_slices(startup)
            log.info(
                "Startup: requests for %d partitions queued to %d brokers and gateways in %.0f ms",
                len(self.ctx.states),
                len(self.senders),
                (time.monotonic() - started) * 1000,
            )
        while True:
            ev = await self.queue.get()
            metrics.EVENT_QUEUE_TIME.labels(ev.name).observe(time.monotonic() - ev.enqueued_at)
            try:
                result = await self.turn(ev.name, ev.handler)
            except ControllerResigned as exc:
                if not ev.done.done():
                    ev.done.set_exception(exc)
                return
            except Exception as exc:
                if not ev.done.done():
                    ev.done.set_exception(exc)
                continue
            if not ev.done.done():
                ev.done.set_result(result)

    async def turn(self, name: str, handler: Callable[[], ControllerResult]) -> ControllerResult:
        """One event: decide, commit (fenced), replay, send, queue what it leads to.

        The loop's error handling, run as it is by the simulation (tests/sim/sim_controller.py):
        fenced, the loop resigns (`resigned` set; raises ControllerResigned); a broken invariant
        halts (on_invariant_violation); any other failure reloads the context from etcd (resigning
        if that fails too) and is raised to whoever waits for the event.
        """
        try:
            with metrics.EVENT_PROCESSING_TIME.labels(name).time():
                started = time.monotonic()
                result = handler()
                await self.apply(result, event=name, decided_s=time.monotonic() - started)
        except ControllerFenced as exc:
            log.error(
                "controller %d fenced at epoch %d: %s; resigning", self.ctx.controller_id, self.epoch, exc
            )
            self.resigned.set()
            raise ControllerResigned(str(exc)) from exc
        except InvariantViolation as exc:
            self.on_invariant_violation(exc, f"controller event {name}")
            raise
        except Exception:
            log.exception("event %s failed; reloading state from etcd", name)
            await self._resync()
            raise
        self.queue_follow_ups(name)
        return result

    def on_invariant_violation(self, exc: InvariantViolation, where: str) -> None:
        """A broken invariant is a bug: the process halts (the simulation raises it instead)."""
        halt_on_invariant_violation(exc, where)

    def queue_follow_ups(self, event: str) -> None:
        """Queue what a committed event leads to.

        The reassignment walk is tried after every other event and after start-up: a
        new controller finishes a reassignment whose target replicas are already in the
        ISR without waiting for an unrelated event (issue 16, defect 2).
        """
        if event != "ReassignmentProgress" and reassignment.ongoing_reassignments(self.ctx):
            self.enqueue("ReassignmentProgress", lambda: reassignment.on_reassignment_progress(self.ctx))

    async def _resync(self) -> None:
        """After a failed apply the context may disagree with etcd: read it again."""
        try:
            self.ctx = ControllerContext(controller_id=self.ctx.controller_id, epoch=self.epoch)
            await self.load()
        except Exception:
            log.exception("reloading state failed; resigning")
            self.resigned.set()

    async def _admin_requests_at_start(self) -> None:
        for key, kind in (
            (self.keys.reassign_partitions, "reassign"),
            (self.keys.preferred_replica_election, "preferred"),
        ):
            kv = await self.store.get(key)
            if kv is not None:

                def decide(k: str = key, t: str = kind, v: bytes = kv.value) -> ControllerResult:
                    return admin_requests.on_admin_request(self.ctx, t, k, v)

                self.enqueue("AdminRequest", decide)

    async def _watch_admin(self, revision: int) -> None:
        """Requests written by hand under /admin (Kafka's znode-based admin tools).

        When etcd has compacted the history this watch would resume from, every request
        under /admin is read again and queued, and the watch starts after that read."""
        reread = False
        while True:
            try:
                if reread:
                    kvs, revision = await self.store.get_prefix(self.keys.prefix + "/admin/")
                    for kv in kvs:
                        self._on_admin_write(kv.key, kv.value)
                    reread = False
                async for events in self.store.watch_prefix(
                    self.keys.prefix + "/admin/", start_revision=revision + 1
                ):
                    for ev in events:
                        revision = max(revision, ev.mod_revision)
                        if ev.kind == "put":
                            self._on_admin_write(ev.key, ev.value)
            except asyncio.CancelledError:
                raise
            except WatchCompacted as exc:
                log.warning("watch on /admin: %s; reading /admin again", exc)
                reread = True
            except Exception as exc:
                log.warning("watch on /admin failed (%s); watching again", exc)
                await asyncio.sleep(WATCH_RETRY_BACKOFF_S)

    def _on_admin_write(self, key: str, value: bytes) -> None:
        kinds = {self.keys.reassign_partitions: "reassign", self.keys.preferred_replica_election: "preferred"}
        if key in kinds:

            def request(k: str = key, v: bytes = value) -> ControllerResult:
                return admin_requests.on_admin_request(self.ctx, kinds[k], k, v)

            self.enqueue("AdminRequest", request)
        elif key.startswith(self.keys.delete_topics_prefix):
            topic = key[len(self.keys.delete_topics_prefix) :]

            def delete_marker(t: str = topic, k: str = key) -> ControllerResult:
                return admin_requests.on_admin_delete_marker(
                    self.ctx, t, k, deletion_enabled=self.delete_topic_enable
                )

            self.enqueue("TopicDeletion", delete_marker)

    async def _rebalance_ticks(self) -> None:
        while True:
            await asyncio.sleep(self.leader_imbalance_check_interval_s)
            self.queue_rebalance()

    def queue_rebalance(self) -> None:
        """Queue AutoLeaderRebalance (every leader.imbalance.check.interval; the simulation's timer too)."""
        self.enqueue(
            "AutoLeaderRebalance",
            lambda: handlers.on_auto_leader_rebalance(self.ctx, self.leader_imbalance_per_broker_percentage),
        )

    async def _watch(self, prefix: str, revision: int, name: str) -> None:
        """On any change under prefix, read the whole prefix and queue one membership event.

        A broken watch (etcd restarted, history compacted) is started again from a
        fresh read, so no change is missed: the event always carries the whole set.
        """
        while True:
            try:
                async for _events in self.store.watch_prefix(prefix, start_revision=revision + 1):
                    kvs, revision = await self.store.get_prefix(prefix)
                    self._membership_event(name, kvs)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("watch on %s failed (%s); reading it again", prefix, exc)
                await asyncio.sleep(WATCH_RETRY_BACKOFF_S)
                try:
                    kvs, revision = await self.store.get_prefix(prefix)
                    self._membership_event(name, kvs)
                except Exception as again:
                    log.warning("reading %s failed too (%s); will retry", prefix, again)

    def _membership_event(self, name: str, kvs: list[Any]) -> None:
        if name == "BrokerChange":
            registered: dict[int, BrokerInfo] = {}
            for kv in kvs:
                info = broker_info(kv.value, kv.create_revision)
                registered[info.broker_id] = info
            self.enqueue(name, lambda: handlers.on_broker_change(self.ctx, registered))
        else:
            gateways = {g.gateway_id: g for g in (gateway_info(kv.value) for kv in kvs)}
            self.enqueue(name, lambda: handlers.on_gateway_change(self.ctx, gateways))

    # ---- apply: fenced writes, replay, RPCs ----------------------------------------------------

    async def apply(
        self, result: ControllerResult, *, event: str = "", decided_s: float = 0.0, send: bool = True
    ) -> None:
        """Commit the result's writes (fenced), replay them, queue its RPCs (send False: the caller
        queues them, as start() leaves the failover's requests to the loop's task)."""
        if result.unclean_elections:
            metrics.UNCLEAN_ELECTIONS.inc(result.unclean_elections)
        started = time.monotonic()
        txns = 0
        if result.writes:
            txns = await self._commit(result.writes)
            self._states_generation += 1  # partition_wires() of before these writes is stale
            for write in result.writes:
                apply_write(self.ctx, write)
                if isinstance(write, TopicDelete):
                    self._forget_protos(write.topic)
        committed = time.monotonic()
        if send:
            self._sync_senders()
            self._send(result)
        sent = time.monotonic()
        if decided_s + sent - started >= SLOW_EVENT_LOG_S:
            # What a failover's time went to, in the log (the metrics hold the totals).
            log.info(
                "event %s: decided in %.0f ms, %d writes committed in %d transactions in %.0f ms, "
                "requests queued in %.0f ms",
                event or "?",
                decided_s * 1000,
                len(result.writes),
                txns,
                (committed - started) * 1000,
                (sent - committed) * 1000,
            )
        metrics.OFFLINE_PARTITIONS.set(len(self.ctx.offline_partitions()))
        metrics.GLOBAL_PARTITION_COUNT.set(len(self.ctx.states))

    async def _commit(self, writes: list[Write]) -> int:
        """Commit the writes in fenced transactions of at most ETCD_TXN_OPS_MAX ops; returns how many.

        Transactions that touch disjoint keys go to etcd together (one round trip and,
        etcd batching them, about one disk sync instead of one each: a failover of 1,000
        partitions is 10 of them). If a key appears in two of them, or a prefix delete in
        any, they go one by one, in order. Either way a refused one raises, and the caller reloads the
        state from etcd.
        """
        chunks: list[list[tuple[list[Any], list[Op]]]] = [[]]
        ops_in_chunk = 0
        for write in writes:
            compares, ops = self._etcd_ops(write)
            if not ops:
                continue  # bookkeeping kept in memory only: replayed, not committed
            if ops_in_chunk + len(ops) > ETCD_TXN_OPS_MAX and chunks[-1]:
                chunks.append([])
                ops_in_chunk = 0
            chunks[-1].append((compares, ops))
            ops_in_chunk += len(ops)
        chunks = [c for c in chunks if c]
        keys_per_chunk = [{op.key for _, ops in chunk for op in ops} for chunk in chunks]
        prefixed = any(getattr(op, "prefix", False) for chunk in chunks for _, ops in chunk for op in ops)
        disjoint = not prefixed and sum(len(keys) for keys in keys_per_chunk) == len(
            set().union(*keys_per_chunk)
        )
        if disjoint and len(chunks) > 1:
            results = await asyncio.gather(
                *(self._commit_chunk(chunk) for chunk in chunks), return_exceptions=True
            )
            for outcome in results:
                if isinstance(outcome, BaseException):
                    raise outcome
        else:
            for chunk in chunks:
                await self._commit_chunk(chunk)
        return len(chunks)

    async def _commit_chunk(self, chunk: list[tuple[list[Any], list[Op]]]) -> None:
        compares = [c for cs, _ in chunk for c in cs]
        ops = [o for _, os in chunk for o in os]
        txn = await fenced_txn(self.store, self.epoch, compares, ops)
        if not txn.succeeded:
            raise RuntimeError(f"etcd rejected a controller write ({len(ops)} ops): a key changed under us")

    def _etcd_ops(self, write: Write) -> tuple[list[Any], list[Op]]:
        k = self.keys
        if isinstance(write, StateWrite):
            key = k.partition_state(*write.tp)
            return [compare_version(key, write.expected_version)], [
                Put(key, encode_partition_state(write.state))
            ]
        if isinstance(write, TopicWrite):
            key = k.topic(write.topic.name)
            compares = [compare_missing(key)] if write.create else []
            return compares, [Put(key, encode_topic(write.topic))]
        if isinstance(write, ConfigWrite):
            return [], [Put(k.topic_config(write.topic), values.encode_topic_configs(write.configs))]
        if isinstance(write, AdminKeyDelete):
            return [], [EtcdDelete(write.key)]
        if isinstance(write, DeletionMark):
            return [], [Put(k.delete_topic(write.topic), values.DELETE_TOPIC_MARK)]
        if isinstance(write, (ReplicaStatesWrite, ShuttingDownWrite)):
            return [], []
        if isinstance(write, TopicDelete):
            return [], [
                EtcdDelete(k.topic(write.topic)),
                EtcdDelete(k.topic_partitions_prefix(write.topic), prefix=True),
                EtcdDelete(k.topic_config(write.topic)),
                EtcdDelete(k.delete_topic(write.topic)),
            ]
        raise TypeError(f"unknown write {write!r}")

    def state_proto(self, tp: TopicPartitionKey) -> common_pb2.PartitionState:
        """ctx.partition_state_proto(tp), built once per state (context.StateProtos)."""
        state = self.ctx.states.get(tp)
        if state is None:
            return self.ctx.partition_state_proto(tp)
        return self.state_protos.get(tp, state, self.ctx.topics[tp[0]])

    def partition_wires(self) -> list[bytes]:
        """The encodings of every partition with a state, in ctx.partitions() order (wire.py)."""
        kept = self._partition_wires
        if kept is not None and kept[0] is self.ctx and kept[1] == self._states_generation:
            return kept[2]
        wires = self.state_protos.wires(self.ctx.partitions(), self.ctx.states, self.ctx.topics)
        self._partition_wires = (self.ctx, self._states_generation, wires)
        return wires

    def state_wire(self, tp: TopicPartitionKey) -> bytes:
        """state_proto(tp)'s encoding, length-prefixed (wire.py), built once per state."""
        state = self.ctx.states.get(tp)
        if state is None:
            return wire.length_prefixed(self.ctx.partition_state_proto(tp).SerializeToString())
        return self.state_protos.wire(tp, state, self.ctx.topics[tp[0]])

    def config_proto(self, topic: str) -> common_pb2.TopicConfig:
        """topic_config_proto of the topic's configs, built once per configs dict (replaced on change)."""
        return self._config(topic)[1]

    def config_wire(self, topic: str) -> bytes:
        """config_proto(topic)'s encoding, length-prefixed (wire.py)."""
        return self._config(topic)[2]

    def _config(self, topic: str) -> tuple[dict[str, str], common_pb2.TopicConfig, bytes]:
        configs = self.ctx.topics[topic].configs
        cached = self._config_protos.get(topic)
        if cached is not None and cached[0] is configs:
            return cached
        proto = topic_config_proto(configs)
        built = (configs, proto, wire.length_prefixed(proto.SerializeToString()))
        self._config_protos[topic] = built
        return built

    def _forget_protos(self, topic: str) -> None:
        self._config_protos.pop(topic, None)
        self.state_protos.forget_topic(topic)

    def wanted_senders(self) -> dict[tuple[str, int], tuple[str, int]]:
        """One sender per incarnation: (kind, id) -> (address, broker epoch); gateways have epoch -1."""
        wanted = {("b", b.broker_id): (b.address, b.broker_epoch) for b in self.ctx.live_brokers.values()}
        wanted.update({("g", g.gateway_id): (g.address, -1) for g in self.ctx.live_gateways.values()})
        return wanted

    def _sync_senders(self) -> None:
        wanted = self.wanted_senders()
        for key in list(self.senders):
            sender = self.senders[key]
            if wanted.get(key) != (sender.address, sender.broker_epoch):
                stopping = asyncio.ensure_future(sender.stop())
                self._stopping_senders.add(stopping)
                stopping.add_done_callback(self._stopping_senders.discard)
                del self.senders[key]
        for key, (address, broker_epoch) in wanted.items():
            if key not in self.senders:
                self.senders[key] = BrokerSender(
                    address, self.peers, is_gateway=key[0] == "g", broker_epoch=broker_epoch
                )

    def header(self, broker_id: int) -> common_pb2.ControllerHeader:
        return common_pb2.ControllerHeader(
            controller_id=self.ctx.controller_id,
            controller_epoch=self.epoch,
            broker_epoch=self.ctx.with_broker_epoch(broker_id),
        )

    def _send(self, result: ControllerResult) -> None:
        """Queue the result's RPCs: LeaderAndIsr and StopReplica first, UpdateMetadata after."""
        for _ in self._send_steps(result):
            pass

    async def _send_in_slices(self, result: ControllerResult) -> None:
        """_send, letting other tasks run between requests: the failover's requests at 100,000
        partitions take seconds to build, and the controller answers reads meanwhile."""
        for _ in self._send_steps(result):
            await asyncio.sleep(0)

    def _send_steps(self, result: ControllerResult) -> Iterator[None]:
        """_send as a generator that yields after each request it queues."""
        rpcs = result.rpcs
        # Filled as requests are queued: an admin call waits on them (ControllerServicer._run).
        futures: list[asyncio.Future[Any]] = []
        result.rpc_futures = futures
        leader_and_isr = rpcs.leader_and_isr
        if rpcs.leader_and_isr_everywhere:
            leader_and_isr = {b: set(tps) for b, tps in leader_and_isr.items()}  # the result stays as decided
            yield from self._fan_out_everywhere(leader_and_isr)
        for broker_id, tps in sorted(leader_and_isr.items()):
            sender = self.senders.get(("b", broker_id))
            if sender is None:
                continue
            parts = []
            leaders: dict[int, common_pb2.BrokerNode] = {}
            named = [tp for tp in sorted(tps) if tp[0] in self.ctx.topics]
            states = self.ctx.states
            # The encodings of those with a state in bulk, in order; one without is encoded alone.
            encoded = iter(self.state_protos.wires(named, states, self.ctx.topics))
            for tp in named:
                parts.append(
                    wire.leader_and_isr_partition(
                        next(encoded) if tp in states else self.state_wire(tp),
                        self.config_wire(tp[0]),
                        is_new=(broker_id, tp) in rpcs.new_replicas,
                    )
                )
                leader_id = states[tp].leader if tp in states else NO_LEADER
                if leader_id not in leaders and (leader := self.ctx.live_brokers.get(leader_id)):
                    leaders[leader.broker_id] = leader.to_proto()
            if parts:
                body = wire.leader_and_isr_body(parts, list(leaders.values()))
                futures.append(sender.send("LeaderAndIsr", wire.with_header(body, self.header(broker_id))))
                yield
        for broker_id, deletes in sorted(rpcs.stop_replica.items()):
            sender = self.senders.get(("b", broker_id))
            if sender is None:
                continue
            fut = sender.send(
                "StopReplica",
                broker_pb2.StopReplicaRequest(
                    header=self.header(broker_id),
                    partitions=[
                        broker_pb2.StopReplicaPartition(
                            topic=tp[0], partition=tp[1], leader_epoch=-2, delete_partition=delete
                        )
                        for tp, delete in sorted(deletes.items())
                    ],
                ),
            )
            deleted = [
                tp for tp, delete in sorted(deletes.items()) if delete and tp[0] in self.ctx.topics_to_delete
            ]
            if deleted:
                epoch = self.ctx.with_broker_epoch(broker_id)
                fut.add_done_callback(functools.partial(self._deletion_answered, broker_id, epoch, deleted))
            futures.append(fut)
            yield
        if (rpcs.full_metadata or rpcs.update_metadata or rpcs.deleted_topics) and self.senders:
            # One body encoded, each target's header appended (wire.py: at 100,000 partitions a
            # copy of the composed request per target cost 66 ms each, its serialization 17 ms).
            body = self.update_metadata_body(
                full=rpcs.full_metadata, tps=rpcs.update_metadata, deleted=rpcs.deleted_topics
            )
            for (kind, target_id), sender in sorted(self.senders.items()):
                header = common_pb2.ControllerHeader(
                    controller_id=self.ctx.controller_id,
                    controller_epoch=self.epoch,
                    broker_epoch=self.ctx.with_broker_epoch(target_id) if kind == "b" else -1,
                )
                futures.append(sender.send("UpdateMetadata", wire.with_header(body, header)))
                yield

    def _fan_out_everywhere(self, leader_and_isr: dict[int, set[TopicPartitionKey]]) -> Iterator[None]:
        """Add every partition not being deleted to the set of each of its live replicas, yielding
        after each topic (a failover's fan-out: results.ControlRpcs.leader_and_isr_everywhere)."""
        ctx = self.ctx
        live = {b for b in ctx.live_brokers if ctx.is_live(b)}
        per_broker = {b: leader_and_isr.setdefault(b, set()) for b in live}
        for name in sorted(ctx.topics):
            if name in ctx.topics_to_delete:
                continue
            for p, replicas in ctx.topics[name].assignment.items():
                for r in replicas:
                    targets = per_broker.get(r)
                    if targets is not None:
                        targets.add((name, p))
            yield
        for b in [b for b, tps in leader_and_isr.items() if not tps]:
            del leader_and_isr[b]

    def _deletion_answered(
        self, broker_id: int, broker_epoch: int, tps: list[TopicPartitionKey], fut: asyncio.Future[Any]
    ) -> None:
        answer = None if fut.cancelled() or fut.exception() is not None else fut.result()
        self.deletion_answered(broker_id, broker_epoch, tps, answer)

    def deletion_answered(
        self,
        broker_id: int,
        broker_epoch: int,
        tps: list[TopicPartitionKey],
        answer: broker_pb2.StopReplicaResponse | None,
    ) -> None:
        """Queue a StopReplica(delete) outcome (None: no answer) for the incarnation it was sent to."""
        if self.resigned.is_set():
            return
        ok = (
            answer is not None
            and answer.error_code == common_pb2.NONE
            and all(p.error_code == common_pb2.NONE for p in answer.partitions)
        )
        self.enqueue(
            "ReplicaDeletionResult",
            lambda: deletion.on_replica_deletion_result(self.ctx, broker_id, broker_epoch, tps, ok),
        )

    def update_metadata_body(
        self, *, full: bool, tps: set[TopicPartitionKey], deleted: set[str]
    ) -> wire.Serialized:
        """An UpdateMetadataRequest without its header (wire.with_header adds each target's)."""
        chosen = self.ctx.partitions() if full else sorted(tp for tp in tps if tp[0] in self.ctx.topics)
        topics = {tp[0] for tp in chosen}
        rest = broker_pb2.UpdateMetadataRequest(
            live_brokers=[b.to_proto() for b in self.ctx.live_brokers.values()],
            live_gateways=[
                common_pb2.GatewayNode(gateway_id=g.gateway_id, host=g.host, port=g.port)
                for g in self.ctx.live_gateways.values()
            ],
            full=full,
            deleted_topics=sorted(deleted),
            topic_configs={t: self.config_proto(t) for t in topics},
            topic_ids={t: self.ctx.topics[t].topic_id for t in topics},
        )
        states = (
            self.partition_wires()
            if full
            else self.state_protos.wires(chosen, self.ctx.states, self.ctx.topics)
        )
        return wire.update_metadata_body(rest, states)

    # ---- producer ids ---------------------------------------------------------------------------

    async def next_producer_id(self) -> int:
        """Producer ids come in blocks reserved in etcd, so two controllers never hand out the same id."""
        nxt, end = self._producer_ids
        if nxt >= end:
            key = self.keys.producer_id_block
            for _ in range(10):
                kv = await self.store.get(key)
                start = values.decode_producer_id_block(kv.value) if kv is not None else 0
                compare = (
                    compare_mod_revision(key, kv.mod_revision) if kv is not None else compare_missing(key)
                )
                txn = await fenced_txn(
                    self.store,
                    self.epoch,
                    [compare],
                    [Put(key, values.encode_producer_id_block(start + PRODUCER_ID_BLOCK_IDS)), Get(key)],
                )
                if txn.succeeded:
                    nxt, end = start, start + PRODUCER_ID_BLOCK_IDS
                    break
            else:
                raise RuntimeError("could not reserve a producer id block in etcd (contention)")
        self._producer_ids = (nxt + 1, end)
        return nxt
