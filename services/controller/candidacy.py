"""The controller process's campaign-and-act task: serve()'s asyncio driver of controller_life.

Standing by (a warm copy of the metadata, the active controller's connections watched),
campaigning (coordinator/election.py drives controller_life.campaign), then one term:
catch up, start the event loop, act until the lease is lost or the loop resigns, step
down and resign, and stand by again. The role moves through controller_life.ControllerLife,
whose table refuses any other order; the simulation drives the same rules
(tests/sim/sim_controller.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from coordinator.controller_life import ControllerLife, TermEnd
from coordinator.election import ControllerElection
from coordinator.store import EtcdStore
from services.common import limits
from services.common.peers import PeerChannels
from services.controller import metrics
from services.controller.event_loop import ControllerEventLoop
from services.controller.metadata_image import MetadataFollower
from services.controller.standby_watch import StandbyHeartbeat

if TYPE_CHECKING:
    from services.controller.server import ControllerConfig, ControllerServicer

log = logging.getLogger("highwater.controller")


class Candidacy:
    """One controller process's life; `run()` is its one task, `hand_over()` its stop."""

    def __init__(
        self,
        config: ControllerConfig,
        store: EtcdStore,
        peers: PeerChannels,
        servicer: ControllerServicer,
        election: ControllerElection,
    ) -> None:
        self.config = config
        self.store = store
        self.peers = peers
        self.servicer = servicer
        self.election = election
        self.stopping = asyncio.Event()
        self.life = ControllerLife(config.controller_id)

    async def run(self) -> None:
        config, store = self.config, self.store
        while not self.stopping.is_set():
            # Standing by: keep the metadata in memory from etcd's watch, so that winning costs a
            # catch-up to the election's revision instead of a read of every key.
            follower = MetadataFollower(store)
            # ... and watch the active controller's connections, so that its crash runs the
            # election within the grace period rather than a lease TTL (standby_watch.py).
            standby = StandbyHeartbeat(store, config.controller_id, config.controller_connection_grace_ms)
            watching = asyncio.create_task(standby.run(), name="standby-heartbeat")
            try:
                epoch = await self.election.campaign()
            except BaseException:
                await follower.stop()
                raise
            finally:
                watching.cancel()
            if not self.life.won(epoch, stopping=self.stopping.is_set()):
                # Won again while stopping (the standby was slower to campaign than we were to
                # come back): hand the epoch straight back instead of loading the cluster.
                await follower.stop()
                await self.election.resign()
                self.life.stood_down(stopping=True)
                return
            await self._term(epoch, follower)

    async def _term(self, epoch: int, follower: MetadataFollower) -> None:
        config, servicer, election = self.config, self.servicer, self.election
        servicer.begin_term(epoch)
        log.info(
            "controller %d won the election at epoch %d (revision %d)",
            config.controller_id,
            epoch,
            election.won_revision,
        )
        loop = ControllerEventLoop(
            store=self.store,
            controller_id=config.controller_id,
            epoch=epoch,
            peers=self.peers,
            delete_topic_enable=config.delete_topic_enable,
            auto_leader_rebalance=config.auto_leader_rebalance_enable,
            leader_imbalance_check_interval_s=config.leader_imbalance_check_interval_s,
            leader_imbalance_per_broker_percentage=config.leader_imbalance_per_broker_percentage,
        )
        try:
            # Inside the try: a failed catch-up must stand down (and resign) like any failure.
            image = await follower.take(election.won_revision, limits.CONTROLLER_STANDBY_CATCH_UP_S_MAX)
            await loop.start(image)
            servicer.activate(loop, config.broker_connection_grace_ms)
            self.life.started()
            metrics.ACTIVE_CONTROLLER_COUNT.set(1)
            metrics.CONTROLLER_EPOCH.set(epoch)
            lost = asyncio.create_task(election.lost.wait())
            resigned = asyncio.create_task(loop.resigned.wait())
            await asyncio.wait([lost, resigned], return_when=asyncio.FIRST_COMPLETED)
            lost.cancel()
            resigned.cancel()
            if self.stopping.is_set():  # hand_over() hands the epoch over: this process is stopping
                self.life.end_term(TermEnd.STOPPING)
                log.info("controller %d stops acting at epoch %d: stopping", config.controller_id, epoch)
            else:
                why = TermEnd.LEASE_LOST if election.lost.is_set() else TermEnd.RESIGNED
                self.life.end_term(why)
                log.warning(
                    "controller %d stops acting at epoch %d (%s)", config.controller_id, epoch, why.value
                )
        except Exception:
            self.life.end_term(TermEnd.FAILED)
            log.exception("controller %d failed while active at epoch %d", config.controller_id, epoch)
        finally:
            self.life.end_term(TermEnd.STOPPING)  # cancelled: the process stops (no-op once ended)
            servicer.stand_by()
            metrics.ACTIVE_CONTROLLER_COUNT.set(0)
            await loop.stop()
            try:
                await election.resign()
            except Exception as exc:
                log.warning("resign failed: %s", exc)
            self.life.stood_down(stopping=self.stopping.is_set())

    async def hand_over(self) -> None:
        """The stop's first move: stop acting, then revoke the lease so a standby takes over at once
        (not a lease TTL later); the caller cancels run() after, which must not win back meanwhile."""
        self.stopping.set()
        loop = self.servicer.active
        self.servicer.stand_by()
        if loop is not None:
            loop.resigned.set()
        try:
            await self.election.resign()
        except Exception as exc:
            log.warning("resign at stop failed: %s", exc)
