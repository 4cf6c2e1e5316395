"""A controller candidate in the simulation: campaign, then the real event loop's decide-commit-send path.

`SimControllerLoop` *is* services/controller/event_loop.ControllerEventLoop: load(),
apply() (fenced etcd transactions in chunks, replay through results.apply_write,
then the RPC batches of _send) run unchanged on the simulated etcd through
`run_sync`. Only the transport is swapped: `_sync_senders` creates `SimSender`s
(one request at a time per broker incarnation, in decision order, sent again by
the same pure rule as BrokerSender: services/controller/sender_rules.py) instead of
asyncio tasks on gRPC channels.

What `SimController` re-implements is the asyncio around it, in the same order as
the real code: ControllerElection._try_once (the election transaction), server.py's
act() (start the loop, stop acting and resign when the lease is lost or the loop is
fenced), metadata_image.MetadataFollower (a standby loads the metadata once and
replays the whole prefix's watch into the real MetadataImage; on winning it takes the
image if caught up to the election's revision, else loads, as take() does), the
loop's _run error handling (ControllerFenced resigns, any other failure reloads from
etcd), the broker watch (read the whole prefix, queue one BrokerChange),
and the servicer's NOT_CONTROLLER answers and admin waits (DeleteTopics' included).

One deliberate difference: an InvariantViolation raised by the pure logic is not
swallowed by the "reload and carry on" branch of _run; it ends the run, since finding
those is the point of the simulation.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from clients.common.errors import HighwaterError, InvariantViolation
from coordinator.election import ControllerFenced
from coordinator.memory_store import MemoryWatch
from coordinator.store import (
    CoordinatorError,
    Get,
    Put,
    WatchCompacted,
    compare_missing,
    compare_mod_revision,
)
from coordinator.values import json_bytes
from protos.highwater.v1 import common_pb2, controller_pb2
from services.common.limits import ADMIN_PROPAGATION_WAIT_S
from services.controller import deletion, handlers, metadata_image, reassignment, sender_rules, wire
from services.controller.context import ControllerContext
from services.controller.event_loop import ControllerEventLoop
from services.controller.metadata_image import MetadataImage, load_image
from services.controller.results import ControllerResult
from tests.sim.clock import EventLoop
from tests.sim.config import SimConfig
from tests.sim.network import Envelope, Network, RpcError, RpcNode
from tests.sim.sim_broker import broker_node, controller_node
from tests.sim.sim_etcd import EtcdClient, SimEtcd, SimLease, run_sync

if TYPE_CHECKING:
    from tests.sim.checker import Checker


# The servicer polls its context this often while DeleteTopics waits (server.py: 20 ms; a
# coarser step costs fewer events and changes nothing the checker can see).
DELETE_TOPICS_POLL_MS = 100
# DeleteTopics' wait when the request names none (server.py: 30 s).
DELETE_TOPICS_TIMEOUT_MS_DEFAULT = 30_000
# The admin calls served by one handler on the request, each waiting for the RPCs it sends.
ADMIN_RPCS: dict[str, tuple[type, Callable[[ControllerContext, Any], ControllerResult]]] = {
    "CreateTopics": (common_pb2.CreateTopicsResponse, handlers.on_create_topics),
    "ElectLeaders": (common_pb2.ElectLeadersResponse, handlers.on_elect_leaders),
    "AlterPartitionReassignments": (
        common_pb2.AlterPartitionReassignmentsResponse,
        reassignment.on_alter_reassignments,
    ),
}


class SimFuture:
    """What BrokerSender.send returns: done once the RPC answered or gave up (asyncio.Future's surface)."""

    __slots__ = ("_callbacks", "done", "value")

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None
        self._callbacks: list[Callable[[], None]] = []

    def set(self, value: Any) -> None:
        if self.done:
            return
        self.done = True
        self.value = value
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_done(self, callback: Callable[[], None]) -> None:
        if self.done:
            callback()
        else:
            self._callbacks.append(callback)

    def add_done_callback(self, fn: Callable[[SimFuture], None]) -> None:
        self.on_done(lambda: fn(self))

    def result(self) -> Any:
        return self.value

    def cancelled(self) -> bool:
        return isinstance(self.value, RpcError) and self.value.code == "CANCELLED"

    def exception(self) -> BaseException | None:
        return RuntimeError(self.value.code) if isinstance(self.value, RpcError) else None


class SimSender:
    """BrokerSender: control requests to one broker incarnation in order, sent again by sender_rules."""

    def __init__(self, controller: SimController, broker_id: int, address: str, broker_epoch: int) -> None:
        self.controller = controller
        self.target = broker_node(broker_id)
        self.address = address
        self.broker_epoch = broker_epoch
        self.queue: deque[tuple[str, Any, SimFuture]] = deque()
        self.busy = False
        self.stopped = False

    def send(self, rpc: str, request: Any) -> SimFuture:
        if isinstance(request, wire.Serialized):
            # Sent in wire form, as gRPC would carry it: the simulated broker gets what it would parse.
            request = request.parse()
        fut = SimFuture()
        self.queue.append((rpc, request, fut))
        if not self.busy:
            self._next()
        return fut

    def _next(self) -> None:
        if self.stopped or not self.queue:
            self.busy = False
            return
        self.busy = True
        self._attempt(1)

    def _attempt(self, attempt: int) -> None:
        if self.stopped:
            return
        rpc, request, _ = self.queue[0]
        self.controller.call(
            self.target,
            rpc,
            request,
            self.controller.config.control_rpc_timeout_ms,
            lambda resp: self._answered(attempt, resp),
            address=self.address,
        )

    def _answered(self, attempt: int, response: Any) -> None:
        if self.stopped:
            return
        error_code = None if isinstance(response, RpcError) else getattr(response, "error_code", 0)
        pause_ms = sender_rules.retry_after_ms(attempt, error_code=error_code)
        if pause_ms is not None:
            self.controller.after(pause_ms, self._attempt, attempt + 1)
            return
        _, _, fut = self.queue.popleft()
        fut.set(response)
        self._next()

    def stop(self) -> None:
        self.stopped = True
        while self.queue:
            self.queue.popleft()[2].set(RpcError("CANCELLED"))


class SimControllerLoop(ControllerEventLoop):
    """The real ControllerEventLoop with simulated senders (see the module docstring)."""

    def __init__(self, node: SimController, store: EtcdClient, controller_id: int, epoch: int) -> None:
        super().__init__(store=store, controller_id=controller_id, epoch=epoch, peers=None)  # type: ignore[arg-type]
        self.node = node

    def _sync_senders(self) -> None:
        """One sender per live broker incarnation (gateways are not simulated)."""
        wanted = {key: v for key, v in self.wanted_senders().items() if key[0] == "b"}
        for key in list(self.senders):
            sender = self.senders[key]
            if wanted.get(key) != (sender.address, sender.broker_epoch):
                self.senders.pop(key).stop()  # type: ignore[attr-defined]
        for key, (address, broker_epoch) in sorted(wanted.items()):
            if key not in self.senders:
                self.senders[key] = SimSender(self.node, key[1], address, broker_epoch)  # type: ignore[assignment]

    def enqueue(self, name: str, handler: Callable[[], handlers.ControllerResult]) -> None:
        """An event nobody waits for: it runs after the ones already queued (a timer at now)."""
        self.node.after(0, self.node.process_queued, self, name, handler)

    def idle(self) -> bool:
        """No control request queued or in flight."""
        return all(not sender.busy for sender in self.senders.values())  # type: ignore[attr-defined]

    def stop_senders(self) -> None:
        for sender in self.senders.values():
            sender.stop()  # type: ignore[attr-defined]
        self.senders.clear()


class SimController(RpcNode):
    """One controller candidate process."""

    def __init__(
        self,
        controller_id: int,
        loop: EventLoop,
        network: Network,
        etcd: SimEtcd,
        config: SimConfig,
        checker: Checker,
    ) -> None:
        super().__init__(controller_node(controller_id), loop, network)
        self.controller_id = controller_id
        self.config = config
        self.etcd = etcd
        self.client = etcd.client(self)
        self.checker = checker
        # Set for the settle phase: no rebalancing, so the final check sees a cluster at rest.
        self.quiet = False
        etcd.watch(self, self._on_etcd_change)
        self._start_process()

    # ---- process lifecycle ---------------------------------------------------------------

    def _start_process(self) -> None:
        self.lease: SimLease | None = None
        self.epoch: int | None = None
        self.active: SimControllerLoop | None = None
        self.broker_watch: MemoryWatch | None = None
        self._stand_by()
        self.after(0, self._campaign)
        self.after(self.config.campaign_retry_ms, self._tick)

    def crash_process(self) -> None:
        self.trace("CRASH")
        if self.active is not None:
            self.active.stop_senders()
        self.crash()

    def restart_process(self) -> None:
        self.restart()
        self.trace("restart")
        self._start_process()

    def _tick(self) -> None:
        """The campaign's retry and the watch stream's reconnect-and-catch-up."""
        if self.active is None:
            self._follow()
            self._campaign()
        else:
            self._drain_broker_watch()
        self.after(self.config.campaign_retry_ms, self._tick)

    def _on_etcd_change(self) -> None:
        if self.active is None:
            self._follow()
            self._campaign()
        else:
            self._drain_broker_watch()

    # ---- standing by (metadata_image.MetadataFollower) ---------------------------------------

    def _stand_by(self) -> None:
        """Drop the metadata copy: the next _follow loads it afresh, then replays the watch."""
        self.standby_image: MetadataImage | None = None
        self.standby_watch: MemoryWatch | None = None
        self._follow()

    def _follow(self) -> None:
        """MetadataFollower._run: load once (retried while etcd is unreachable), then replay every
        change of the whole prefix; a compacted watch means a fresh load, never a gap."""
        if not self.client.reachable():
            return  # the stream waits; it catches up from its revision once etcd is back
        if self.standby_image is None or self.standby_watch is None:
            try:
                image = run_sync(load_image(self.client))
            except CoordinatorError:
                return
            self.standby_image = image
            self.standby_watch = self.etcd.subscribe(self.etcd.keys.prefix + "/", image.revision + 1)
        try:
            for events in self.standby_watch.drain():
                self.standby_image.replay(events)
            self.standby_image.warm_protos()
        except WatchCompacted:
            self.trace("standby: watch compacted; loading the metadata again")
            self.standby_image = self.standby_watch = None
            self._follow()

    def _take_standby_image(self, won_revision: int) -> MetadataImage | None:
        """MetadataFollower.take: the copy once caught up to the election's revision, else None."""
        self._follow()
        image, self.standby_image, self.standby_watch = self.standby_image, None, None
        if image is None or image.revision < won_revision:
            self.trace("standby's metadata not caught up to revision %d: loading it", won_revision)
            return None
        # The simulation's own check (the real follower trusts its replay): what the standby
        # replayed is what a fresh read of etcd gives now, as it has drained every change.
        loaded = run_sync(load_image(self.client))
        if image.context(self.controller_id, 0) != loaded.context(self.controller_id, 0):
            raise InvariantViolation(
                f"{self.name}: the standby's replayed metadata at revision {image.revision} differs from "
                f"a fresh load at revision {loaded.revision}"
            )
        return image

    # ---- election (ControllerElection._try_once) -------------------------------------------

    def _campaign(self) -> None:
        if self.active is not None:
            return
        keys = self.etcd.keys
        try:
            snapshot = run_sync(self.client.txn([], [Get(keys.controller), Get(keys.controller_epoch)]))
        except CoordinatorError:
            return
        controller_kvs, epoch_kvs = snapshot.gets
        if controller_kvs:
            return  # someone holds it; the watch brings us back when it is deleted
        epoch_kv = epoch_kvs[0] if epoch_kvs else None
        new_epoch = (int(epoch_kv.value) if epoch_kv is not None else 0) + 1
        try:
            lease = SimLease(self, self.client, self.config.lease_ttl_s, on_lost=self._on_lease_lost)
        except CoordinatorError:
            return
        value = {"host": self.name, "port": 9093, "controller_id": self.controller_id, "epoch": new_epoch}
        try:
            result = run_sync(
                self.client.txn(
                    [
                        compare_missing(keys.controller),
                        compare_mod_revision(keys.controller_epoch, epoch_kv.mod_revision)
                        if epoch_kv is not None
                        else compare_missing(keys.controller_epoch),
                    ],
                    [
                        Put(keys.controller, json_bytes(value), lease=lease.lease_id),
                        Put(keys.controller_epoch, str(new_epoch).encode()),
                    ],
                )
            )
        except CoordinatorError:
            lease.stop(revoke=True)
            return
        if not result.succeeded:
            lease.stop(revoke=True)
            return
        self.lease = lease
        self.epoch = new_epoch
        self.trace("elected controller, epoch %d", new_epoch)
        self._become_active(new_epoch, self._take_standby_image(result.revision))

    def _become_active(self, epoch: int, image: MetadataImage | None) -> None:
        """server.py act() and ControllerEventLoop.start(): cluster id, the standby's metadata (or a
        load), on_startup, watches, ticks."""
        loop = SimControllerLoop(self, self.client, self.controller_id, epoch)
        try:
            loop.cluster_id = run_sync(loop._cluster_id())
            revision = run_sync(loop.take_metadata(image))
            run_sync(loop.apply(handlers.on_startup(loop.ctx)))
            run_sync(loop._admin_requests_at_start())
        except InvariantViolation:
            raise
        except Exception as exc:
            self.trace("failed to start at epoch %d: %s", epoch, type(exc).__name__)
            loop.stop_senders()
            self._resign()
            return
        self.active = loop
        loop.queue_follow_ups("Startup")
        self.broker_watch = self.etcd.subscribe(self.etcd.keys.brokers_prefix, start_revision=revision + 1)
        self.checker.on_controller_active(self, epoch)
        if self.config.leader_imbalance_check_interval_ms > 0:
            self.after(self.config.leader_imbalance_check_interval_ms, self._rebalance_tick, loop)

    def _rebalance_tick(self, loop: SimControllerLoop) -> None:
        """_rebalance_ticks: queue AutoLeaderRebalance every leader.imbalance.check.interval."""
        if loop is not self.active or self.quiet:
            return
        loop.enqueue(
            "AutoLeaderRebalance",
            lambda: handlers.on_auto_leader_rebalance(loop.ctx, loop.leader_imbalance_per_broker_percentage),
        )
        self.after(self.config.leader_imbalance_check_interval_ms, self._rebalance_tick, loop)

    def _on_lease_lost(self) -> None:
        if self.active is not None:
            self._stop_acting("lease lost")
        elif self.lease is not None:
            self._resign()

    def _stop_acting(self, why: str) -> None:
        """act()'s finally: servicer.active = None, loop.stop(), election.resign(); then campaign again."""
        self.trace("stops acting at epoch %s (%s)", self.epoch, why)
        loop, self.active = self.active, None
        if loop is not None:
            loop.stop_senders()
        self._resign()
        self._stand_by()
        self.after(0, self._campaign)

    def _resign(self) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.stop(revoke=True)
        self.broker_watch = None

    # ---- the event loop's _run, one event at a time ----------------------------------------

    def process_queued(
        self, loop: SimControllerLoop, name: str, handler: Callable[[], handlers.ControllerResult]
    ) -> None:
        if loop is self.active:
            self._process(name, handler)

    def _process(
        self, name: str, handler: Callable[[], handlers.ControllerResult]
    ) -> handlers.ControllerResult | Exception:
        """One turn of _run: decide, commit (fenced), replay, send.
        Returns the result or the caller's error.
        """
        loop = self.active
        if loop is None:
            return ControllerResignedError("not active")
        try:
            result = handler()
            run_sync(loop.apply(result))
            loop.queue_follow_ups(name)
            return result
        except ControllerFenced as exc:
            self.trace("%s fenced: %s", name, exc)
            self._stop_acting("fenced")
            return ControllerResignedError(str(exc))
        except InvariantViolation:
            raise
        except Exception as exc:
            self.trace("%s failed (%s); reloading state from etcd", name, exc)
            self._resync(loop)
            return exc

    def _resync(self, loop: SimControllerLoop) -> None:
        try:
            loop.ctx = ControllerContext(controller_id=loop.ctx.controller_id, epoch=loop.epoch)
            run_sync(loop.load())
        except InvariantViolation:
            raise
        except Exception:
            self._stop_acting("reload failed")

    def _drain_broker_watch(self) -> None:
        """_watch(): on any change under /brokers/ids, read the whole prefix and queue one BrokerChange."""
        watch = self.broker_watch
        if watch is None or not self.client.reachable():
            return  # the watch stream is down; it catches up from its revision once etcd is back
        if not watch.drain():
            return
        try:
            kvs, _ = run_sync(self.client.get_prefix(self.etcd.keys.brokers_prefix))
        except CoordinatorError:
            return
        registered = {}
        for kv in kvs:
            info = metadata_image.broker_info(kv.value, kv.create_revision)
            registered[info.broker_id] = info
        loop = self.active
        bounced = sorted(
            b
            for b, info in registered.items()
            if loop is not None
            and b in loop.ctx.live_brokers
            and loop.ctx.live_brokers[b].broker_epoch != info.broker_epoch
        )
        self.trace(
            "BrokerChange: live %s%s", sorted(registered), f" (re-registered: {bounced})" if bounced else ""
        )
        if loop is not None:
            loop.enqueue("BrokerChange", lambda: handlers.on_broker_change(loop.ctx, registered))

    # ---- the servicer --------------------------------------------------------------------------

    def on_request(self, env: Envelope) -> None:
        rpc = env.rpc
        body = env.body
        if rpc == "AlterPartition":
            self._serve(
                env, controller_pb2.AlterPartitionResponse, lambda ctx: handlers.on_alter_partition(ctx, body)
            )
        elif rpc == "ControlledShutdown":
            self._serve(
                env,
                controller_pb2.ControlledShutdownResponse,
                lambda ctx: handlers.on_controlled_shutdown(ctx, body.broker_id, body.broker_epoch),
                wait_rpcs=True,
            )
        elif rpc in ADMIN_RPCS:
            response_cls, handler = ADMIN_RPCS[rpc]
            self._serve(env, response_cls, lambda ctx: handler(ctx, body), wait_rpcs=True)
        elif rpc == "DeleteTopics":
            self._delete_topics(env)
        elif rpc == "InitProducerId":
            self._init_producer_id(env)
        else:
            raise ValueError(f"{self.name}: unknown rpc {rpc}")

    def _serve(
        self,
        env: Envelope,
        response_cls: type,
        decide: Callable[[ControllerContext], handlers.ControllerResult],
        *,
        wait_rpcs: bool = False,
    ) -> None:
        """ControllerServicer._run: NOT_CONTROLLER when standing by or resigned, else the handler's answer."""
        if self.active is None:
            self.reply(
                env, response_cls(error_code=common_pb2.NOT_CONTROLLER, error_message="not the controller")
            )
            return
        loop = self.active
        outcome = self._process(env.rpc, lambda: decide(loop.ctx))
        if isinstance(outcome, ControllerResignedError):
            self.reply(env, response_cls(error_code=common_pb2.NOT_CONTROLLER, error_message=str(outcome)))
            return
        if isinstance(outcome, HighwaterError):
            self.reply(env, response_cls(error_code=outcome.code, error_message=outcome.message))
            return
        if isinstance(outcome, Exception):
            self.reply(env, RpcError("UNKNOWN", str(outcome)))
            return
        futures = [f for f in outcome.rpc_futures if isinstance(f, SimFuture)]
        if not wait_rpcs or all(f.done for f in futures):
            self.reply(env, outcome.response)
            return
        # asyncio.wait(result.rpc_futures, timeout=ADMIN_PROPAGATION_WAIT_S)
        answered = [False]

        def answer() -> None:
            if not answered[0] and (all(f.done for f in futures) or self.loop.now_ms >= deadline_ms):
                answered[0] = True
                self.reply(env, outcome.response)

        deadline_ms = self.loop.now_ms + int(ADMIN_PROPAGATION_WAIT_S * 1000)
        for f in futures:
            f.on_done(answer)
        self.after(int(ADMIN_PROPAGATION_WAIT_S * 1000), answer)

    def _delete_topics(self, env: Envelope) -> None:
        """ControllerServicer.DeleteTopics: the TopicDeletion turn, then a bounded wait for every replica."""
        names = list(env.body.names)
        loop = self.active
        if loop is None:
            self.reply(
                env,
                common_pb2.DeleteTopicsResponse(
                    error_code=common_pb2.NOT_CONTROLLER, error_message="not the controller"
                ),
            )
            return
        outcome = self._process(
            "DeleteTopics",
            lambda: deletion.on_delete_topics(loop.ctx, names, deletion_enabled=loop.delete_topic_enable),
        )
        if isinstance(outcome, ControllerResignedError):
            self.reply(
                env,
                common_pb2.DeleteTopicsResponse(
                    error_code=common_pb2.NOT_CONTROLLER, error_message=str(outcome)
                ),
            )
            return
        if isinstance(outcome, HighwaterError):
            self.reply(
                env, common_pb2.DeleteTopicsResponse(error_code=outcome.code, error_message=outcome.message)
            )
            return
        if isinstance(outcome, Exception):
            self.reply(env, RpcError("UNKNOWN", str(outcome)))
            return
        response: common_pb2.DeleteTopicsResponse = outcome.response
        deadline_ms = self.loop.now_ms + (env.body.timeout_ms or DELETE_TOPICS_TIMEOUT_MS_DEFAULT)
        self._await_deletion(env, loop, response, deadline_ms)

    def _await_deletion(
        self,
        env: Envelope,
        loop: SimControllerLoop,
        response: common_pb2.DeleteTopicsResponse,
        deadline_ms: int,
    ) -> None:
        """Answer once every started deletion left the context, or REQUEST_TIMED_OUT at the deadline."""
        waiting = [
            a for a in response.topics if a.error_code == common_pb2.NONE and a.name in loop.ctx.topics
        ]
        if waiting and loop is self.active and self.loop.now_ms < deadline_ms:
            self.after(DELETE_TOPICS_POLL_MS, self._await_deletion, env, loop, response, deadline_ms)
            return
        for answer in waiting:
            answer.error_code = common_pb2.REQUEST_TIMED_OUT
            answer.error_message = (
                f"deletion of {answer.name!r} started but not every replica confirmed in time; "
                "it completes when they do"
            )
        self.reply(env, response)

    def _init_producer_id(self, env: Envelope) -> None:
        """ControllerServicer.InitProducerId: a bumped epoch for a known producer, else a new id from etcd."""
        loop = self.active
        request = env.body
        if loop is None:
            self.reply(env, common_pb2.InitProducerIdResponse(error_code=common_pb2.NOT_CONTROLLER))
            return
        if request.producer_id >= 0:
            self.reply(
                env,
                common_pb2.InitProducerIdResponse(
                    producer_id=request.producer_id, producer_epoch=max(request.producer_epoch, 0) + 1
                ),
            )
            return
        try:
            producer_id = run_sync(loop.next_producer_id())
        except InvariantViolation:
            raise
        except Exception as exc:  # ControllerFenced included: the servicer lets it out as a gRPC error
            self.reply(env, RpcError("UNKNOWN", str(exc)))
            return
        self.reply(env, common_pb2.InitProducerIdResponse(producer_id=producer_id, producer_epoch=0))


class ControllerResignedError(Exception):
    """event_loop.ControllerResigned, as the simulated servicer sees it."""
