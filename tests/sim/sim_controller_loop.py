"""The real controller event loop with the simulation's transport and timers.

`SimControllerLoop` *is* services/controller/event_loop.ControllerEventLoop: begin(),
turn() and apply() (fenced etcd transactions in chunks, replay through
results.apply_write, then the RPC batches of _send) run unchanged on the simulated etcd
through `run_sync`. Only the transport and the queue are swapped: `SimSender` stands in
for event_loop.BrokerSender (control requests to one broker incarnation, one at a time and
in decision order, sent again by the same pure rule: services/controller/sender_rules.py).
`SimFuture` is what its send() returns (asyncio.Future's surface, as the event loop and
the servicer read it); a queued event runs as a timer of the controller node.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from clients.common.errors import InvariantViolation
from coordinator.memory_store import MemoryWatch
from coordinator.store import CoordinatorError
from services.controller import sender_rules, wire
from services.controller.event_loop import ControllerEventLoop
from services.controller.results import ControllerResult
from tests.sim.network import RpcError
from tests.sim.sim_broker_seams import broker_node
from tests.sim.sim_etcd import EtcdClient, run_sync

if TYPE_CHECKING:
    from tests.sim.sim_controller import SimController


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
    """The real ControllerEventLoop with simulated senders and timers for its queue."""

    def __init__(self, node: SimController, store: EtcdClient, controller_id: int, epoch: int) -> None:
        super().__init__(store=store, controller_id=controller_id, epoch=epoch, peers=None)  # type: ignore[arg-type]
        self.node = node
        self.broker_watch: MemoryWatch | None = None

    def _sync_senders(self) -> None:
        """One sender per live broker incarnation (gateways are not simulated)."""
        wanted = {key: v for key, v in self.wanted_senders().items() if key[0] == "b"}
        for key in list(self.senders):
            sender = self.senders[key]
            if wanted.get(key) != (sender.address, sender.broker_epoch):
                cast(SimSender, self.senders.pop(key)).stop()
        for key, (address, broker_epoch) in sorted(wanted.items()):
            if key not in self.senders:
                self.senders[key] = SimSender(self.node, key[1], address, broker_epoch)  # type: ignore[assignment]

    def enqueue(self, name: str, handler: Callable[[], ControllerResult]) -> None:
        """An event nobody waits for: it runs after the ones already queued (a timer at now)."""
        self.node.after(0, self.node.process_queued, self, name, handler)

    def idle(self) -> bool:
        """No control request queued or in flight."""
        return all(not sender.busy for sender in self.senders.values())  # type: ignore[attr-defined]

    def on_invariant_violation(self, exc: InvariantViolation, where: str) -> None:
        """Not a halt: turn() raises it out of the run."""

    def stop_senders(self) -> None:
        for sender in self.senders.values():
            cast(SimSender, sender).stop()
        self.senders.clear()

    def run_turn(self, name: str, handler: Callable[[], ControllerResult]) -> ControllerResult | Exception:
        """One turn of the real loop (turn(): its error handling included): the result or the error."""
        try:
            return run_sync(self.turn(name, handler))
        except InvariantViolation:
            raise
        except Exception as exc:
            self.node.trace("%s failed: %s", name, exc)
            return exc

    def watch_brokers(self, revision: int) -> None:
        """_watch(prefix=/brokers/ids) from after the revision the term started at."""
        self.broker_watch = self.node.etcd.subscribe(self.keys.brokers_prefix, start_revision=revision + 1)

    def drain_broker_watch(self) -> None:
        """_watch(): on any change under /brokers/ids, read the whole prefix; _membership_event queues it."""
        watch, client = self.broker_watch, self.node.client
        if watch is None or not client.reachable() or not watch.drain():
            return  # the watch stream is down; it catches up from its revision once etcd is back
        try:
            kvs, _ = run_sync(client.get_prefix(self.keys.brokers_prefix))
        except CoordinatorError:
            return
        self.node.trace("BrokerChange: %d registered", len(kvs))
        self._membership_event("BrokerChange", kvs)
