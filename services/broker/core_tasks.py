"""The broker core's tasks that call the controller: AlterPartition with its retries (and the
followers' fetches that lead to it), and the controlled shutdown (steps.py: a task yields steps
its driver performs)."""

from __future__ import annotations

from protos.highwater.v1 import common_pb2, controller_pb2
from services.broker import metrics
from services.broker.core_state import CoreState
from services.broker.partition import IsrChange, Partition, Role
from services.broker.steps import CallController, RpcFailed, Sleep, Task
from services.common import limits

# Each AlterPartition call's deadline.
ALTER_PARTITION_TIMEOUT_MS = int(limits.CONTROL_RPC_TIMEOUT_S * 1000)


class ControllerTasks(CoreState):
    """Tasks asking the controller to change what it has committed (Kafka's AlterPartitionManager)."""

    # ---- AlterPartition (a task) ------------------------------------------------------------

    def _alter_partition(self, p: Partition, change: IsrChange) -> Task[None]:
        """Ask the controller to commit an ISR and apply its answer, asking again until answered.

        With no answer for the partition (the RPC failed, or NOT_CONTROLLER from a
        controller that is not, or no longer, active), an earlier copy may have been
        committed and its answer lost: the proposal stays pending (the HW keeps counting
        the member being added) and is asked again until answered or leadership moves
        on. Clearing it let a leader count an ISR smaller than the committed one (sim
        seeds KI-4, 340).
        """
        backoff_ms = limits.ALTER_PARTITION_RETRY_BACKOFF_MS_MIN
        while True:
            # Built for each attempt: a broker that re-registered meanwhile asks with its new
            # broker epoch (asking with the old one is refused forever, sim seed 26).
            req = controller_pb2.AlterPartitionRequest(
                broker_id=self.broker_id,
                broker_epoch=self.broker_epoch,
                partitions=[
                    controller_pb2.AlterPartitionItem(
                        topic=p.topic,
                        partition=p.partition,
                        leader_epoch=change.leader_epoch,
                        partition_epoch=change.partition_epoch,
                        new_isr=list(change.new_isr),
                    )
                ],
            )
            resp = yield CallController("AlterPartition", req, ALTER_PARTITION_TIMEOUT_MS)
            if not isinstance(resp, RpcFailed) and resp.error_code == common_pb2.NONE and resp.partitions:
                break
            if not self._still_proposing(p, change):
                return
            outcome = (
                resp.reason
                if isinstance(resp, RpcFailed)
                else f"refused: {common_pb2.ErrorCode.Name(resp.error_code)} {resp.error_message}"
            )
            self.log.warning(
                "AlterPartition for %s-%d %s; retrying in %d ms", p.topic, p.partition, outcome, backoff_ms
            )
            yield Sleep(backoff_ms)
            if not self._still_proposing(p, change):
                return
            backoff_ms = min(backoff_ms * 2, limits.ALTER_PARTITION_RETRY_BACKOFF_MS_MAX)
        result = resp.partitions[0]
        if result.HasField("state"):
            st = result.state
            p.update_isr(tuple(st.isr), st.partition_epoch, st.leader_epoch)
        if result.error_code != common_pb2.NONE:
            self.log.info(
                "AlterPartition for %s-%d: %s (%s); state re-read",
                p.topic,
                p.partition,
                common_pb2.ErrorCode.Name(result.error_code),
                result.error_message,
            )
        p.isr_change_failed()  # clears pending either way; the next check proposes again if needed
        p.maybe_advance_high_watermark()
        self.notify((p.topic, p.partition))
        self.replay_session_fetches(p)

    def _still_proposing(self, p: Partition, change: IsrChange) -> bool:
        return (
            not self.closing
            and self.partitions.get((p.topic, p.partition)) is p
            and p.pending_isr == change.new_isr
            and p.role is Role.LEADER
            and p.leader_epoch == change.leader_epoch
        )

    # ---- followers' fetches move the ISR -------------------------------------------------------

    def _follower_fetched(
        self, p: Partition, replica_id: int, fetch_offset: int, log_start_offset: int, at_ms: int
    ) -> None:
        """replica_id fetched p from fetch_offset at at_ms: its ISR place, the HW, its log start."""
        tp = (p.topic, p.partition)
        hw_before = p.high_watermark
        change = p.record_follower_fetch(replica_id, fetch_offset, at_ms)
        follower = p.followers.get(replica_id)
        log_start_moved = follower is not None and follower.log_start_offset != log_start_offset
        if follower is not None and log_start_moved:
            # A follower took a new log start: a DeleteRecords may wait on it.
            follower.log_start_offset = log_start_offset
        if change is not None:
            self.log.info("expanding ISR of %s-%d from %s to %s", *tp, list(p.isr), list(change.new_isr))
            metrics.ISR_EXPANDS.inc()
            self.io.spawn("alter-partition", self._alter_partition(p, change))
        if p.high_watermark != hw_before or log_start_moved:
            self.notify(tp)

    def replay_session_fetches(self, p: Partition) -> None:
        """Followers of p outside its ISR, or whose position p does not know (it just became
        leader), fetched it last as their fetch session holds it: record that fetch again.

        A follower without a session names p in every Fetch, so an ISR expansion that could not
        be proposed at one (another change was in flight) is proposed at the next; in a session
        it names p only when its position moves, and an idle partition would keep it out of the
        ISR for good. Called when an ISR change ends and at every ISR check; the fetch is
        recorded at the session's last fetch time, so no follower looks fresher than it is.
        """
        if p.role is not Role.LEADER or p.pending_isr is not None:
            return
        tp = (p.topic, p.partition)
        for replica_id in p.replicas:
            if replica_id == self.broker_id:
                continue
            follower = p.followers.get(replica_id)
            if follower is None or (replica_id in p.isr and follower.log_end_offset >= 0):
                continue
            held = self.replica_sessions.held(replica_id, tp)
            if held is None:
                continue
            sp, at_ms = held
            if sp.current_leader_epoch >= 0 and sp.current_leader_epoch != p.leader_epoch:
                continue  # named for an older leadership: it names p again for this one
            if self.topic_id_differs(tp, sp.topic_id):
                continue  # named for a deleted topic of the same name: it names p again for this one
            if at_ms < follower.last_fetch_ms:
                continue  # a later fetch was recorded already
            self._follower_fetched(p, replica_id, sp.fetch_offset, sp.log_start_offset, at_ms)

    # ---- controlled shutdown (a task) ----------------------------------------------------------

    def controlled_shutdown(self) -> Task[bool]:
        """Ask the controller to move our leaderships away before we stop. Returns whether it did."""
        req = controller_pb2.ControlledShutdownRequest(
            broker_id=self.broker_id, broker_epoch=self.broker_epoch
        )
        for attempt in range(1, limits.CONTROLLED_SHUTDOWN_ATTEMPTS_MAX + 1):
            resp = yield CallController("ControlledShutdown", req, limits.CONTROLLED_SHUTDOWN_TIMEOUT_MS)
            if isinstance(resp, RpcFailed):
                self.log.warning("controlled shutdown attempt %d failed: %s", attempt, resp.reason)
            elif resp.error_code == common_pb2.NONE and not resp.remaining_partitions:
                self.log.info("controlled shutdown done: no partitions led here any more")
                return True
            else:
                self.log.info(
                    "controlled shutdown attempt %d: %s, %d partitions still led here",
                    attempt,
                    common_pb2.ErrorCode.Name(resp.error_code),
                    len(resp.remaining_partitions),
                )
            if attempt < limits.CONTROLLED_SHUTDOWN_ATTEMPTS_MAX:
                yield Sleep(limits.CONTROLLED_SHUTDOWN_BACKOFF_MS * attempt)
        self.log.warning(
            "controlled shutdown incomplete; stopping anyway (the controller fails over on lease expiry)"
        )
        return False
