"""Kafka's group calls: FindCoordinator, offsets (OffsetCommit, OffsetFetch, OffsetDelete), the
classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup; classic_groups.py) and the
group admin calls (ListGroups, DescribeGroups, DeleteGroups).

A group's coordinator is the broker `coordinator_of` names; a request for a group this broker
does not coordinate answers NOT_COORDINATOR, which sends the client to FindCoordinator again.
Groups the request's ACL decision refuses answer GROUP_AUTHORIZATION_FAILED before any work.
Pure: the backend (backend.py) reads and writes the offsets and drives the classic groups.
"""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode as K

from clients.common.topics import group_id_problem
from protos.highwater.v1 import common_pb2
from services.groups import offset_commits
from services.groups.errors import GroupError, kafka_code
from services.kafka import acl_rules, protocol
from services.kafka.classic_groups import CONSUMER_PROTOCOL_TYPE
from services.kafka.handler_common import (
    NO_THROTTLE,
    NOT_AUTHORIZED,
    BackendUnavailable,
    ConnectionContext,
    KafkaBroker,
    OffsetCommit,
    RequestAcl,
    coordinating_broker,
    group_refusal,
    log,
    ms,
    not_coordinator,
)
from services.kafka.protocol import Request, build, kafka_error, nested
from services.security import authz
from services.transactions.coordinator import transactional_id_problem

# FindCoordinator's key types: 0 a group, 1 a transactional id.
KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = acl_rules.KEY_TYPE_TRANSACTION


class GroupCalls:
    """The group calls of one connection (its ConnectionContext)."""

    def __init__(self, context: ConnectionContext) -> None:
        self.context = context

    # ---- offsets: every broker coordinates every group -----------------------------------------

    async def find_coordinator(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.FIND_COORDINATOR, request.api_version)
        keys = list(body.coordinator_keys) if hasattr(body, "coordinator_keys") else [body.key]
        key_type = getattr(body, "key_type", KEY_TYPE_GROUP)
        brokers: list[KafkaBroker] = []
        try:
            brokers = await self.context.backend.kafka_brokers()
        except BackendUnavailable as exc:
            log.warning("FindCoordinator: %s", exc)

        def answer(key: str) -> dict[str, Any]:
            if key_type not in (KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION):
                code, message = (
                    K.invalid_request,
                    f"key type {key_type} is not served: 0 (group) or 1 (transaction)",
                )
            elif key_type == KEY_TYPE_TRANSACTION and acl.decision.transactional_refused:
                code, message = K.transactional_id_authorization_failed, NOT_AUTHORIZED
            elif key_type == KEY_TYPE_TRANSACTION and (problem := transactional_id_problem(key)) is not None:
                code, message = K.invalid_request, problem
            elif key_type == KEY_TYPE_GROUP and key in acl.decision.groups_refused:
                code, message = K.group_authorization_failed, NOT_AUTHORIZED
            elif key_type == KEY_TYPE_GROUP and (problem := group_id_problem(key)) is not None:
                code, message = K.invalid_group_id, problem
            elif (me := coordinating_broker(brokers, key)) is None:
                code, message = K.coordinator_not_available, "no broker's registration could be read"
            else:
                return {
                    "key": key,
                    "error_code": K.none,
                    "error_message": None,
                    "node_id": me.broker_id,
                    "host": me.host,
                    "port": me.kafka_port,
                }
            return {
                "key": key,
                "error_code": code,
                "error_message": message,
                "node_id": -1,
                "host": "",
                "port": -1,
            }

        if hasattr(body, "coordinator_keys"):
            coordinator_cls = nested(cls, "Coordinator")
            return build(
                cls,
                throttle_time=NO_THROTTLE,
                coordinators=tuple(build(coordinator_cls, **answer(k)) for k in keys),
            )
        single = answer(keys[0])
        del single["key"]  # before v4 the response is the one answer, with no key beside it
        return build(cls, throttle_time=NO_THROTTLE, **single)

    async def offset_commit(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.OFFSET_COMMIT, request.api_version)
        topic_cls = nested(cls, "OffsetCommitResponseTopic")
        part_cls = nested(cls, "OffsetCommitResponsePartition")
        codes: dict[tuple[str, int], K] = {}
        commits: list[OffsetCommit] = []
        whole: K | None = None
        decision = acl.decision
        if body.group_id in decision.groups_refused:
            whole = K.group_authorization_failed
        elif group_id_problem(body.group_id) is not None:
            whole = K.invalid_group_id
        elif (refused := await self._not_coordinator(body.group_id)) is not None:
            whole = refused
        else:
            # Members commit for their generation; a commit from outside (generation -1, no
            # member id) only to a group without classic members (and, in commit_offsets,
            # without KIP-848 members).
            check = self.context.backend.classic_groups.commit_check(
                body.group_id, body.member_id, body.generation_id_or_member_epoch
            )
            whole = None if check == GroupError.NONE else kafka_code(check)
        cache = self.context.backend.metadata
        for t in body.topics:
            for p in t.partitions:
                tp = (t.name, p.partition_index)
                commit = offset_commits.Commit(
                    t.name,
                    p.partition_index,
                    p.committed_offset,
                    p.committed_metadata or "",
                    getattr(p, "committed_leader_epoch", -1),
                )
                if whole is not None:
                    codes[tp] = whole
                elif t.name in decision.topics_refused:
                    codes[tp] = K.topic_authorization_failed
                # Negative offsets are stored as given, as Kafka's coordinator does (kafkajs'
                # resetOffsets commits -2 / -1 for earliest / latest).
                elif problem := offset_commits.partition_problem(
                    commit, tp in cache.partitions, negative_offset_allowed=True
                ):
                    # INVALID_COMMIT_OFFSET cannot arise here: negative offsets are allowed.
                    codes[tp] = (
                        K.unknown_topic_or_partition
                        if problem == offset_commits.PartitionProblem.UNKNOWN_TOPIC_OR_PARTITION
                        else K.offset_metadata_too_large
                    )
                else:
                    commits.append(commit)
        if commits:
            try:
                code, message = await self.context.backend.commit_offsets(body.group_id, commits)
                result = kafka_error(code)
                if code != common_pb2.NONE:
                    log.info("OffsetCommit for group %r refused: %s", body.group_id, message)
            except BackendUnavailable as exc:
                log.warning("OffsetCommit: %s", exc)
                result = K.coordinator_not_available
            for c in commits:
                codes[(c.topic, c.partition)] = result
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            topics=tuple(
                build(
                    topic_cls,
                    name=t.name,
                    partitions=tuple(
                        build(
                            part_cls,
                            partition_index=p.partition_index,
                            error_code=codes[(t.name, p.partition_index)],
                        )
                        for p in t.partitions
                    ),
                )
                for t in body.topics
            ),
        )

    async def offset_fetch(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.OFFSET_FETCH, request.api_version)
        topic_cls = nested(cls, "OffsetFetchResponseTopic")
        part_cls = nested(cls, "OffsetFetchResponsePartition")
        whole = K.none
        stored: dict[tuple[str, int], OffsetCommit] = {}
        if body.group_id in acl.decision.groups_refused:
            whole = K.group_authorization_failed
        elif group_id_problem(body.group_id) is not None:
            whole = K.invalid_group_id
        else:
            try:
                stored = await self.context.backend.committed_offsets(body.group_id)
            except BackendUnavailable as exc:
                log.warning("OffsetFetch: %s", exc)
                whole = K.coordinator_not_available
        if body.topics is None:
            wanted: dict[str, list[int]] = {}
            for topic, partition in sorted(stored):
                # All the group's offsets: the topics the principal may not describe left out.
                if acl.allowed(authz.Operation.DESCRIBE, authz.topic(topic)):
                    wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {t.name: list(t.partition_indexes) for t in body.topics}

        def partition_answer(topic: str, index: int) -> Any:
            found = stored.get((topic, index))
            return build(
                part_cls,
                partition_index=index,
                committed_offset=found.offset if found else -1,
                committed_leader_epoch=found.leader_epoch if found else -1,
                metadata=found.metadata if found else "",
                error_code=K.topic_authorization_failed
                if whole == K.none and topic in acl.decision.topics_refused
                else whole,
            )

        return build(
            cls,
            throttle_time=NO_THROTTLE,
            error_code=whole,
            topics=tuple(
                build(topic_cls, name=name, partitions=tuple(partition_answer(name, i) for i in indexes))
                for name, indexes in wanted.items()
            ),
        )

    # ---- the classic group protocol (classic_groups.py) -----------------------------------------

    async def _not_coordinator(self, group_id: str) -> K | None:
        return await not_coordinator(self.context, group_id, "group")

    async def join_group(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.JOIN_GROUP, request.api_version)
        member_cls = nested(cls, "JoinGroupResponseMember")

        def refused(code: K) -> Any:
            return build(
                cls,
                throttle_time=NO_THROTTLE,
                error_code=code,
                generation_id=-1,
                protocol_type=None,
                # Nullable from v7 only: None in v2-v6 cannot be written, and the answer never left.
                protocol_name=None if request.api_version >= 7 else "",
                leader="",
                member_id=body.member_id,
                members=(),
            )

        if body.group_id in acl.decision.groups_refused:
            return refused(K.group_authorization_failed)
        if group_id_problem(body.group_id) is not None:
            return refused(K.invalid_group_id)
        if (code := await self._not_coordinator(body.group_id)) is not None:
            return refused(code)
        answer = await self.context.backend.classic_groups.join(
            group_id=body.group_id,
            member_id=body.member_id,
            group_instance_id=getattr(body, "group_instance_id", None),
            client_id=request.client_id or "",
            client_host="",
            protocol_type=body.protocol_type,
            protocols=[(p.name, bytes(p.metadata)) for p in body.protocols],
            session_timeout_ms=ms(body.session_timeout),
            rebalance_timeout_ms=ms(getattr(body, "rebalance_timeout", body.session_timeout)),
            # KIP-394 (JoinGroup 4+): a new member first gets its id, then joins with it.
            require_known_member_id=request.api_version >= 4,
        )
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            error_code=kafka_code(answer.error),
            generation_id=answer.generation,
            protocol_type=answer.protocol_type,
            protocol_name=answer.protocol_name or ("" if request.api_version < 7 else None),
            leader=answer.leader,
            member_id=answer.member_id,
            members=tuple(
                build(member_cls, member_id=m, group_instance_id=instance, metadata=metadata)
                for m, instance, metadata in answer.members
            ),
        )

    async def sync_group(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.SYNC_GROUP, request.api_version)
        code = group_refusal(body.group_id, acl) or await self._not_coordinator(body.group_id)
        if code is not None:
            return build(cls, throttle_time=NO_THROTTLE, error_code=code, assignment=b"")
        answer = await self.context.backend.classic_groups.sync(
            group_id=body.group_id,
            member_id=body.member_id,
            generation=body.generation_id,
            assignments={a.member_id: bytes(a.assignment) for a in body.assignments},
        )
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            error_code=kafka_code(answer.error),
            protocol_type=answer.protocol_type,
            protocol_name=answer.protocol_name,
            assignment=answer.assignment,
        )

    async def heartbeat(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.HEARTBEAT, request.api_version)
        code = group_refusal(body.group_id, acl) or await self._not_coordinator(body.group_id)
        if code is None:
            error = self.context.backend.classic_groups.heartbeat(
                group_id=body.group_id, member_id=body.member_id, generation=body.generation_id
            )
            code = kafka_code(error)
        return build(cls, throttle_time=NO_THROTTLE, error_code=code)

    async def leave_group(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.LEAVE_GROUP, request.api_version)
        member_ids = [m.member_id for m in body.members] if hasattr(body, "members") else [body.member_id]
        code = group_refusal(body.group_id, acl) or await self._not_coordinator(body.group_id)
        errors = (
            [
                kafka_code(e)
                for e in self.context.backend.classic_groups.leave(
                    group_id=body.group_id, member_ids=member_ids
                )
            ]
            if code is None
            else [code] * len(member_ids)
        )
        if not hasattr(body, "members"):
            return build(cls, throttle_time=NO_THROTTLE, error_code=errors[0])
        response_cls = nested(cls, "MemberResponse")
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            error_code=code or K.none,
            members=tuple(
                build(
                    response_cls, member_id=m.member_id, group_instance_id=m.group_instance_id, error_code=e
                )
                for m, e in zip(body.members, errors, strict=True)
            ),
        )

    async def list_groups(self, request: Request, acl: RequestAcl) -> Any:
        """The classic groups this broker holds, and the groups etcd holds (committed offsets, a
        KIP-848 state) that it coordinates: clients ask every broker and merge, as in Kafka,
        where each broker lists the groups of the offsets partitions it leads."""
        body = request.body
        cls = protocol.response_class(protocol.LIST_GROUPS, request.api_version)
        listed_cls = nested(cls, "ListedGroup")
        wanted = set(getattr(body, "states_filter", ()) or ())
        listed = {
            g.group_id: (g.protocol_type or "", g.state.value)
            for g in self.context.backend.classic_groups.groups()
        }
        error = K.none
        try:
            brokers = await self.context.backend.kafka_brokers()
            for stored in await self.context.backend.stored_groups():
                me = coordinating_broker(brokers, stored.group_id)
                if me is not None and me.broker_id == self.context.backend.broker_id:
                    listed.setdefault(stored.group_id, (CONSUMER_PROTOCOL_TYPE, stored.state))
        except BackendUnavailable as exc:
            log.warning("ListGroups: %s", exc)
            error = K.coordinator_not_available
        return build(
            cls,
            throttle_time=NO_THROTTLE,
            error_code=error,
            groups=tuple(
                build(listed_cls, group_id=group_id, protocol_type=protocol_type, group_state=state)
                for group_id, (protocol_type, state) in sorted(listed.items())
                if (not wanted or state in wanted)
                and acl.allowed(authz.Operation.DESCRIBE, authz.group(group_id))
            ),
        )

    async def describe_groups(self, request: Request, acl: RequestAcl) -> Any:
        """A group this broker holds as a classic group with its members; else one etcd holds
        (committed offsets, a KIP-848 state) in its state, Empty without members, as ListGroups
        lists it; else Dead (DescribeGroups 1-5 has no GROUP_ID_NOT_FOUND)."""
        body = request.body
        cls = protocol.response_class(protocol.DESCRIBE_GROUPS, request.api_version)
        group_cls = nested(cls, "DescribedGroup")
        member_cls = nested(cls, "DescribedGroupMember")
        described = []
        for group_id in body.groups:
            code = (
                K.group_authorization_failed
                if group_id in acl.decision.groups_refused
                else group_refusal(group_id, acl) or await self._not_coordinator(group_id)
            )
            group = self.context.backend.classic_groups.group(group_id) if code is None else None
            state, protocol_type = "Dead", ""
            if group is not None:
                state, protocol_type = group.state.value, group.protocol_type or ""
            elif code is None:
                try:
                    stored = await self.context.backend.stored_groups(group_id)
                    if stored:
                        state, protocol_type = stored[0].state, CONSUMER_PROTOCOL_TYPE
                except BackendUnavailable as exc:
                    log.warning("DescribeGroups: %s", exc)
                    code = K.coordinator_not_available
            described.append(
                build(
                    group_cls,
                    error_code=code or K.none,
                    group_id=group_id,
                    group_state=state,
                    protocol_type=protocol_type,
                    protocol_data=(group.protocol_name or "") if group is not None else "",
                    members=tuple(
                        build(
                            member_cls,
                            member_id=m.member_id,
                            group_instance_id=m.group_instance_id,
                            client_id=m.client_id,
                            client_host=m.client_host,
                            member_metadata=m.metadata(group.protocol_name)
                            if group is not None and group.protocol_name
                            else b"",
                            member_assignment=m.assignment,
                        )
                        for m in (group.members.values() if group is not None else ())
                    ),
                    authorized_operations=-2147483648,
                )
            )
        return build(cls, throttle_time=NO_THROTTLE, groups=tuple(described))

    # ---- group admin: DeleteGroups, OffsetDelete (backend.py decides) -------------------------

    async def delete_groups(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.DELETE_GROUPS, request.api_version)
        result_cls = nested(cls, "DeletableGroupResult")
        results = []
        for group_id in body.groups_names:
            code = group_refusal(group_id, acl) or await self._not_coordinator(group_id)
            if code is None:
                try:
                    error, message = await self.context.backend.delete_group(group_id)
                    code = kafka_code(error)
                    if error != GroupError.NONE:
                        log.info("DeleteGroups %r refused: %s", group_id, message)
                except BackendUnavailable as exc:
                    log.warning("DeleteGroups: %s", exc)
                    code = K.coordinator_not_available
            results.append(build(result_cls, group_id=group_id, error_code=code))
        return build(cls, throttle_time=NO_THROTTLE, results=tuple(results))

    async def offset_delete(self, request: Request, acl: RequestAcl) -> Any:
        body = request.body
        cls = protocol.response_class(protocol.OFFSET_DELETE, request.api_version)
        topic_cls = nested(cls, "OffsetDeleteResponseTopic")
        part_cls = nested(cls, "OffsetDeleteResponsePartition")
        whole = group_refusal(body.group_id, acl) or await self._not_coordinator(body.group_id)
        codes: dict[tuple[str, int], K] = {}
        if whole is None:
            refused_topics = acl.decision.topics_refused
            cache = self.context.backend.metadata
            wanted: list[tuple[str, int]] = []
            for t in body.topics:
                for p in t.partitions:
                    tp = (t.name, p.partition_index)
                    if t.name in refused_topics:
                        codes[tp] = K.topic_authorization_failed
                    elif tp not in cache.partitions:
                        codes[tp] = K.unknown_topic_or_partition
                    else:
                        wanted.append(tp)
            try:
                error, message, errors = await self.context.backend.delete_offsets(body.group_id, wanted)
                if error != GroupError.NONE:
                    log.info("OffsetDelete for group %r refused: %s", body.group_id, message)
                    whole = kafka_code(error)
                codes.update((tp, kafka_code(e)) for tp, e in errors.items())
            except BackendUnavailable as exc:
                log.warning("OffsetDelete: %s", exc)
                whole = K.coordinator_not_available
        if whole is not None:
            return build(cls, error_code=whole, throttle_time=NO_THROTTLE, topics=())
        return build(
            cls,
            error_code=K.none,
            throttle_time=NO_THROTTLE,
            topics=tuple(
                build(
                    topic_cls,
                    name=t.name,
                    partitions=tuple(
                        build(
                            part_cls,
                            partition_index=p.partition_index,
                            error_code=codes[(t.name, p.partition_index)],
                        )
                        for p in t.partitions
                    ),
                )
                for t in body.topics
            ),
        )
