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

from clients.common.errors import InvariantViolation
from clients.common.types import TopicPartitionKey
from coordinator import values
from coordinator.election import ControllerFenced, fenced_txn
from coordinator.keys import Keys
from coordinator.store import EtcdStore, Put, compare_missing
from protos.highwater.v1 import broker_pb2, common_pb2
from services.common import limits
from services.common.peers import PeerChannels
from services.common.server import halt_on_invariant_violation
from services.controller import (
    admin_requests,
    deletion,
    etcd_writes,
    handlers,
    metrics,
    producer_ids,
    reassignment,
    watches,
)
from services.controller.context import BrokerInfo, ControllerContext
from services.controller.control_requests import control_requests
from services.controller.etcd_writes import encode_partition_state, encode_topic
from services.controller.metadata_image import MetadataImage, broker_info, gateway_info, load_image
from services.controller.proto_cache import ProtoCache
from services.controller.results import ControllerResult, TopicDelete, apply_write
from services.controller.senders import BrokerSender

# Names other modules and tests import from here (their homes: etcd_writes.py, senders.py).
__all__ = [
    "BrokerSender",
    "ControllerEventLoop",
    "ControllerResigned",
    "Startup",
    "encode_partition_state",
    "encode_topic",
]

log = logging.getLogger("highwater.controller")

# An event that takes at least this long from decision to queued requests is logged with
# where its time went.
SLOW_EVENT_LOG_S = 0.1


class ControllerResigned(Exception):
    """The loop stopped acting: its epoch was fenced or its lease lost."""


@dataclass
class _Event:
    name: str
    handler: Callable[[], ControllerResult]
    done: asyncio.Future[ControllerResult]
    enqueued_at: float = field(default_factory=time.monotonic)


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
        # Built protos of partition states and topic configs and their encodings, each kept with
        # what it was built from; a warm standby hands over the ones it built.
        self.protos = ProtoCache()

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
        self.protos.take(image.protos)
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
        """Requests written by hand under /admin (Kafka's znode-based admin tools), queued as events."""
        await watches.watch_admin(self.store, revision, self._on_admin_write)

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
        """On any change under prefix, queue one membership event carrying the whole set."""
        await watches.watch_membership(
            self.store, prefix, revision, lambda kvs: self._membership_event(name, kvs)
        )

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
            txns = await etcd_writes.commit(self.store, self.epoch, result.writes)
            self.protos.states_written()
            for write in result.writes:
                apply_write(self.ctx, write)
                if isinstance(write, TopicDelete):
                    self.protos.forget_topic(write.topic)
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

    # ---- built protos (proto_cache.py), for the servicer's answers ------------------------------

    def state_proto(self, tp: TopicPartitionKey) -> common_pb2.PartitionState:
        """ctx.partition_state_proto(tp), built once per state (context.StateProtos)."""
        return self.protos.state_proto(self.ctx, tp)

    def partition_wires(self) -> list[bytes]:
        """The encodings of every partition with a state, in ctx.partitions() order (wire.py)."""
        return self.protos.partition_wires(self.ctx)

    def config_proto(self, topic: str) -> common_pb2.TopicConfig:
        """topic_config_proto of the topic's configs, built once per configs dict (replaced on change)."""
        return self.protos.config_proto(self.ctx, topic)

    # ---- control requests: one sender per broker incarnation (senders.py) ----------------------

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
        """_send as a generator that yields after each request it queues (control_requests.py
        builds them)."""
        # Filled as requests are queued: an admin call waits on them (ControllerServicer._run).
        futures: list[asyncio.Future[Any]] = []
        result.rpc_futures = futures
        for request in control_requests(self.ctx, result.rpcs, self.protos, self.epoch, self.senders.keys()):
            if request is None:
                yield  # a slice of the failover's fan-out
                continue
            sender = self.senders.get(request.target)
            if sender is None:
                continue
            fut = sender.send(request.rpc, request.request)
            if request.deleted:
                fut.add_done_callback(
                    functools.partial(
                        self._deletion_answered, request.target[1], request.broker_epoch, request.deleted
                    )
                )
            futures.append(fut)
            yield

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

    # ---- producer ids ---------------------------------------------------------------------------

    async def next_producer_id(self) -> int:
        """Producer ids come in blocks reserved in etcd, so two controllers never hand out the same id."""
        nxt, end = self._producer_ids
        if nxt >= end:
            nxt, end = await producer_ids.reserve_block(self.store, self.epoch)
        self._producer_ids = (nxt + 1, end)
        return nxt
