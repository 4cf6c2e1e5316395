"""The admin client's offset and consumer group calls: list offsets, a group's committed
offsets and lag, list, describe and delete groups, reset their offsets (AsyncAdmin,
clients/admin.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from clients.admin_calls import AdminCalls, per_partition, raise_first
from clients.config import COMMIT_OFFSETS_PER_REQUEST_MAX, check_group_id, check_int
from clients.consumer import EARLIEST, LATEST, check_partitions
from clients.errors import InvalidArgument, error_for_code
from clients.types import (
    ConsumerGroupDescription,
    GroupListing,
    GroupMemberDescription,
    GroupPartitionOffset,
    TopicPartition,
)
from protos.highwater.v1 import common_pb2, gateway_pb2


class GroupAdmin(AdminCalls):
    """Offsets and consumer groups: AsyncAdmin's group calls."""

    async def list_offsets(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """ListOffsets: -2 earliest, -1 latest (HW), else the first offset at or after a timestamp."""
        by_topic: dict[str, list[common_pb2.ListOffsetsPartition]] = {}
        for tp in check_partitions(timestamps):
            ts = check_int(f"timestamp for {tp}", timestamps[tp], minimum=EARLIEST)
            by_topic.setdefault(tp.topic, []).append(
                common_pb2.ListOffsetsPartition(partition=tp.partition, timestamp=ts, current_leader_epoch=-1)
            )
        response = await self._conn().call(
            "ListOffsets",
            common_pb2.ListOffsetsRequest(
                replica_id=-1,
                topics=[common_pb2.ListOffsetsTopic(topic=t, partitions=p) for t, p in by_topic.items()],
            ),
        )
        return per_partition(response, "ListOffsets", lambda p: p.offset)

    async def list_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, int]:
        """The group's committed offsets (next offset to read) for these partitions, default all."""
        if not isinstance(group_id, str) or not group_id:
            raise InvalidArgument(f"group id must be a non-empty str, got {group_id!r}")
        tps = [] if partitions is None else check_partitions(partitions)
        response = await self._call(
            "FetchCommittedOffsets",
            gateway_pb2.FetchCommittedOffsetsRequest(
                group_id=group_id,
                partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in tps],
            ),
        )
        return {TopicPartition(o.topic, o.partition): o.offset for o in response.offsets}

    async def describe_group(self, group_id: str) -> list[GroupPartitionOffset]:
        """Committed offset, end offset (HW) and lag of every partition the group committed."""
        committed = await self.list_group_offsets(group_id)
        if not committed:
            return []
        ends = await self.list_offsets(dict.fromkeys(committed, LATEST))
        rows = []
        for tp in sorted(committed):
            offset = committed[tp]
            end = ends.get(tp, -1)
            lag = max(0, end - offset) if offset >= 0 and end >= 0 else None
            rows.append(GroupPartitionOffset(tp.topic, tp.partition, offset, end, lag))
        return rows

    async def list_groups(self) -> list[GroupListing]:
        """Every consumer group with members or committed offsets."""
        response = await self._call("ListGroups", gateway_pb2.ListGroupsRequest())
        return [GroupListing(g.group_id, g.state, g.members, g.group_epoch) for g in response.groups]

    async def describe_consumer_group(self, group_id: str) -> ConsumerGroupDescription:
        """Members (host, client id, epoch, assignment) and committed offsets with lag;
        GroupIdNotFound when the group has neither."""
        group_id = check_group_id(group_id)
        response = await self._call("DescribeGroups", gateway_pb2.DescribeGroupsRequest(group_ids=[group_id]))
        (d,) = response.groups
        if d.error_code != common_pb2.NONE:
            raise error_for_code(d.error_code, d.error_message or f"DescribeGroups {group_id}")
        members = [
            GroupMemberDescription(
                member_id=m.member_id,
                instance_id=m.instance_id or None,
                client_id=m.client_id,
                client_host=m.client_host,
                member_epoch=m.member_epoch,
                assignment=[TopicPartition(p.topic, p.partition) for p in m.assignment],
                target_assignment=[TopicPartition(p.topic, p.partition) for p in m.target_assignment],
                state=m.state,
            )
            for m in d.members
        ]
        return ConsumerGroupDescription(
            group_id=group_id,
            state=d.state,
            group_epoch=d.group_epoch,
            target_epoch=d.target_epoch,
            assignor=d.assignor,
            members=members,
            offsets=await self.describe_group(group_id),
        )

    async def delete_group(self, group_id: str) -> None:
        """Delete a group's committed offsets; NonEmptyGroup while it has members."""
        group_id = check_group_id(group_id)
        response = await self._call("DeleteGroups", gateway_pb2.DeleteGroupsRequest(group_ids=[group_id]))
        for r in response.results:
            if r.error_code != common_pb2.NONE:
                raise error_for_code(r.error_code, r.error_message or f"DeleteGroups {group_id}")

    async def alter_group_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Set a group's committed offsets (the next offset to read) from outside the group:
        kafka-consumer-groups --reset-offsets. NonEmptyGroup while the group has members
        (their progress would be overwritten under them)."""
        group_id = check_group_id(group_id)
        items = [
            (tp, check_int(f"offset for {tp}", offsets[tp], minimum=0)) for tp in check_partitions(offsets)
        ]
        for start in range(0, len(items), COMMIT_OFFSETS_PER_REQUEST_MAX):
            by_topic: dict[str, list[gateway_pb2.OffsetCommitPartition]] = {}
            for tp, offset in items[start : start + COMMIT_OFFSETS_PER_REQUEST_MAX]:
                by_topic.setdefault(tp.topic, []).append(
                    gateway_pb2.OffsetCommitPartition(partition=tp.partition, offset=offset, leader_epoch=-1)
                )
            response = await self._call(
                "CommitOffsets",
                gateway_pb2.CommitOffsetsRequest(
                    group_id=group_id,
                    topics=[
                        gateway_pb2.OffsetCommitTopic(topic=t, partitions=p) for t, p in by_topic.items()
                    ],
                ),
            )
            raise_first(
                [
                    error_for_code(r.error_code, r.error_message or f"commit for {r.topic}-{r.partition}")
                    for r in response.partitions
                    if r.error_code != common_pb2.NONE
                ]
            )
