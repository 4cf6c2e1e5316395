"""The gateway's picture of the cluster: its metadata cache and how it is kept fresh.

The controller pushes UpdateMetadata (the gateway registers under /gateways/ids for that);
the gateway also pulls DescribeCluster from the active controller at start and whenever a
leader answers that its picture is stale. Every other part of the gateway reads the cache
through `ClusterView.cache` (never a copy of it: tests and the refresh replace it whole) and
waits for news through `metadata_changed`.

Owned by the gateway's event loop; no locks beyond the one that keeps pulls single.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any

import grpc

from coordinator.election import current_controller
from coordinator.store import EtcdStore
from protos.highwater.v1 import broker_pb2, common_pb2
from services.common import limits
from services.common.metadata_cache import MetadataCache
from services.common.peers import PeerChannels

log = logging.getLogger("highwater.gateway")

# Between two routing attempts of one request, unless new metadata arrives first.
ROUTING_RETRY_BACKOFF_MS = 100
# The same when the leader named by the metadata answered but has not yet applied its
# leadership (NOT_LEADER_OR_FOLLOWER): the controller's LeaderAndIsr reaches it in milliseconds,
# and the push of UpdateMetadata to this gateway often comes first.
ROUTING_RETRY_LEADER_BEHIND_MS = 20
# Between two attempts in any case: a burst of metadata pushes must not spin the loop.
ROUTING_RETRY_MIN_MS = 5


class ClusterView:
    """The metadata cache, the pulls that refresh it and the event that announces a change."""

    def __init__(self, store: EtcdStore, peers: PeerChannels) -> None:
        self.store = store
        self.peers = peers
        self.cache = MetadataCache()
        # Set (and replaced) whenever the cache changes: a request waiting to route again
        # goes as soon as the controller's push names a new leader, not at its next back-off.
        self.metadata_changed = asyncio.Event()
        self._last_refresh = 0.0
        self._refresh_lock = asyncio.Lock()
        self._tasks: set[asyncio.Future[None]] = set()
        # DescribeCluster carries it; UpdateMetadata does not, so it is kept from the last pull.
        self.cluster_id = ""

    def background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` without waiting for it (a refresh after a stale answer), keeping a reference."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def controller_address(self) -> str | None:
        info = await current_controller(self.store)
        return f"{info['host']}:{info['port']}" if info else None

    async def refresh_metadata(self, *, force: bool = False) -> None:
        """Pull DescribeCluster from the active controller: always with `force`, else at most once
        per GATEWAY_METADATA_REFRESH_INTERVAL_MS_MIN. A failed pull is logged and leaves the cache."""
        async with self._refresh_lock:
            if (
                not force
                and (time.monotonic() - self._last_refresh) * 1000
                < limits.GATEWAY_METADATA_REFRESH_INTERVAL_MS_MIN
            ):
                return
            address = await self.controller_address()
            if address is None:
                return
            try:
                resp = await self.peers.controller(address).DescribeCluster(
                    common_pb2.DescribeClusterRequest(), timeout=limits.CONTROL_RPC_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                log.warning("metadata refresh from controller at %s failed: %s", address, exc.code().name)
                return
            if resp.error_code == common_pb2.NONE:
                self.cache.apply_describe(resp)
                self.cluster_id = resp.cluster_id or self.cluster_id
                self._last_refresh = time.monotonic()
                self.announce_metadata()

    async def refresh_unless_known(self, topics: Iterable[str]) -> None:
        """Refresh (rate-limited) when one of `topics` is not in the cache: it may be new."""
        known = self.cache.topics()
        if any(t not in known for t in topics):
            await self.refresh_metadata()

    def announce_metadata(self) -> None:
        changed, self.metadata_changed = self.metadata_changed, asyncio.Event()
        changed.set()

    async def await_routing_retry(self, news: asyncio.Event, backoff_ms: int, *, force: bool) -> None:
        """Before routing again: at once if metadata changed since the attempt began (`news`
        set), else when it changes or after backoff_ms, then from the controller itself:
        always with `force`, else at most once per GATEWAY_METADATA_REFRESH_INTERVAL_MS_MIN
        (the short leader-behind wait must not pull the whole cluster every 20 ms)."""
        if news.is_set():
            await asyncio.sleep(ROUTING_RETRY_MIN_MS / 1000)
            return
        try:
            await asyncio.wait_for(news.wait(), backoff_ms / 1000)
        except TimeoutError:
            await self.refresh_metadata(force=force)

    def update_metadata(self, request: broker_pb2.UpdateMetadataRequest) -> broker_pb2.UpdateMetadataResponse:
        """The controller's push; one from an older controller epoch is refused and not applied."""
        if request.header.controller_epoch < self.cache.controller_epoch:
            return broker_pb2.UpdateMetadataResponse(
                error_code=common_pb2.STALE_CONTROLLER_EPOCH,
                error_message=f"controller epoch {request.header.controller_epoch} is older than "
                f"{self.cache.controller_epoch}",
            )
        self.cache.apply(request)
        self.announce_metadata()
        return broker_pb2.UpdateMetadataResponse()

    async def metadata(self, request: common_pb2.MetadataRequest) -> common_pb2.MetadataResponse:
        missing = [t for t in request.topics if t not in self.cache.topics()]
        if missing or not self.cache.brokers or not self.cluster_id:
            await self.refresh_metadata()
        response = self.cache.metadata_response(list(request.topics))
        response.cluster_id = self.cluster_id
        return response

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        """Partition counts of the named topics that exist (the group coordinator's input)."""
        await self.refresh_unless_known(topics)
        known = self.cache.topics()
        return {t: len(self.cache.partitions_of(t)) for t in topics if t in known}
