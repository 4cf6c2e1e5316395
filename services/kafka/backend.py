"""The broker process's side of the Kafka listener: the ReplicaManager, etcd and the controller.

The same calls the gRPC BrokerServicer makes (produce, fetch, list_offsets,
offsets_for_leader_epoch on the ReplicaManager; the metadata cache UpdateMetadata feeds), plus
the reads Kafka's answers need that gRPC's do not: every broker's Kafka port (from its etcd
registration) and calls to the active controller (found in etcd, as for AlterPartition).
Owned by the broker's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
from collections.abc import Collection, Sequence
from typing import Any

import grpc

from clients.common.types import TopicPartitionKey
from coordinator import consumer_offsets, kafka_reads
from coordinator.election import current_controller
from coordinator.store import CoordinatorError, MetadataStore
from protos.highwater.v1 import broker_pb2, common_pb2
from services.broker.partition import Role
from services.broker.replica_manager import ReplicaManager
from services.common import limits
from services.common.metadata_cache import MetadataCache
from services.common.peers import PeerChannels
from services.groups import coordinator, offset_commits
from services.groups.coordinator import EPOCH_LEAVE, GroupState
from services.groups.errors import GroupError
from services.kafka.classic_groups import CONSUMER_PROTOCOL_TYPE, subscribed_topics
from services.kafka.group_driver import ClassicGroupDriver
from services.kafka.handler import (
    BackendUnavailable,
    KafkaBroker,
    LogDirDescription,
    OffsetCommit,
    ReplicaLogSize,
    StoredGroupListing,
)
from services.transactions.hosting import ControllerProducerIds, TransactionHost
from services.transactions.marker_writer import GrpcMarkerWriter
from services.transactions.state import txn_offset_commit_member_check


class BrokerKafkaBackend:
    def __init__(
        self, broker_id: int, replicas: ReplicaManager, store: MetadataStore, peers: PeerChannels
    ) -> None:
        self._broker_id = broker_id
        self.replicas = replicas
        self.store = store
        self.peers = peers
        self._brokers: list[KafkaBroker] = []
        self._brokers_read_at = -float("inf")
        self._cluster_id = ""
        self._classic_groups = ClassicGroupDriver(broker_id)
        self._transactions = TransactionHost(
            broker_id,
            store,
            GrpcMarkerWriter(replicas.metadata, peers),
            ControllerProducerIds(self.call_controller),
            self._kafka_broker_ids,
        )
        self._transaction_timers: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the classic groups' timer and the transaction coordinator's (on the running
        event loop)."""
        self._classic_groups.start()
        self._transaction_timers = asyncio.create_task(
            self._transactions.run(), name="transaction-coordinator"
        )

    async def close(self) -> None:
        if self._transaction_timers is not None:
            self._transaction_timers.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._transaction_timers
        await self._transactions.close()
        await self._classic_groups.close()

    @property
    def transactions(self) -> TransactionHost:
        return self._transactions

    async def _kafka_broker_ids(self) -> list[int]:
        """The brokers with a Kafka listener, read from etcd for the coordinator's ownership
        check, past Metadata's cache: refreshing that cache on the host's schedule could fill it
        just before the other brokers register at start-up and hand Kafka clients, for the
        cache's life, a broker list without their partitions' leaders."""
        registrations = await self._etcd("broker list", kafka_reads.registered_brokers(self.store))
        return [int(r["broker_id"]) for r in registrations if r["kafka_port"] > 0]

    def open_transaction_epoch(self, tp: TopicPartitionKey, producer_id: int) -> int | None:
        return self.replicas.core.open_transaction_epoch(tp, producer_id)

    async def consumer_group_member_check(self, group: str, member_id: str, member_epoch: int) -> GroupError:
        verdict: GroupError = await self._etcd(
            "group state", txn_offset_commit_member_check(self.store, group, member_id, member_epoch)
        )
        return verdict

    @property
    def classic_groups(self) -> ClassicGroupDriver:
        return self._classic_groups

    @property
    def broker_id(self) -> int:
        return self._broker_id

    @property
    def metadata(self) -> MetadataCache:
        return self.replicas.metadata

    async def produce(
        self, req: common_pb2.ProduceRequest, *, transactional: bool = False
    ) -> common_pb2.ProduceResponse:
        return await self.replicas.produce(req, transactional=transactional)

    async def fetch(self, req: common_pb2.FetchRequest) -> common_pb2.FetchResponse:
        return await self.replicas.fetch(req)

    def list_offsets(self, req: common_pb2.ListOffsetsRequest) -> common_pb2.ListOffsetsResponse:
        return self.replicas.list_offsets(req)

    def offsets_for_leader_epoch(
        self, req: broker_pb2.OffsetsForLeaderEpochRequest
    ) -> broker_pb2.OffsetsForLeaderEpochResponse:
        return self.replicas.offsets_for_leader_epoch(req)

    async def delete_records(self, req: common_pb2.DeleteRecordsRequest) -> common_pb2.DeleteRecordsResponse:
        return await self.replicas.delete_records(req)

    def log_dirs(self, wanted: Collection[tuple[str, int]] | None) -> list[LogDirDescription]:
        """The broker's one data directory and its replicas, leaders and followers (an offline
        log is left out: its size is not known)."""
        core = self.replicas.core
        replicas = tuple(
            ReplicaLogSize(tp[0], tp[1], p.log.size_bytes, max(p.high_watermark - p.log.log_end_offset, 0))
            for tp, p in sorted(self.replicas.partitions.items())
            if (wanted is None or tp in wanted)
            and p.role in (Role.LEADER, Role.FOLLOWER)
            and not p.log.is_offline
            and not p.log.is_closed
        )
        try:
            usage = shutil.disk_usage(core.data_dir)
            total_bytes, usable_bytes = usage.total, usage.free
        except OSError:
            total_bytes = usable_bytes = -1
        return [LogDirDescription(os.path.abspath(core.data_dir), total_bytes, usable_bytes, replicas)]

    async def _etcd(self, what: str, call: Any) -> Any:
        try:
            return await asyncio.wait_for(call, limits.KAFKA_BACKEND_CALL_TIMEOUT_S)
        except (CoordinatorError, TimeoutError) as exc:
            raise BackendUnavailable(f"{what}: etcd did not answer ({exc})") from exc

    async def kafka_brokers(self) -> list[KafkaBroker]:
        now = time.monotonic()
        if now - self._brokers_read_at >= limits.KAFKA_BROKER_LIST_CACHE_MS / 1000:
            registrations = await self._etcd("broker list", kafka_reads.registered_brokers(self.store))
            self._brokers = [
                KafkaBroker(r["broker_id"], r["host"], r["kafka_port"], r["rack"])
                for r in registrations
                if r["kafka_port"] > 0
            ]
            self._brokers_read_at = now
        return self._brokers

    async def cluster_id(self) -> str:
        if not self._cluster_id:
            self._cluster_id = await self._etcd("cluster id", kafka_reads.cluster_id(self.store))
        return self._cluster_id

    async def call_controller(self, rpc: str, request: Any) -> Any:
        info = await self._etcd("active controller", current_controller(self.store))
        if not info:
            raise BackendUnavailable(f"{rpc}: no active controller registered in etcd")
        stub = self.peers.controller(f"{info['host']}:{info['port']}")
        try:
            return await getattr(stub, rpc)(request, timeout=limits.KAFKA_BACKEND_CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise BackendUnavailable(
                f"{rpc} to the controller failed: {exc.code().name} {exc.details()}"
            ) from exc

    async def commit_offsets(self, group: str, offsets: list[OffsetCommit]) -> tuple[int, str]:
        """OffsetCommit's store for a commit from outside the KIP-848 membership, by
        services/groups/offset_commits.py's rules: refused while the group has KIP-848
        members, applied in a transaction that requires the group's state unchanged since that
        check. Split in batches (offset_commits.batches) a Kafka client cannot make itself."""

        async def read_state() -> tuple[GroupState, int]:
            raw, revision = await self._etcd(
                "group state", consumer_offsets.read_group_state(self.store, group)
            )
            state = GroupState(group_id=group) if raw is None else GroupState.from_record(json.loads(raw))
            return state, revision

        async def write_changed(revision: int, batch: Sequence[offset_commits.Commit]) -> bool:
            written: bool = await self._etcd(
                "offset commit",
                consumer_offsets.commit_if_state_unchanged(
                    self.store,
                    group,
                    revision,
                    [(c.topic, c.partition, c.offset, c.metadata, c.leader_epoch) for c in batch],
                    int(time.time() * 1000),
                ),
            )
            return written

        for batch in offset_commits.batches(offsets):
            refusal = await offset_commits.commit_fenced("", EPOCH_LEAVE, batch, read_state, write_changed)
            if refusal == offset_commits.CommitRefusal.GROUP_KEPT_CHANGING:
                return common_pb2.REQUEST_TIMED_OUT, "the group kept changing while committing; commit again"
            if refusal is not None:  # only NON_EMPTY_GROUP: the commit comes from outside the group
                return (
                    common_pb2.NON_EMPTY_GROUP,
                    f"group {group!r} has members: its offsets are theirs to commit",
                )
        return common_pb2.NONE, ""

    async def committed_offsets(self, group: str) -> dict[tuple[str, int], OffsetCommit]:
        stored = await self._etcd("committed offsets", consumer_offsets.committed_offsets(self.store, group))
        return {
            tp: OffsetCommit(
                tp[0], tp[1], int(v["offset"]), str(v.get("metadata", "")), int(v.get("leader_epoch", -1))
            )
            for tp, v in stored.items()
        }

    # ---- group admin (DeleteGroups, OffsetDelete) and the groups etcd holds -------------------

    async def stored_groups(self, group: str | None = None) -> list[StoredGroupListing]:
        """The groups etcd holds something of (KIP-848 state or committed offsets), or only
        `group`: a group with committed offsets and no members is Empty, as in Kafka."""
        if group is None:
            stored = await self._etcd("groups", consumer_offsets.stored_groups(self.store))
        else:
            one = await self._etcd("group", consumer_offsets.read_group(self.store, group))
            stored = {} if one is None else {group: one}
        listings = []
        for group_id, held in sorted(stored.items()):
            state = _state_of(group_id, held)
            listings.append(StoredGroupListing(group_id, coordinator.state_name(state), len(state.members)))
        return listings

    async def delete_group(self, group: str) -> tuple[GroupError, str]:
        """DeleteGroups for one group: its committed offsets and KIP-848 state go, and the
        classic group if this broker holds one empty. Refused NON_EMPTY_GROUP while either kind
        of member is in it, GROUP_ID_NOT_FOUND when nothing of it exists."""
        classic = self._classic_groups.group(group)
        if classic is not None and classic.members:
            return GroupError.NON_EMPTY_GROUP, (
                f"group {group!r} has {len(classic.members)} members (Kafka consumers); stop them first"
            )
        stored = await self._etcd("group", consumer_offsets.read_group(self.store, group))
        if stored is not None:
            state = _state_of(group, stored)
            if not coordinator.deletable(state):
                return GroupError.NON_EMPTY_GROUP, (
                    f"group {group!r} has {len(state.members)} members (gateway consumers); stop them first"
                )
            deleted = await self._etcd(
                "group delete",
                consumer_offsets.delete_group_if_state_unchanged(
                    self.store, group, stored.state_mod_revision
                ),
            )
            if not deleted:
                return GroupError.NON_EMPTY_GROUP, (
                    f"group {group!r} changed while being deleted (a member joined?); try again"
                )
        if self._classic_groups.delete(group) == GroupError.GROUP_ID_NOT_FOUND and stored is None:
            return GroupError.GROUP_ID_NOT_FOUND, f"no group {group!r}: no members and no committed offsets"
        return GroupError.NONE, ""

    async def delete_offsets(
        self, group: str, partitions: list[TopicPartitionKey]
    ) -> tuple[GroupError, str, dict[TopicPartitionKey, GroupError]]:
        """OffsetDelete: (the group's error, its message, each partition's error). A group
        without members loses every named offset; a live one only those of topics none of its
        members subscribes to (GROUP_SUBSCRIBED_TO_TOPIC for the rest), as Kafka's coordinator
        decides. Applied in transactions that require the KIP-848 state unchanged since the
        check (chunks of COMMIT_OFFSETS_PER_REQUEST_MAX; deleting twice is harmless)."""
        for _ in range(limits.GROUP_STATE_CAS_ATTEMPTS_MAX):
            classic = self._classic_groups.group(group)
            stored = await self._etcd("group", consumer_offsets.read_group(self.store, group))
            if classic is None and stored is None:
                return GroupError.GROUP_ID_NOT_FOUND, f"no group {group!r}", {}
            subscribed: frozenset[str] = frozenset()
            every_topic = False
            if classic is not None and classic.members:
                if classic.protocol_type != CONSUMER_PROTOCOL_TYPE:
                    return (
                        GroupError.NON_EMPTY_GROUP,
                        f"group {group!r} has members of protocol type {classic.protocol_type!r}",
                        {},
                    )
                topics = subscribed_topics(classic)
                every_topic = topics is None  # not known yet (a rebalance): keep every offset
                subscribed = topics or frozenset()
            state = _state_of(group, stored) if stored is not None else GroupState(group_id=group)
            subscribed |= coordinator.subscribed_topics(state)
            errors = {
                tp: GroupError.GROUP_SUBSCRIBED_TO_TOPIC
                if every_topic or tp[0] in subscribed
                else GroupError.NONE
                for tp in partitions
            }
            doomed = [tp for tp, e in errors.items() if e == GroupError.NONE]
            revision = stored.state_mod_revision if stored is not None else 0
            step = limits.COMMIT_OFFSETS_PER_REQUEST_MAX
            for start in range(0, len(doomed), step):
                done = await self._etcd(
                    "offset delete",
                    consumer_offsets.delete_offsets_if_state_unchanged(
                        self.store, group, revision, doomed[start : start + step]
                    ),
                )
                if not done:
                    break
            else:
                return GroupError.NONE, "", errors
        return (
            GroupError.COORDINATOR_NOT_AVAILABLE,
            f"group {group!r} kept changing while its offsets were deleted; try again",
            {},
        )


def _state_of(group: str, stored: consumer_offsets.StoredGroup) -> GroupState:
    """The group's KIP-848 coordinator state as stored (none stored: an empty group)."""
    if stored.state is None:
        return GroupState(group_id=group)
    return GroupState.from_record(json.loads(stored.state))
