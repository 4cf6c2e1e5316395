"""A broker in the simulation: the real broker core, driven by the simulated network and clock.

Every rule is the shipped one: SimBroker owns a services.broker.core.BrokerCore
(LeaderAndIsr, the purgatory, produce and fetch, ISR and checkpoint duties,
controlled shutdown) with its FetcherCores, on a MemoryStorage. What is here is
only the driver, the simulation's side of the core's seams:

- the clock is the event loop's (`SimClock`); the core's log lines go to the trace;
- BrokerIO (tests/sim/sim_broker_io.py): a core task (a replica fetcher's loop, an
  AlterPartition with its retries, the controlled shutdown) is stepped by `SimBrokerIO.step`,
  which performs each step it yields as a simulated RPC or timer;
- requests arrive as Envelopes and are answered through the core's callbacks;
- process life: registration under a lease (coordinator/broker_life.py's rules and
  state table, driven by tests/sim/sim_registration.py), crash
  (kill -9, or a power loss that loses unflushed bytes and changes the boot id), restart,
  clean stop.

The checker watches through the core's observer (`CheckerObserver`).

Test switch: with `Safety.leader_epoch_truncation` off, a truncating follower skips
OffsetsForLeaderEpoch and truncates to its own high watermark (Kafka before KIP-101).
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from clients.common.types import TopicPartitionKey
from coordinator import broker_life
from services.broker.core import BrokerCore
from services.broker.fetcher_core import FetcherSettings
from services.broker.log import MemoryStorage
from services.broker.partition import Partition
from services.broker.steps import (
    run_to_completion,
)
from tests.sim.clock import EventLoop
from tests.sim.config import SimConfig
from tests.sim.network import Envelope, Network, RpcNode
from tests.sim.sim_broker_io import SimBrokerIO
from tests.sim.sim_broker_seams import (
    CheckerObserver,
    SimClock,
    TraceLog,
    broker_node,
)
from tests.sim.sim_etcd import SimEtcd, SimLease
from tests.sim.sim_registration import SimRegistration
from tests.sim.txn_broker import produce_transactional

if TYPE_CHECKING:
    from tests.sim.checker import Checker


# Bytes of log between offset-index entries in simulated logs (LogConfig's default is 4096):
# the same lookup logic, shorter header scans per read (our batches are ~100 bytes).
SIM_INDEX_INTERVAL_BYTES = 512


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
        self.io = SimBrokerIO(self)
        self.core = BrokerCore(
            broker_id=self.broker_id,
            data_dir=str(self.data_dir),
            storage=self.storage,
            clock=SimClock(self.loop),
            io=self.io,
            log=TraceLog(self),
            replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
            fetcher_settings=self.fetcher_settings,
            tune_log_config=lambda c: dataclasses.replace(c, index_interval_bytes=SIM_INDEX_INTERVAL_BYTES),
            observer=CheckerObserver(self),
        )
        self.unclean_shutdown = self.core.start(boot_id=f"boot-{self.boots}").unclean_shutdown
        self.registration = SimRegistration(self, self.counts)
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
        elif rpc == "ProduceTxn":  # transactional Produce (tests/sim/txn_broker.py)
            produce_transactional(self, env)
        elif rpc == "WriteTxnMarkers":
            core.write_txn_markers(env.body, lambda resp: self.reply(env, resp))
        else:
            raise ValueError(f"{self.name}: unknown rpc {rpc}")

    # ---- controlled shutdown (services/broker/server.py on_stop) -------------------------

    def controlled_shutdown(self, then: Callable[[], None]) -> None:
        """Ask the controller to move leaderships away, then stop cleanly and call then()."""
        self.registration.shutting_down()
        self.trace("controlled shutdown requested")
        self.io.step(self.core.controlled_shutdown(), None, None, lambda _moved: self._stop_cleanly(then))

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
