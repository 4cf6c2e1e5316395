"""A standby controller's copy of the metadata in the simulation (metadata_image.MetadataFollower).

The real follower is an asyncio task; here the controller node calls `follow()` whenever
etcd moved or its tick comes, and `take()` when it has won. The image is the real
MetadataImage, loaded by the real load_image and fed the simulated watch's events by its
own replay(); this class only does the follower's order: load once, then replay every
change of the whole prefix; a compacted watch means a fresh load, never a gap.
"""

from __future__ import annotations

from clients.common.errors import InvariantViolation
from coordinator.memory_store import MemoryWatch
from coordinator.store import CoordinatorError, WatchCompacted
from services.controller.metadata_image import MetadataImage, load_image
from tests.sim.clock import Node
from tests.sim.sim_etcd import EtcdClient, SimEtcd, run_sync


class SimStandby:
    """One standing-by's copy: a new one each time the controller stands by."""

    def __init__(self, node: Node, etcd: SimEtcd, client: EtcdClient, controller_id: int) -> None:
        self.node = node
        self.etcd = etcd
        self.client = client
        self.controller_id = controller_id
        self.image: MetadataImage | None = None
        self.watch: MemoryWatch | None = None
        self.follow()

    def follow(self) -> None:
        if not self.client.reachable():
            return  # the stream waits; it catches up from its revision once etcd is back
        if self.image is None or self.watch is None:
            try:
                image = run_sync(load_image(self.client))  # type: ignore[arg-type]
            except CoordinatorError:
                return
            self.image = image
            self.watch = self.etcd.subscribe(self.etcd.keys.prefix + "/", image.revision + 1)
        try:
            for events in self.watch.drain():
                self.image.replay(events)
            self.image.warm_protos()
        except WatchCompacted:
            self.node.trace("standby: watch compacted; loading the metadata again")
            self.image = self.watch = None
            self.follow()

    def take(self, won_revision: int) -> MetadataImage | None:
        """MetadataFollower.take: the copy once caught up to the election's revision, else None."""
        self.follow()
        image, self.image, self.watch = self.image, None, None
        if image is None or image.revision < won_revision:
            self.node.trace("standby's metadata not caught up to revision %d: loading it", won_revision)
            return None
        # The simulation's own check (the real follower trusts its replay): what the standby
        # replayed is what a fresh read of etcd gives now, as it has drained every change.
        loaded = run_sync(load_image(self.client))  # type: ignore[arg-type]
        if image.context(self.controller_id, 0) != loaded.context(self.controller_id, 0):
            raise InvariantViolation(
                f"{self.node.name}: the standby's replayed metadata at revision {image.revision} differs "
                f"from a fresh load at revision {loaded.revision}"
            )
        return image
