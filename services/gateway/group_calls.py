"""The gateway's consumer-group calls: offset commits and fetches, heartbeats, and the group
admin calls (list, describe, delete).

The rules are elsewhere: offset-commit validation and the fenced write are
services/groups/offset_commits.py's, membership and assignment services/gateway/groups.py's
(GroupService over services/groups/coordinator.py). This module checks group ids, maps their
answers and refusals to protobuf codes, and reads the stored offsets (coordinator/consumer_offsets.py).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from clients.common.topics import group_id_problem
from clients.common.types import TopicPartitionKey
from coordinator import consumer_offsets, values
from coordinator.store import Compare, CoordinatorError, EtcdStore
from protos.highwater.v1 import common_pb2, gateway_pb2
from services.common import limits
from services.gateway.cluster_view import ClusterView
from services.gateway.groups import GROUP_ERROR_CODES, GROUP_ERROR_MESSAGES, GroupService, GroupStateConflict
from services.groups import offset_commits
from services.groups.errors import GroupError

# The response message of a call about one group.
R = TypeVar("R")


class GroupCalls:
    """Group calls over the group coordinator (`groups`) and the offsets stored in etcd."""

    def __init__(self, store: EtcdStore, view: ClusterView, groups: GroupService) -> None:
        self.store = store
        self.view = view
        self.groups = groups

    # ---- consumer offsets ---------------------------------------------------------------------

    async def commit_offsets(
        self, request: gateway_pb2.CommitOffsetsRequest
    ) -> gateway_pb2.CommitOffsetsResponse:
        return await _for_valid_group(
            request.group_id, gateway_pb2.CommitOffsetsResponse, lambda: self._commit_offsets(request)
        )

    async def _commit_offsets(
        self, request: gateway_pb2.CommitOffsetsRequest
    ) -> gateway_pb2.CommitOffsetsResponse:
        """CommitOffsets' adapter: the rules are services/groups/offset_commits.py's, this maps
        them to protobuf codes. Partitions with a problem answer it; the rest are one fenced
        commit, all refused together when the group refuses it (nothing was written)."""
        await self.view.refresh_unless_known(t.topic for t in request.topics)
        commits: list[offset_commits.Commit] = []
        results = []
        for t in request.topics:
            for p in t.partitions:
                commit = offset_commits.Commit(t.topic, p.partition, p.offset, p.metadata, p.leader_epoch)
                problem = offset_commits.partition_problem(
                    commit, commit.key in self.view.cache.partitions, negative_offset_allowed=False
                )
                code, message = (common_pb2.NONE, "") if problem is None else _problem_answer(commit, problem)
                results.append(
                    common_pb2.PartitionResult(
                        topic=t.topic, partition=p.partition, error_code=code, error_message=message
                    )
                )
                if problem is None:
                    commits.append(commit)
        if offset_commits.too_many_offsets(len(commits)):
            return gateway_pb2.CommitOffsetsResponse(
                error_code=common_pb2.INVALID_REQUEST,
                error_message=f"{len(commits)} offsets in one commit; the limit is "
                f"{limits.COMMIT_OFFSETS_PER_REQUEST_MAX}",
            )
        if not commits:
            return gateway_pb2.CommitOffsetsResponse(partitions=results)

        async def write_changed(guard: Compare, changed: Sequence[offset_commits.Commit]) -> bool:
            written = await consumer_offsets.commit_changed(
                self.store, request.group_id, guard, changed, int(time.time() * 1000)
            )
            if not written:
                self.groups.forget(request.group_id)  # its copy of the state is stale
            return written

        refusal = await offset_commits.commit_fenced(
            request.member_id,
            request.member_epoch,
            commits,
            lambda: self.groups.commit_guard(request.group_id),
            write_changed,
        )
        if refusal is not None:
            code, message = _refusal_answer(request.group_id, refusal)
            for r in results:
                if r.error_code == common_pb2.NONE:
                    r.error_code, r.error_message = code, message
        return gateway_pb2.CommitOffsetsResponse(partitions=results)

    async def fetch_committed_offsets(
        self, request: gateway_pb2.FetchCommittedOffsetsRequest
    ) -> gateway_pb2.FetchCommittedOffsetsResponse:
        return await _for_valid_group(
            request.group_id,
            gateway_pb2.FetchCommittedOffsetsResponse,
            lambda: self.committed_offsets(request),
        )

    async def committed_offsets(
        self, request: gateway_pb2.FetchCommittedOffsetsRequest
    ) -> gateway_pb2.FetchCommittedOffsetsResponse:
        """The group's committed offsets; its id is already checked (FetchCommittedOffsets,
        ConsumeRecords)."""
        kvs, _ = await self.store.get_prefix(self.store.keys.consumer_group_prefix(request.group_id))
        stored: dict[TopicPartitionKey, values.CommittedOffsetValue] = {}
        for kv in kvs:
            parsed = self.store.keys.parse_consumer_offset(kv.key)
            if parsed is not None:
                stored[(parsed[1], parsed[2])] = values.decode_consumer_offset(kv.value)
        wanted = [(p.topic, p.partition) for p in request.partitions] or sorted(stored)
        offsets = []
        for tp in wanted:
            entry = stored.get(tp)
            offsets.append(
                gateway_pb2.CommittedOffset(
                    topic=tp[0],
                    partition=tp[1],
                    offset=entry["offset"] if entry else -1,
                    metadata=entry.get("metadata", "") if entry else "",
                    leader_epoch=entry.get("leader_epoch", -1) if entry else -1,
                )
            )
        return gateway_pb2.FetchCommittedOffsetsResponse(offsets=offsets)

    # ---- membership and group admin (services/gateway/groups.py) -------------------------------

    async def heartbeat(
        self, request: gateway_pb2.ConsumerGroupHeartbeatRequest, peer: str
    ) -> gateway_pb2.ConsumerGroupHeartbeatResponse:
        """A member's heartbeat; `peer` is gRPC's peer string, whose host the group describes."""
        try:
            return await self.groups.heartbeat(request, _peer_host(peer))
        except (GroupStateConflict, CoordinatorError) as exc:
            return gateway_pb2.ConsumerGroupHeartbeatResponse(
                error_code=common_pb2.REQUEST_TIMED_OUT, error_message=f"{exc}; retry"
            )

    async def list_groups(self) -> gateway_pb2.ListGroupsResponse:
        return await self.groups.list_groups()

    async def describe_groups(
        self, request: gateway_pb2.DescribeGroupsRequest
    ) -> gateway_pb2.DescribeGroupsResponse:
        response = gateway_pb2.DescribeGroupsResponse()
        await _answer_each_group(request.group_ids, response.groups, self.groups.describe)
        return response

    async def delete_groups(
        self, request: gateway_pb2.DeleteGroupsRequest
    ) -> gateway_pb2.DeleteGroupsResponse:
        response = gateway_pb2.DeleteGroupsResponse()
        await _answer_each_group(request.group_ids, response.results, self.groups.delete)
        return response


async def _for_valid_group(
    group_id: str, response_cls: Callable[..., R], answer: Callable[[], Awaitable[R]]
) -> R:
    """`answer()`; a malformed group id gets an INVALID_REQUEST response instead and is never
    looked up."""
    problem = group_id_problem(group_id)
    if problem is not None:
        return response_cls(error_code=common_pb2.INVALID_REQUEST, error_message=problem)
    return await answer()


async def _answer_each_group(
    group_ids: Sequence[str], answers: Any, answer: Callable[[str], Awaitable[Any]]
) -> None:
    """Append `answer(group)` to `answers` (a repeated field) for each group id; a malformed
    id gets an INVALID_REQUEST entry instead and is never looked up."""
    for group in group_ids:
        problem = group_id_problem(group)
        if problem is not None:
            answers.add(group_id=group, error_code=common_pb2.INVALID_REQUEST, error_message=problem)
        else:
            answers.append(await answer(group))


def _problem_answer(
    commit: offset_commits.Commit, problem: offset_commits.PartitionProblem
) -> tuple[common_pb2.ErrorCode, str]:
    """A partition of CommitOffsets that is not stored: its code and what to do."""
    if problem == offset_commits.PartitionProblem.UNKNOWN_TOPIC_OR_PARTITION:
        return common_pb2.UNKNOWN_TOPIC_OR_PARTITION, f"{commit.topic}-{commit.partition} does not exist"
    if problem == offset_commits.PartitionProblem.INVALID_COMMIT_OFFSET:
        return common_pb2.INVALID_COMMIT_OFFSET, f"offset must be >= 0, got {commit.offset}"
    # OFFSET_METADATA_TOO_LARGE: answered INVALID_REQUEST, the gateway API's code for it.
    return common_pb2.INVALID_REQUEST, (
        f"offset metadata is {len(commit.metadata)} characters; the limit is "
        f"{limits.OFFSET_METADATA_MAX_CHARS}"
    )


def _refusal_answer(group: str, refusal: offset_commits.CommitRefusal) -> tuple[common_pb2.ErrorCode, str]:
    """A refused CommitOffsets: the code every partition of it answers, and what to do."""
    if refusal == offset_commits.CommitRefusal.NON_EMPTY_GROUP:
        return GROUP_ERROR_CODES[GroupError.NON_EMPTY_GROUP], (
            f"group {group!r} has members: its offsets are theirs to commit; stop them before "
            "resetting its offsets"
        )
    if refusal == offset_commits.CommitRefusal.GROUP_KEPT_CHANGING:
        return (
            common_pb2.REQUEST_TIMED_OUT,
            "the group kept changing while committing (a rebalance); commit again",
        )
    error = GroupError(refusal.value)
    return GROUP_ERROR_CODES[error], GROUP_ERROR_MESSAGES[error]


def _peer_host(peer: str) -> str:
    """The client's address from gRPC's peer string ("ipv4:127.0.0.1:5123", "ipv6:[::1]:5123")."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0].strip("[]")
    return peer
