"""The simulated broker's BrokerIO: the broker core's tasks (replica fetchers, AlterPartition
with its retries, the controlled shutdown) stepped on the simulation's event loop, each step a
simulated RPC or timer, as services/broker/replica_manager.py's `drive()` performs them over gRPC
and asyncio."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from coordinator.election import current_controller
from coordinator.store import CoordinatorError
from services.broker.fetcher_core import FetcherCore
from services.broker.steps import AwaitWork, CallController, CallLeader, RpcFailed, Sleep, Task, run_at_once
from tests.sim.sim_broker_seams import broker_node, controller_node, rpc_answer
from tests.sim.sim_etcd import run_sync

if TYPE_CHECKING:
    from tests.sim.sim_broker import SimBroker


class SimBrokerIO:
    """One incarnation's BrokerIO (a restarted process gets a new one: no task outlives it)."""

    def __init__(self, broker: SimBroker) -> None:
        self.broker = broker
        # Fetchers waiting in AwaitWork: the task and the token of that wait.
        self._idle: dict[FetcherCore, tuple[Task[Any], int]] = {}
        self._idle_tokens = 0

    def start_fetcher(self, fetcher: FetcherCore) -> None:
        fetcher.wake = lambda: self._wake(fetcher)
        self.broker.after(0, self.step, fetcher.run(), None, fetcher)

    def stop_fetcher(self, fetcher: FetcherCore) -> None:
        self._idle.pop(fetcher, None)  # its task is dropped at its next step (fetcher.stopped)

    def spawn(self, name: str, task: Task[Any]) -> None:
        self.step(task, None)

    def run_blocking(
        self, name: str, fn: Callable[[], None], then: Callable[[BaseException | None], None]
    ) -> None:
        run_at_once(fn, then)

    def call_later(self, delay_ms: int, fn: Callable[[], None]) -> Callable[[], None]:
        self.broker.after(delay_ms, fn)
        # The simulated clock keeps its timers; one that fires for a completed operation does
        # nothing, and memory is not what the simulation checks.
        return lambda: None

    def _wake(self, fetcher: FetcherCore) -> None:
        idle = self._idle.pop(fetcher, None)
        if idle is not None:
            self.broker.after(0, self.step, idle[0], None, fetcher)

    def _idle_timeout(self, fetcher: FetcherCore, token: int) -> None:
        idle = self._idle.get(fetcher)
        if idle is not None and idle[1] == token:
            del self._idle[fetcher]
            self.step(idle[0], None, fetcher)

    def step(
        self,
        task: Task[Any],
        answer: Any,
        fetcher: FetcherCore | None = None,
        on_done: Callable[[Any], None] | None = None,
    ) -> None:
        """Resume a core task with an answer and perform the step it yields next."""
        if fetcher is not None and fetcher.stopped:
            return  # ReplicaFetcher.stop: the task is cancelled; an answer in flight is ignored
        try:
            step = task.send(answer)
        except StopIteration as done:
            if on_done is not None:
                on_done(done.value)
            return
        if isinstance(step, Sleep):
            self.broker.after(step.ms, self.step, task, None, fetcher, on_done)
        elif isinstance(step, AwaitWork):
            if fetcher is None:
                raise ValueError(f"{self.broker.name}: AwaitWork from a task that is not a fetcher")
            self._idle_tokens += 1
            self._idle[fetcher] = (task, self._idle_tokens)
            self.broker.after(step.timeout_ms, self._idle_timeout, fetcher, self._idle_tokens)
        elif isinstance(step, CallLeader):
            if fetcher is None:
                raise ValueError(f"{self.broker.name}: {step.rpc} from a task that is not a fetcher")
            self.broker.call(
                broker_node(fetcher.leader_id),
                step.rpc,
                step.request,
                step.timeout_ms,
                lambda resp: self.step(task, rpc_answer(resp), fetcher, on_done),
                address=fetcher.leader_address,
            )
        elif isinstance(step, CallController):
            address = self._controller_address()
            if address is None:
                self.step(task, RpcFailed("no active controller registered in etcd"), fetcher, on_done)
                return
            self.broker.call(
                address,
                step.rpc,
                step.request,
                step.timeout_ms,
                lambda resp: self.step(task, rpc_answer(resp), fetcher, on_done),
            )
        else:
            raise ValueError(f"{self.broker.name}: unknown task step {step!r}")

    def _controller_address(self) -> str | None:
        """ControllerClient._address: the active controller as etcd names it."""
        try:
            info = run_sync(current_controller(self.broker.etcd_client))
        except CoordinatorError:
            return None
        return controller_node(int(info["controller_id"])) if info else None
