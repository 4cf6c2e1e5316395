"""The asyncio driver of the broker core: gRPC calls in, core calls, tasks and timers out.

The rules are in services/broker/core.py (every replica, the purgatory, control
requests), fetcher_core.py (the replica fetcher) and partition.py; this module
gives them a clock, files, an event loop and the network. It runs on the broker's
single asyncio event loop: that loop is the one owner of the core, so no locks.

What it adds is only I/O: a waiting produce, fetch or DeleteRecords is a future that the core's
purgatory completes; a core task (AlterPartition, controlled shutdown, a replica
fetcher's loop) is run by `fetcher.drive`; calls that yield between slices are run
with a pause (`asyncio.sleep(0)`) at each yield so the lease keep-alive and other
requests get the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, TypeVar

from clients.common.errors import InvariantViolation, StorageError
from clients.common.transport.host import host_id
from clients.common.types import TopicPartitionKey
from protos.highwater.v1 import broker_pb2, common_pb2
from services.broker import metrics
from services.broker.core import BrokerCore
from services.broker.fetcher import ControllerCall, GrpcLeaderEndpoint, drive, run_replica_fetcher
from services.broker.fetcher_core import FetcherCore
from services.broker.log.file_storage import FileStorage, open_real_file_count
from services.broker.log_cleaner import CleanerConfig, LogCleaner
from services.broker.partition import Partition
from services.broker.steps import Task
from services.common import limits
from services.common.metadata_cache import MetadataCache
from services.common.server import halt_on_invariant_violation

log = logging.getLogger("highwater.replica_manager")

R = TypeVar("R")


class SystemClock:
    """The broker's clocks: monotonic for timeouts and lag, wall for record and segment times."""

    def monotonic_ms(self) -> int:
        return int(time.monotonic() * 1000)

    def wall_ms(self) -> int:
        return int(time.time() * 1000)


async def run_in_slices(slices: Generator[None, None, R]) -> R:
    """Run a sliced core call, letting the event loop run other work at each yield."""
    while True:
        try:
            next(slices)
        except StopIteration as done:
            result: R = done.value  # StopIteration.value is Any; the generator's type says R
            return result
        await asyncio.sleep(0)


def _resolve(fut: asyncio.Future[Any]) -> Callable[[Any], None]:
    def set_result(result: Any) -> None:
        if not fut.done():  # the caller may have gone (cancelled) meanwhile
            fut.set_result(result)

    return set_result


class ReplicaManager:
    """The broker core on asyncio (BrokerIO for the core)."""

    def __init__(
        self,
        *,
        broker_id: int,
        data_dir: Path,
        call_controller: ControllerCall,
        replica_lag_time_max_ms: int = limits.REPLICA_LAG_TIME_MAX_MS,
        log_cache_window_bytes: int = limits.LOG_CACHE_WINDOW_BYTES_DEFAULT,
        fetch_max_bytes: int = limits.FETCH_RESPONSE_MAX_BYTES_DEFAULT,
        cleaner_config: CleanerConfig | None = None,
    ) -> None:
        self.call_controller = call_controller
        metrics.OPEN_SEGMENT_FILES.set_function(open_real_file_count)
        self.core = BrokerCore(
            broker_id=broker_id,
            data_dir=str(data_dir),
            storage=FileStorage(cache_window_bytes=log_cache_window_bytes),
            clock=SystemClock(),
            io=self,
            log=logging.getLogger("highwater.broker.core"),
            replica_lag_time_max_ms=replica_lag_time_max_ms,
            fetch_max_bytes=fetch_max_bytes,
        )
        # Every fetcher task ever started and not yet finished (replaced ones included).
        self._fetcher_tasks: dict[FetcherCore, asyncio.Task[None]] = {}
        self._wakeups: dict[FetcherCore, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        # Work run on threads (run_blocking) and not finished yet.
        self._blocking: set[asyncio.Future[None]] = set()
        # The log cleaner of compacted logs: every replica here, leader or follower, cleans its own copy.
        cleaner_config = cleaner_config or CleanerConfig()
        self.cleaner = (
            LogCleaner(cleaner_config, lambda: self.core.partitions, clock=self.core.clock)
            if cleaner_config.enable
            else None
        )

    @property
    def broker_epoch(self) -> int:
        return self.core.broker_epoch

    @broker_epoch.setter
    def broker_epoch(self, epoch: int) -> None:
        self.core.broker_epoch = epoch

    @property
    def metadata(self) -> MetadataCache:
        return self.core.metadata

    @property
    def partitions(self) -> dict[TopicPartitionKey, Partition]:
        return self.core.partitions

    # ---- BrokerIO ----------------------------------------------------------------------------

    def start_fetcher(self, fetcher: FetcherCore) -> None:
        wakeup = asyncio.Event()
        fetcher.wake = wakeup.set
        task = asyncio.create_task(
            run_replica_fetcher(fetcher, GrpcLeaderEndpoint(fetcher.leader_address), wakeup),
            name=f"replica-fetcher-{fetcher.leader_id}",
        )
        self._fetcher_tasks[fetcher] = task
        task.add_done_callback(lambda _: self._fetcher_tasks.pop(fetcher, None))

    def stop_fetcher(self, fetcher: FetcherCore) -> None:
        task = self._fetcher_tasks.get(fetcher)
        if task is not None:
            task.cancel()

    def spawn(self, name: str, task: Task[Any]) -> None:
        self._start(self._guarded(drive(task, controller=self.call_controller), name), name)

    def call_later(self, delay_ms: int, fn: Callable[[], None]) -> Callable[[], None]:
        return asyncio.get_running_loop().call_later(delay_ms / 1000, fn).cancel

    def run_blocking(
        self, name: str, fn: Callable[[], None], then: Callable[[BaseException | None], None]
    ) -> None:
        # A thread of the default executor; never cancelled (a thread cannot be), and close()
        # waits for it before the core writes the same files.
        future = asyncio.get_running_loop().run_in_executor(None, fn)
        self._blocking.add(future)

        def done(f: asyncio.Future[None]) -> None:
            self._blocking.discard(f)
            try:
                then(None if f.cancelled() else f.exception())
            except InvariantViolation as exc:
                halt_on_invariant_violation(exc, name)
            except Exception:
                log.exception("%s failed", name)

        future.add_done_callback(done)

    def _start(self, coro: Any, name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, coro: Any, where: str) -> None:
        try:
            await coro
        except InvariantViolation as exc:
            halt_on_invariant_violation(exc, where)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed", where)

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> bool:
        """Start the periodic duties; returns whether the previous run may have lost unflushed writes."""
        previous = self.core.start(host_id())  # a changed boot id: the host rebooted
        self._start(self._periodic_duties(), "isr-checker")
        if self.cleaner is not None:
            self.cleaner.start()
        return previous.unclean_shutdown

    async def _periodic_duties(self) -> None:
        """Kafka's scheduler: ISR shrink, HW checkpoints, retention, every ISR_CHECK_INTERVAL_MS."""
        while not self.core.closing:
            await asyncio.sleep(limits.ISR_CHECK_INTERVAL_MS / 1000)
            try:
                await run_in_slices(self.core.periodic_duties())
            except InvariantViolation as exc:
                halt_on_invariant_violation(exc, "the periodic ISR/checkpoint pass")
            except Exception:
                log.exception("the periodic ISR/checkpoint pass failed")
            await run_in_slices(self.core.update_gauges())

    async def controlled_shutdown(self) -> bool:
        # The file system writes back its dirty pages (the logs' latest appends, mostly) while the
        # controller moves the leaderships: the close's first sync then finds little left to write.
        # Nothing depends on this sync: the close makes its own, in order.
        asyncio.get_running_loop().run_in_executor(None, self._write_back_early)
        return await drive(self.core.controlled_shutdown(), controller=self.call_controller)

    def _write_back_early(self) -> None:
        started = time.monotonic()
        try:
            self.core.storage.sync_all(self.core.data_dir)
        except StorageError as exc:
            log.info("early write-back before the close failed (the close syncs again): %s", exc)
            return
        log.info("early write-back before the close took %.3f s", time.monotonic() - started)

    async def close(self) -> None:
        """Stop taking control requests, answer what waits, stop every fetcher and task, close the logs.

        Control requests are refused from the first line on, so no LeaderAndIsr can start
        a fetcher or open a log while this awaits.
        """
        self.core.begin_close()
        if self.cleaner is not None:
            # First, so no cleaning pass swaps a segment in while the logs close (it stops at its
            # next batch and discards its cleaned file).
            await self.cleaner.stop()
        if self._blocking:
            # A checkpoint being written on a thread: the close writes the same file next.
            await asyncio.wait(set(self._blocking), timeout=limits.BROKER_CLOSE_TASKS_TIMEOUT_S)
        pending = [*self._fetcher_tasks.values(), *self._tasks]
        for task in pending:
            task.cancel()
        if pending:
            _, still = await asyncio.wait(pending, timeout=limits.BROKER_CLOSE_TASKS_TIMEOUT_S)
            if still:
                log.warning(
                    "%d broker tasks did not stop within %.0f s",
                    len(still),
                    limits.BROKER_CLOSE_TASKS_TIMEOUT_S,
                )
        started = time.monotonic()
        phases: list[str] = []
        last = started

        def on_phase(phase: str) -> None:
            nonlocal last
            now = time.monotonic()
            phases.append(f"{phase} {now - last:.3f}")
            last = now

        self.core.close(on_phase)
        # bench/failover.py and tests/integration/test_broker_shutdown.py read this line.
        log.info(
            "closed %d logs in %.3f s (%s)",
            len(self.core.partitions),
            time.monotonic() - started,
            ", ".join(phases) or "nothing to close",
        )

    # ---- requests ------------------------------------------------------------------------------

    async def leader_and_isr(self, req: broker_pb2.LeaderAndIsrRequest) -> broker_pb2.LeaderAndIsrResponse:
        resp = await run_in_slices(self.core.leader_and_isr(req))
        # The other gauges wait for the periodic pass (within a second): they walk every replica,
        # 30-60 ms at 10,000 (a stall of every request after each LeaderAndIsr, loop_stalls found).
        metrics.PARTITION_COUNT.set(len(self.core.partitions))
        return resp

    async def update_metadata(
        self, req: broker_pb2.UpdateMetadataRequest
    ) -> broker_pb2.UpdateMetadataResponse:
        return self.core.update_metadata(req)

    async def stop_replica(self, req: broker_pb2.StopReplicaRequest) -> broker_pb2.StopReplicaResponse:
        resp = self.core.stop_replica(req)
        await run_in_slices(self.core.update_gauges())
        return resp

    async def produce(
        self, req: common_pb2.ProduceRequest, *, transactional: bool = False
    ) -> common_pb2.ProduceResponse:
        fut: asyncio.Future[common_pb2.ProduceResponse] = asyncio.get_running_loop().create_future()
        self.core.produce(req, _resolve(fut), transactional=transactional)
        return await fut

    async def fetch(self, req: common_pb2.FetchRequest) -> common_pb2.FetchResponse:
        fut: asyncio.Future[common_pb2.FetchResponse] = asyncio.get_running_loop().create_future()
        self.core.fetch(req, _resolve(fut))
        return await fut

    def list_offsets(self, req: common_pb2.ListOffsetsRequest) -> common_pb2.ListOffsetsResponse:
        return self.core.list_offsets(req)

    async def delete_records(self, req: common_pb2.DeleteRecordsRequest) -> common_pb2.DeleteRecordsResponse:
        """Answered when the ISR has the new log start offsets, or at the request's timeout."""
        fut: asyncio.Future[common_pb2.DeleteRecordsResponse] = asyncio.get_running_loop().create_future()
        self.core.delete_records(req, _resolve(fut))
        return await fut

    async def write_txn_markers(
        self, req: broker_pb2.WriteTxnMarkersRequest
    ) -> broker_pb2.WriteTxnMarkersResponse:
        """Answered when the ISR has every marker, or at the request's timeout."""
        fut: asyncio.Future[broker_pb2.WriteTxnMarkersResponse] = asyncio.get_running_loop().create_future()
        self.core.write_txn_markers(req, _resolve(fut))
        return await fut

    def offsets_for_leader_epoch(
        self, req: broker_pb2.OffsetsForLeaderEpochRequest
    ) -> broker_pb2.OffsetsForLeaderEpochResponse:
        return self.core.offsets_for_leader_epoch(req)
