"""A broker in the simulation: the real broker core, driven by the simulated network and clock.

Every rule is the shipped one: SimBroker owns a services.broker.core.BrokerCore
(LeaderAndIsr, the purgatory, produce and fetch, ISR and checkpoint duties,
controlled shutdown) with its FetcherCores, on a MemoryStorage. What is here is
only the driver, the simulation's side of the core's seams:

- the clock is the event loop's (`_SimClock`); the core's log lines go to the trace;
- BrokerIO: a core task (a replica fetcher's loop, an AlterPartition with its
  retries, the controlled shutdown) is stepped by `_step`, which performs each step
  it yields as a simulated RPC (the in-memory LeaderEndpoint and controller client)
  or timer; `call_later` is a timer;
- requests arrive as Envelopes and are answered through the core's callbacks;
- process life: registration under a lease (coordinator/broker_life.py's rules and
  state table, driven by tests/sim/sim_registration.py), crash
  (kill -9, or a power loss that loses unflushed bytes and changes the boot id), restart,
  clean stop.

The checker watches through the core's observer (`_CheckerObserver`).

Test switch: with `Safety.leader_epoch_truncation` off, a truncating follower skips
OffsetsForLeaderEpoch and truncates to its own high watermark (Kafka before KIP-101).
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from clients.common.types import TopicPartitionKey
from coordinator import broker_life
from coordinator.election import current_controller
from coordinator.store import CoordinatorError
from services.broker.core import BrokerCore
from services.broker.fetcher_core import FetcherCore, FetcherSettings
from services.broker.log import MemoryStorage
from services.broker.partition import LeaderAppend, Partition
from services.broker.purgatory import AwaitedAppend
from services.broker.steps import (
    AwaitWork,
    CallController,
    CallLeader,
    RpcFailed,
    Sleep,
    Task,
    run_to_completion,
)
from tests.sim.clock import EventLoop
from tests.sim.config import WALL_CLOCK_BASE_MS, SimConfig
from tests.sim.network import Envelope, Network, RpcError, RpcNode
from tests.sim.sim_etcd import SimEtcd, SimLease, run_sync
from tests.sim.sim_registration import SimRegistration

if TYPE_CHECKING:
    from tests.sim.checker import Checker


# Bytes of log between offset-index entries in simulated logs (LogConfig's default is 4096):
# the same lookup logic, shorter header scans per read (our batches are ~100 bytes).
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


class _SimClock:
    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop

    def monotonic_ms(self) -> int:
        return self.loop.now_ms

    def wall_ms(self) -> int:
        return WALL_CLOCK_BASE_MS + self.loop.now_ms


class _TraceLog:
    """The core's log lines, into the simulation's trace (formatted only if a run fails)."""

    def __init__(self, broker: SimBroker) -> None:
        self.broker = broker

    def info(self, msg: str, *args: object) -> None:
        self.broker.trace(msg, *args)

    warning = info
    error = info


class _CheckerObserver:
    """The core's observer: hands the checker the moments it judges, and models a slow disk."""

    def __init__(self, broker: SimBroker) -> None:
        self.broker = broker
        self.checker = broker.checker

    def on_become_leader(self, p: Partition) -> None:
        self.checker.on_become_leader(self.broker, p)

    def on_leader_append(self, p: Partition, append: LeaderAppend, acks: int) -> object:
        self.broker.trace(
            "append %s-%d [%d, %d) epoch %d acks=%d%s",
            p.topic,
            p.partition,
            append.first_offset,
            append.next_offset,
            p.leader_epoch,
            acks,
            " (duplicate)" if append.duplicate else "",
        )
        if not append.duplicate:
            self.broker.disk_write()
        if acks != -1:
            return None
        return AppendRecord(
            (p.topic, p.partition),
            p.leader_epoch,
            append.first_offset,
            append.next_offset,
            self.checker.incarnations(),
            append.duplicate,
        )

    def on_acknowledged(self, p: Partition, append: AwaitedAppend) -> None:
        if isinstance(append.note, AppendRecord):
            self.checker.on_acks_all_success(self.broker, p, append.note)

    def on_follower_append(self, p: Partition) -> None:
        self.broker.disk_write()

    def before_truncation(self, tp: TopicPartitionKey, offset: int) -> None:
        self.checker.before_truncation(self.broker, tp, offset)

    def after_truncation(self, tp: TopicPartitionKey, leader_id: int, leader_epoch: int) -> None:
        self.checker.after_truncation(self.broker, tp, leader_id, leader_epoch)


def _answer(resp: Any) -> Any:
    return RpcFailed(str(resp)) if isinstance(resp, RpcError) else resp


class SimBroker(RpcNode):
    """One broker process; a crash starts a new incarnation on the same MemoryStorage."""

    def __init__(
        self,
        broker_id: int,
        loop: EventLoop,
        network: Network,
        etcd: SimEtcd,
        config: SimConfig,
        rng: random.Random,
        checker: Checker,
    ) -> None:
        super().__init__(broker_node(broker_id), loop, network)
        self.broker_id = broker_id
        self.config = config
        self.rng = rng
        self.checker = checker
        self.etcd = etcd
        self.etcd_client = etcd.client(self)
        self.storage = MemoryStorage()  # the disk: outlives every incarnation
        self.data_dir = PurePosixPath(f"/sim/{self.name}")
        # The host's boot id changes with every power loss (a reboot); a kill -9 keeps it.
        self.boots = 0
        self.fetcher_settings = FetcherSettings(
            fetch_wait_max_ms=config.replica_fetch_wait_max_ms,
            backoff_ms=config.replica_fetch_backoff_ms,
            rpc_timeout_ms=config.control_rpc_timeout_ms,
            truncate_by_leader_epoch=config.safety.leader_epoch_truncation,
        )
        # Fault knobs.
        self.disk_delay_ms = 0
        # What this broker's registrations went through (tests/sim/sim_registration.py).
        self.counts: Counter[str] = Counter()
        self._start_process()

    # ---- process lifecycle ---------------------------------------------------------------

    def _start_process(self) -> None:
        """What `highwater broker` does at start: a fresh core, timers, then registration."""
        # A new process listens on a new port: peers still dialling the old one are refused.
        self.port = 9092 + self.incarnation
        self.address = f"{self.name}:{self.port}"
        self.core = BrokerCore(
            broker_id=self.broker_id,
            data_dir=str(self.data_dir),
            storage=self.storage,
            clock=_SimClock(self.loop),
            io=self,
            log=_TraceLog(self),
            replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
            fetcher_settings=self.fetcher_settings,
            tune_log_config=lambda c: dataclasses.replace(c, index_interval_bytes=SIM_INDEX_INTERVAL_BYTES),
            observer=_CheckerObserver(self),
        )
        self.unclean_shutdown = self.core.start(boot_id=f"boot-{self.boots}").unclean_shutdown
        self.registration = SimRegistration(self, self.counts)
        # Fetchers waiting in AwaitWork: the task and the token of that wait.
        self._idle: dict[FetcherCore, tuple[Task[Any], int]] = {}
        self._idle_tokens = 0
        self.after(self.config.isr_check_interval_ms, self._isr_and_checkpoint_tick)
        self.registration.start()

    @property
    def partitions(self) -> dict[TopicPartitionKey, Partition]:
        return self.core.partitions

    @property
    def broker_epoch(self) -> int:
        return self.core.broker_epoch

    def crash_process(self, *, power_loss: bool) -> None:
        """kill -9 (files keep what was written) or a power cut (unflushed bytes are lost,
        the host reboots).
        """
        self.core.crash()
        if power_loss:
            self.storage.crash(self.rng)
            self.boots += 1
        self.trace("CRASH%s", " (power loss)" if power_loss else "")
        self.crash()

    def restart_process(self) -> None:
        self.restart()
        self.trace("restart")
        self._start_process()

    # ---- registration: tests/sim/sim_registration.py drives coordinator/broker_life.py ----------

    @property
    def life(self) -> broker_life.BrokerLife:
        return self.registration.life

    @property
    def lease(self) -> SimLease | None:
        return self.registration.lease

    @property
    def shutting_down(self) -> bool:
        return self.registration.life.stopping

    def _isr_and_checkpoint_tick(self) -> None:
        run_to_completion(self.core.periodic_duties())
        self.after(self.config.isr_check_interval_ms, self._isr_and_checkpoint_tick)

    def disk_write(self) -> None:
        """Slow-disk fault: a write blocks the broker's event loop for disk_delay_ms."""
        if self.disk_delay_ms:
            token = self.pause()
            self.loop.call_at(self.loop.now_ms + self.disk_delay_ms, self.resume, token)

    # ---- BrokerIO: the core's tasks and timers ----------------------------------------------

    def start_fetcher(self, fetcher: FetcherCore) -> None:
        fetcher.wake = lambda: self._wake(fetcher)
        self.after(0, self._step, fetcher.run(), None, fetcher)

    def stop_fetcher(self, fetcher: FetcherCore) -> None:
        self._idle.pop(fetcher, None)  # its task is dropped at its next step (fetcher.stopped)

    def spawn(self, name: str, task: Task[Any]) -> None:
        self._step(task, None)

    def call_later(self, delay_ms: int, fn: Callable[[], None]) -> Callable[[], None]:
        self.after(delay_ms, fn)
        # The simulated clock keeps its timers; one that fires for a completed operation does
        # nothing, and memory is not what the simulation checks.
        return lambda: None

    def _wake(self, fetcher: FetcherCore) -> None:
        idle = self._idle.pop(fetcher, None)
        if idle is not None:
            self.after(0, self._step, idle[0], None, fetcher)

    def _idle_timeout(self, fetcher: FetcherCore, token: int) -> None:
        idle = self._idle.get(fetcher)
        if idle is not None and idle[1] == token:
            del self._idle[fetcher]
            self._step(idle[0], None, fetcher)

    def _step(
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
            self.after(step.ms, self._step, task, None, fetcher, on_done)
        elif isinstance(step, AwaitWork):
            if fetcher is None:
                raise ValueError(f"{self.name}: AwaitWork from a task that is not a fetcher")
            self._idle_tokens += 1
            self._idle[fetcher] = (task, self._idle_tokens)
            self.after(step.timeout_ms, self._idle_timeout, fetcher, self._idle_tokens)
        elif isinstance(step, CallLeader):
            if fetcher is None:
                raise ValueError(f"{self.name}: {step.rpc} from a task that is not a fetcher")
            self.call(
                broker_node(fetcher.leader_id),
                step.rpc,
                step.request,
                step.timeout_ms,
                lambda resp: self._step(task, _answer(resp), fetcher, on_done),
                address=fetcher.leader_address,
            )
        elif isinstance(step, CallController):
            address = self._controller_address()
            if address is None:
                self._step(task, RpcFailed("no active controller registered in etcd"), fetcher, on_done)
                return
            self.call(
                address,
                step.rpc,
                step.request,
                step.timeout_ms,
                lambda resp: self._step(task, _answer(resp), fetcher, on_done),
            )
        else:
            raise ValueError(f"{self.name}: unknown task step {step!r}")

    def _controller_address(self) -> str | None:
        """ControllerClient._address: the active controller as etcd names it."""
        try:
            info = run_sync(current_controller(self.etcd_client))
        except CoordinatorError:
            return None
        return controller_node(int(info["controller_id"])) if info else None

    # ---- requests --------------------------------------------------------------------------

    def on_request(self, env: Envelope) -> None:
        rpc, core = env.rpc, self.core
        if rpc == "Fetch":
            core.fetch(env.body, lambda resp: self.reply(env, resp))
        elif rpc == "Produce":
            core.produce(env.body, lambda resp: self.reply(env, resp))
        elif rpc == "OffsetsForLeaderEpoch":
            self.reply(env, core.offsets_for_leader_epoch(env.body))
        elif rpc == "LeaderAndIsr":
            self.reply(env, run_to_completion(core.leader_and_isr(env.body)))
        elif rpc == "UpdateMetadata":
            self.reply(env, core.update_metadata(env.body))
        elif rpc == "StopReplica":
            self.reply(env, core.stop_replica(env.body))
        elif rpc == "Metadata":
            self.reply(env, core.metadata.metadata_response(list(env.body.topics)))
        else:
            raise ValueError(f"{self.name}: unknown rpc {rpc}")

    # ---- controlled shutdown (services/broker/server.py on_stop) -------------------------

    def controlled_shutdown(self, then: Callable[[], None]) -> None:
        """Ask the controller to move leaderships away, then stop cleanly and call then()."""
        self.registration.shutting_down()
        self.trace("controlled shutdown requested")
        self._step(self.core.controlled_shutdown(), None, None, lambda _moved: self._stop_cleanly(then))

    def _stop_cleanly(self, then: Callable[[], None]) -> None:
        """ReplicaManager.close + revoking the lease: checkpoints, clean-shutdown markers, key deleted."""
        self.core.close()
        self.registration.stopped()
        self.trace("stopped cleanly")
        self.crash()  # the process is gone; the disk keeps everything (close flushed it)
        then()

    # ---- for the checker --------------------------------------------------------------------

    def describe(self) -> str:
        parts = []
        for (topic, partition), p in sorted(self.partitions.items()):
            parts.append(
                f"{topic}-{partition}:{p.role.value[0].upper()}e{p.leader_epoch} leo{p.log.log_end_offset} "
                f"hw{p.high_watermark} isr{list(p.isr)}"
            )
        return f"{self.name} {'up' if self.up else 'down'} be{self.broker_epoch} " + "; ".join(parts)
