"""The broker core's seams for unit tests: a clock the test moves, an IO that records, log lines kept.

Nothing here decides anything: the tests drive the shipped BrokerCore and FetcherCore
(services/broker/core.py, fetcher_core.py), and a follower's fetches are answered by
another BrokerCore playing the leader, as in a cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protos.highwater.v1 import broker_pb2, common_pb2
from services.broker.core import BrokerCore
from services.broker.fetcher_core import FetcherCore, FetcherSettings
from services.broker.log import MemoryStorage, Storage
from services.broker.steps import Task, run_at_once, run_to_completion

WALL_CLOCK_BASE_MS = 1_700_000_000_000
CONTROLLER_EPOCH = 1
# Fetches answer at once in these tests: nothing waits on a clock that only the test moves.
NO_WAIT_FETCHER = FetcherSettings(fetch_wait_max_ms=0)


class ManualClock:
    def __init__(self) -> None:
        self.now_ms = 0

    def monotonic_ms(self) -> int:
        return self.now_ms

    def wall_ms(self) -> int:
        return WALL_CLOCK_BASE_MS + self.now_ms


class Lines:
    """The core's log lines, kept for assertions."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def _add(self, level: str, msg: str, *args: object) -> None:
        self.lines.append((level, msg % args if args else msg))

    def info(self, msg: str, *args: object) -> None:
        self._add("info", msg, *args)

    def warning(self, msg: str, *args: object) -> None:
        self._add("warning", msg, *args)

    def error(self, msg: str, *args: object) -> None:
        self._add("error", msg, *args)

    def text(self, level: str | None = None) -> str:
        return "\n".join(line for lvl, line in self.lines if level is None or lvl == level)


class RecordingIO:
    """BrokerIO that records what the core asks for; timers fire when the test calls fire_due."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.started: list[FetcherCore] = []
        self.stopped: list[FetcherCore] = []
        self.spawned: list[tuple[str, Task[Any]]] = []
        self.timers: list[tuple[int, Callable[[], None]]] = []

    def start_fetcher(self, fetcher: FetcherCore) -> None:
        self.started.append(fetcher)

    def stop_fetcher(self, fetcher: FetcherCore) -> None:
        self.stopped.append(fetcher)

    def spawn(self, name: str, task: Task[Any]) -> None:
        self.spawned.append((name, task))

    def run_blocking(
        self, name: str, fn: Callable[[], None], then: Callable[[BaseException | None], None]
    ) -> None:
        run_at_once(fn, then)

    def call_later(self, delay_ms: int, fn: Callable[[], None]) -> Callable[[], None]:
        timer = (self.clock.now_ms + delay_ms, fn)
        self.timers.append(timer)
        return lambda: self.timers.remove(timer) if timer in self.timers else None

    def fire_due(self) -> None:
        due = [t for t in self.timers if t[0] <= self.clock.now_ms]
        self.timers = [t for t in self.timers if t[0] > self.clock.now_ms]
        for _, fn in due:
            fn()


class Broker:
    """One BrokerCore with its seams; `storage` survives a restart (a new Broker on the same storage)."""

    def __init__(
        self,
        broker_id: int,
        *,
        storage: Storage | None = None,
        clock: ManualClock | None = None,
        fetcher_settings: FetcherSettings = NO_WAIT_FETCHER,
        data_dir: str | None = None,
    ) -> None:
        self.broker_id = broker_id
        self.storage = storage or MemoryStorage()
        self.clock = clock or ManualClock()
        self.io = RecordingIO(self.clock)
        self.lines = Lines()
        self.core = BrokerCore(
            broker_id=broker_id,
            data_dir=data_dir or f"/data/b{broker_id}",
            storage=self.storage,
            clock=self.clock,
            io=self.io,
            log=self.lines,
            fetcher_settings=fetcher_settings,
        )

    def register(self, broker_epoch: int, boot_id: str = "boot-1") -> None:
        self.core.start(boot_id)
        self.core.broker_epoch = broker_epoch

    @property
    def node(self) -> common_pb2.BrokerNode:
        return common_pb2.BrokerNode(
            broker_id=self.broker_id,
            host="127.0.0.1",
            port=9000 + self.broker_id,
            broker_epoch=self.core.broker_epoch,
        )

    def header(
        self, broker_epoch: int | None = None, controller_epoch: int = CONTROLLER_EPOCH
    ) -> common_pb2.ControllerHeader:
        return common_pb2.ControllerHeader(
            controller_id=1,
            controller_epoch=controller_epoch,
            broker_epoch=self.core.broker_epoch if broker_epoch is None else broker_epoch,
        )

    def leader_and_isr(
        self,
        *,
        leader: int,
        leader_epoch: int,
        isr: tuple[int, ...],
        replicas: tuple[int, ...],
        live: list[common_pb2.BrokerNode],
        topic: str = "t",
        partition: int = 0,
        partition_epoch: int = 1,
        topic_id: str = "",
        min_isr: int = 1,
        header: common_pb2.ControllerHeader | None = None,
    ) -> broker_pb2.LeaderAndIsrResponse:
        state = common_pb2.PartitionState(
            topic=topic,
            partition=partition,
            leader=leader,
            leader_epoch=leader_epoch,
            isr=list(isr),
            replicas=list(replicas),
            controller_epoch=CONTROLLER_EPOCH,
            partition_epoch=partition_epoch,
            topic_id=topic_id,
        )
        req = broker_pb2.LeaderAndIsrRequest(
            header=header or self.header(),
            partitions=[
                broker_pb2.LeaderAndIsrPartition(
                    state=state, config=common_pb2.TopicConfig(min_insync_replicas=min_isr)
                )
            ],
            live_leaders=[n for n in live if n.broker_id == leader],
        )
        return run_slices(self.core.leader_and_isr(req))

    def produce(
        self,
        records: bytes,
        *,
        acks: int = -1,
        topic: str = "t",
        partition: int = 0,
        timeout_ms: int = 30_000,
    ) -> list[common_pb2.ProduceResponse]:
        """Produce; the list receives the answer when the core gives it (at once, or later)."""
        answers: list[common_pb2.ProduceResponse] = []
        req = common_pb2.ProduceRequest(
            acks=acks,
            timeout_ms=timeout_ms,
            topics=[
                common_pb2.ProduceTopicData(
                    topic=topic,
                    partitions=[common_pb2.ProducePartitionData(partition=partition, records=records)],
                )
            ],
        )
        self.core.produce(req, answers.append)
        return answers

    def fetch_now(self, req: common_pb2.FetchRequest) -> common_pb2.FetchResponse:
        """A fetch that must be answered at once (max_wait_ms 0, or data or an error is there)."""
        answers: list[common_pb2.FetchResponse] = []
        self.core.fetch(req, answers.append)
        assert len(answers) == 1, "the fetch waits in the purgatory"
        return answers[0]


def run_slices(slices: Any) -> Any:
    return run_to_completion(slices)


def partition_error(response: common_pb2.ProduceResponse | common_pb2.FetchResponse) -> int:
    (topic,) = response.topics
    (part,) = topic.partitions
    return int(part.error_code)


def lone_leader(
    storage: Storage | None = None,
    *,
    broker_epoch: int = 10,
    boot_id: str = "boot-1",
    topic_id: str = "",
    leader_epoch: int = 0,
    partition_epoch: int = 1,
    data_dir: str | None = None,
) -> Broker:
    """Broker 1, registered, leading t-0 with no other replica."""
    b = Broker(1, storage=storage, data_dir=data_dir)
    b.register(broker_epoch, boot_id=boot_id)
    b.leader_and_isr(
        leader=1,
        leader_epoch=leader_epoch,
        isr=(1,),
        replicas=(1,),
        live=[b.node],
        topic_id=topic_id,
        partition_epoch=partition_epoch,
    )
    return b
