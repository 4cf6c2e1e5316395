"""The transaction coordinator in the simulation (issue 41): the real TransactionDriver on a sim node.

The driver is asyncio code (a completion task per prepared transaction, `asyncio.sleep` between
marker rounds, `asyncio.wait` in `recover`), so `run_sync` alone cannot drive it. Each incarnation
of the node owns a private asyncio event loop whose clock is the simulation's (`SimTimeLoop`),
and the node pumps it after every simulation event that touches it (a request, a marker answer,
its timer): the loop runs until every task waits on something only the simulation can deliver.
Nothing waits on real time and tasks run in FIFO order, so a run stays a function of its seed.

What the driver is given, as on a broker (services/transactions/hosting.py):
- its store: the node's etcd client (the simulated etcd, reachability included);
- producer ids: hosting.ControllerProducerIds over InitProducerId to the active controller, sent
  through the simulated network;
- markers: `SimMarkerWriter`, WriteTxnMarkers to each partition's leader (as the node's metadata
  view knows it) through the simulated network, answered by the real BrokerCore.write_txn_markers.

Faults at every step of a commit: `CommitFaults` decides, per marker round, whether the node dies
before sending (PrepareX stored, no marker written), after the first partition's answer (between
markers), or once every answer is in (before `complete` is stored), and whether a leader being
written to crashes. A dead node's tasks are cancelled and its loop closed; the restarted node
calls `recover()`, and `tick()` every TXN_TICK_MS aborts timed-out transactions.
"""

from __future__ import annotations

import asyncio
import random
import selectors
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from clients.common.types import TopicPartitionKey
from coordinator.election import current_controller
from coordinator.store import CoordinatorError
from protos.highwater.v1 import common_pb2
from services.kafka.handler_common import BackendUnavailable
from services.transactions.coordinator import TopicPartitions, TxnAnswer, TxnError, TxnRequest
from services.transactions.driver import MARKER_WRITTEN, TransactionDriver
from services.transactions.hosting import ControllerProducerIds
from services.transactions.marker_writer import LEADER_UNREACHABLE, NO_LEADER, marker_request
from tests.sim.clock import EventLoop
from tests.sim.config import WALL_CLOCK_BASE_MS
from tests.sim.network import Envelope, Network, RpcError, RpcNode
from tests.sim.sim_broker_seams import broker_node, controller_node
from tests.sim.sim_etcd import SimEtcd
from tests.sim.workload import MetadataView

T = TypeVar("T")

TXN_COORDINATOR = "txn-coord"
# The coordinator's own steps (timeouts, resuming prepared transactions) run this often: the real
# TRANSACTION_TIMEOUT_CHECK_INTERVAL_MS (10 s) is most of a run; 1 s makes timeouts happen in one.
TXN_TICK_MS = 1_000
# Between simulation events the node's asyncio loop is pumped this often, for the driver's own
# sleeps (the backoff between marker rounds).
PUMP_INTERVAL_MS = 50
# One pump runs the asyncio loop this many times round: enough for every task to reach its next
# wait on the simulation (a driver step suspends at most a few times between two of those).
PUMP_ROUNDS = 6
# WriteTxnMarkers: how long the leader may wait for its ISR, and the RPC's own deadline beyond it.
MARKER_TIMEOUT_MS = 2_000
MARKER_RPC_SLACK_MS = 1_000
CONTROLLER_RPC_TIMEOUT_MS = 3_000
# A crashed coordinator comes back this long after (ms).
COORDINATOR_RESTART_AFTER_MS = (200, 2_500)


class SimTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose clock is the simulation's: its timers fire when simulated time has
    passed them and the node pumps it; it never waits on the selector (a pump always has a ready
    callback: its own `sleep(0)`)."""

    def __init__(self, sim_loop: EventLoop) -> None:
        super().__init__(selectors.SelectSelector())
        self._sim_loop = sim_loop

    def time(self) -> float:
        return self._sim_loop.now_ms / 1000


class SimAsyncio:
    """One process's asyncio loop, pumped by the simulation."""

    def __init__(self, sim_loop: EventLoop) -> None:
        self.aio = SimTimeLoop(sim_loop)

    def start(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = self.aio.create_task(coro)
        self.pump()
        return task

    def pump(self) -> None:
        for _ in range(PUMP_ROUNDS):
            self.aio.run_until_complete(asyncio.sleep(0))

    def close(self) -> None:
        """The process died: its tasks stop where they wait (a cancelled driver task writes nothing)."""
        for task in asyncio.all_tasks(self.aio):
            task.cancel()
        self.pump()
        self.aio.close()


@dataclass
class CommitFaults:
    """Chances, per marker round, of the coordinator dying at each step of a commit, and of a
    leader crashing while its marker is on the way."""

    before_markers: float = 0.0
    between_markers: float = 0.0
    before_complete: float = 0.0
    leader_crash: float = 0.0
    # Mechanism off (the checker must notice): one partition of every transaction of two or more
    # is reported written without its marker being sent.
    skip_one_marker: bool = False


class SimMarkerWriter:
    """The driver's MarkerWriter: one WriteTxnMarkers per partition to its leader."""

    def __init__(self, host: SimTxnCoordinator) -> None:
        self._host = host

    async def write_markers(
        self, producer_id: int, producer_epoch: int, commit: bool, partitions: TopicPartitions
    ) -> Mapping[TopicPartitionKey, str]:
        host = self._host
        answers: dict[TopicPartitionKey, str] = {}
        done: asyncio.Future[dict[TopicPartitionKey, str]] = host.aio.aio.create_future()
        todo = sorted(partitions)
        if host.faults.skip_one_marker and len(todo) > 1:
            answers[todo.pop()] = MARKER_WRITTEN
        if host.maybe_die(host.faults.before_markers, "PrepareX stored, before any marker"):
            return await done
        waiting = set(todo)

        def answered(tp: TopicPartitionKey, resp: Any) -> None:
            answers[tp] = _marker_error(resp, tp)
            waiting.discard(tp)
            host.trace(
                "%s marker of %d/%d on %s-%d: %s",
                "COMMIT" if commit else "ABORT",
                producer_id,
                producer_epoch,
                *tp,
                answers[tp],
            )
            if answers[tp] != MARKER_WRITTEN:
                host.metadata.refresh(lambda: None)  # the next round goes to the new leader
            if host.dying:
                return
            if waiting and host.maybe_die(host.faults.between_markers, "between markers"):
                return
            if not waiting and not host.maybe_die(
                host.faults.before_complete, "markers written, before complete"
            ):
                done.set_result(answers)
            host.aio.pump()

        for tp in todo:
            leader = host.metadata.leaders.get(tp, -1)
            if leader < 0:
                answers[tp] = NO_LEADER
                waiting.discard(tp)
                continue
            host.send_marker(leader, tp, producer_id, producer_epoch, commit, answered)
        if not waiting:
            done.set_result(answers)
        if any(a != MARKER_WRITTEN for a in answers.values()):
            host.metadata.refresh(lambda: None)
        return await done


def _marker_error(resp: Any, tp: TopicPartitionKey) -> str:
    if isinstance(resp, RpcError):
        return str(LEADER_UNREACHABLE)
    for marker in resp.markers:
        for topic in marker.topics:
            for p in topic.partitions:
                if (topic.topic, p.partition) == tp:
                    name: str = common_pb2.ErrorCode.Name(p.error_code)
                    return name
    return str(LEADER_UNREACHABLE)


class SimTxnCoordinator(RpcNode):
    """The transaction coordinator's process: serves "Txn" requests (a TxnRequest, answered with
    a TxnAnswer) through the real driver; crashes and restarts on the fault hooks."""

    def __init__(
        self,
        loop: EventLoop,
        network: Network,
        etcd: SimEtcd,
        rng: random.Random,
        broker_ids: list[int],
        faults: CommitFaults,
        crash_leader: Callable[[int], None],
    ) -> None:
        super().__init__(TXN_COORDINATOR, loop, network)
        self.etcd = etcd
        self.etcd_client = etcd.client(self)
        self.rng = rng
        self.faults = faults
        self._broker_ids = broker_ids
        self._crash_leader = crash_leader
        # Deaths by commit step (for the report), and whether faults may still fire.
        self.deaths: dict[str, int] = {}
        self.faults_active = True
        self.dying = False
        self._start_process()

    def _start_process(self) -> None:
        self.dying = False
        # A new process knows nothing of the old one's metadata (nor of its refresh in flight).
        self.metadata = MetadataView(self, self._broker_ids, self.rng)
        self.aio = SimAsyncio(self.loop)
        self.driver = TransactionDriver(
            self.etcd_client,  # type: ignore[arg-type]  # it serves every call the driver makes
            SimMarkerWriter(self),
            ControllerProducerIds(self._call_controller),
            clock=lambda: WALL_CLOCK_BASE_MS + self.loop.now_ms,
        )
        self.metadata.refresh(lambda: None)
        self.aio.start(self._recover())
        self.after(TXN_TICK_MS, self._tick)
        self.after(PUMP_INTERVAL_MS, self._pump_tick)

    async def _recover(self) -> None:
        try:
            recovered = await self.driver.recover()
        except CoordinatorError as exc:
            self.trace("recover: %s (the next tick resumes)", exc)
            return
        if recovered:
            self.trace("recovered %s", recovered)

    def _tick(self) -> None:
        self.aio.start(self._tick_once())
        self.after(TXN_TICK_MS, self._tick)

    async def _tick_once(self) -> None:
        try:
            report = await self.driver.tick(WALL_CLOCK_BASE_MS + self.loop.now_ms)
        except CoordinatorError as exc:
            self.trace("tick: %s", exc)
            return
        if report.aborted:
            self.trace("timed out, aborted: %s", report.aborted)

    def _pump_tick(self) -> None:
        self.aio.pump()
        self.after(PUMP_INTERVAL_MS, self._pump_tick)

    # ---- requests --------------------------------------------------------------------------------

    def on_request(self, env: Envelope) -> None:
        if env.rpc != "Txn":
            raise ValueError(f"{self.name}: unknown rpc {env.rpc}")
        self.aio.start(self._answer(env, env.body))

    async def _answer(self, env: Envelope, request: TxnRequest) -> None:
        try:
            answer = await self.driver.handle(request)
        except CoordinatorError as exc:
            answer = TxnAnswer(TxnError.COORDINATOR_NOT_AVAILABLE, str(exc))
        self.reply(env, answer)

    async def _call_controller(self, rpc: str, request: Any) -> Any:
        try:
            info = await current_controller(self.etcd_client)  # type: ignore[arg-type]
        except CoordinatorError as exc:
            raise BackendUnavailable(str(exc)) from exc
        if not info:
            raise BackendUnavailable("no active controller")
        answer: asyncio.Future[Any] = self.aio.aio.create_future()

        def answered(resp: Any) -> None:
            if not answer.done():
                answer.set_result(resp)
                self.aio.pump()

        self.call(
            controller_node(int(info["controller_id"])), rpc, request, CONTROLLER_RPC_TIMEOUT_MS, answered
        )
        resp = await answer
        if isinstance(resp, RpcError):
            raise BackendUnavailable(f"{rpc} to the controller: {resp}")
        return resp

    def send_marker(
        self,
        leader: int,
        tp: TopicPartitionKey,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        answered: Callable[[TopicPartitionKey, Any], None],
    ) -> None:
        request = marker_request(
            [tp], producer_id, producer_epoch, commit, coordinator_epoch=0, timeout_ms=MARKER_TIMEOUT_MS
        )
        self.call(
            broker_node(leader),
            "WriteTxnMarkers",
            request,
            MARKER_TIMEOUT_MS + MARKER_RPC_SLACK_MS,
            lambda resp: answered(tp, resp),
        )
        if self.faults_active and self.rng.random() < self.faults.leader_crash:
            self._crash_leader(leader)

    # ---- faults ----------------------------------------------------------------------------------

    def maybe_die(self, chance: float, step: str) -> bool:
        """With `chance`, die now at `step` of a commit (the rest of this event does nothing and
        the process is gone before its next one). True when it dies."""
        if not self.faults_active or self.dying or self.rng.random() >= chance:
            return False
        self.dying = True
        self.deaths[step] = self.deaths.get(step, 0) + 1
        self.trace("CRASH (%s)", step)
        self.loop.call_at(self.loop.now_ms, self.crash_process)
        return True

    def crash_process(self) -> None:
        if not self.up:
            return
        self.crash()
        self.aio.close()
        self.loop.call_at(
            self.loop.now_ms + self.rng.randint(*COORDINATOR_RESTART_AFTER_MS), self.restart_process
        )

    def stop(self) -> None:
        """The run is over: end the process's asyncio loop (its tasks are cancelled)."""
        if self.up:
            self.crash()
            self.aio.close()

    def restart_process(self) -> None:
        if self.up:
            return
        self.restart()
        self.trace("restart")
        self._start_process()
