"""The simulated broker's side of the broker core's seams: its clock, its log, the observer the
checker watches through, and the names of the simulation's nodes. tests/sim/sim_broker.py's
SimBroker, the driver, plugs these into the real BrokerCore."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clients.common.types import TopicPartitionKey
from services.broker.partition import LeaderAppend, Partition
from services.broker.purgatory import AwaitedAppend
from services.broker.steps import RpcFailed
from tests.sim.clock import EventLoop
from tests.sim.config import WALL_CLOCK_BASE_MS
from tests.sim.network import RpcError

if TYPE_CHECKING:
    from tests.sim.sim_broker import SimBroker


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


class SimClock:
    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop

    def monotonic_ms(self) -> int:
        return self.loop.now_ms

    def wall_ms(self) -> int:
        return WALL_CLOCK_BASE_MS + self.loop.now_ms


class TraceLog:
    """The core's log lines, into the simulation's trace (formatted only if a run fails)."""

    def __init__(self, broker: SimBroker) -> None:
        self.broker = broker

    def info(self, msg: str, *args: object) -> None:
        self.broker.trace(msg, *args)

    warning = info
    error = info


class CheckerObserver:
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


def rpc_answer(resp: Any) -> Any:
    return RpcFailed(str(resp)) if isinstance(resp, RpcError) else resp
