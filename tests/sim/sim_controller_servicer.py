"""The controller's servicer in the simulation: ControllerServicer's answers on the simulated network.

NOT_CONTROLLER while standing by or resigned, else the handler's answer after its turn
of the real event loop (`SimController._process`, which runs ControllerEventLoop.turn);
admin calls wait (bounded) for the RPCs they send, DeleteTopics for every replica.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from clients.common.errors import HighwaterError, InvariantViolation
from protos.highwater.v1 import common_pb2, controller_pb2
from services.common.limits import ADMIN_PROPAGATION_WAIT_S
from services.controller import deletion, handlers, reassignment
from services.controller.context import ControllerContext
from services.controller.event_loop import ControllerResigned
from services.controller.results import ControllerResult
from tests.sim.network import Envelope, RpcError, RpcNode
from tests.sim.sim_controller_loop import SimFuture
from tests.sim.sim_etcd import run_sync

if TYPE_CHECKING:
    from tests.sim.sim_controller_loop import SimControllerLoop

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


class SimControllerServicer(RpcNode):
    """The RPC side of SimController (which sets `active` and runs `_process`)."""

    active: SimControllerLoop | None

    def _process(self, name: str, handler: Callable[[], ControllerResult]) -> ControllerResult | Exception:
        raise NotImplementedError

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
        decide: Callable[[ControllerContext], ControllerResult],
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
        if isinstance(outcome, ControllerResigned):
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
        if isinstance(outcome, ControllerResigned):
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
