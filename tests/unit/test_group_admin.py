"""Group admin over Kafka's protocol (issue 38): DeleteGroups (42), OffsetDelete (47), negative
committed offsets, and DescribeGroups / ListGroups agreeing on a group with offsets and no
members. The pure rules (classic_groups.py, services/groups/coordinator.py), then the handler
with the real broker backend (services/kafka/backend.py) over an in-memory etcd.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Sequence
from typing import Any

from coordinator import consumer_offsets, values
from coordinator.memory_store import MemoryStore
from protos.highwater.v1 import common_pb2
from services.common.metadata_cache import MetadataCache
from services.groups import coordinator
from services.groups.coordinator import GroupState, HeartbeatRequest
from services.groups.errors import GroupError
from services.kafka import protocol
from services.kafka.acl_rules import ConnectionAccess
from services.kafka.backend import BrokerKafkaBackend
from services.kafka.classic_groups import ClassicGroups, Group, Member, State, subscribed_topics
from services.kafka.handler import KafkaBroker, KafkaHandler
from services.security.authz import AclBinding, Authorizer
from services.security.identity import certificate_caller
from tests.unit.test_kafka_protocol import module_of, request_frame

# Kafka's error numbers the answers carry.
NONE, TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED = 0, 29, 30
NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND, GROUP_SUBSCRIBED_TO_TOPIC = 68, 69, 86
UNKNOWN_TOPIC_OR_PARTITION = 3


def subscription(*topics: str) -> bytes:
    """A ConsumerProtocolSubscription v0, as Kafka's consumers put in their member metadata."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)  # no user data


def live_classic_group(group_id: str, *topics: str, protocol_type: str = "consumer") -> Group:
    member = Member(
        member_id="m-1",
        group_instance_id=None,
        client_id="c",
        client_host="",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        protocols=[("range", subscription(*topics))],
        last_heard_ms=0,
    )
    return Group(
        group_id,
        state=State.STABLE,
        generation=1,
        protocol_type=protocol_type,
        protocol_name="range",
        leader="m-1",
        members={"m-1": member},
    )


def kip848_group_with_member(group_id: str, topic: str) -> GroupState:
    state, answer = coordinator.heartbeat(
        GroupState(group_id=group_id),
        HeartbeatRequest(
            member_id="", member_epoch=coordinator.EPOCH_JOIN, subscribed_topics=frozenset({topic})
        ),
        {topic: 2},
        "member-1",
    )
    assert answer.error is None
    return state


# ---- the pure rules -------------------------------------------------------------------------


def test_classic_delete_refuses_a_group_with_members_and_forgets_an_empty_one() -> None:
    groups = ClassicGroups(1)
    assert groups.delete("g") == GroupError.GROUP_ID_NOT_FOUND
    groups.groups["g"] = live_classic_group("g", "t")
    assert groups.delete("g") == GroupError.NON_EMPTY_GROUP
    assert "g" in groups.groups
    groups.leave(0, group_id="g", member_ids=["m-1"])
    assert groups.groups["g"].state == State.EMPTY
    assert groups.delete("g") == GroupError.NONE
    assert "g" not in groups.groups


def test_classic_subscribed_topics_read_from_the_consumer_protocol_metadata() -> None:
    assert subscribed_topics(live_classic_group("g", "a", "b")) == frozenset({"a", "b"})
    assert subscribed_topics(live_classic_group("g", "a", protocol_type="connect")) is None, "not a consumer"
    broken = live_classic_group("g", "a")
    broken.members["m-1"].protocols = [("range", b"\x00\x00\x00\x00\x00\x05ab")]
    assert subscribed_topics(broken) is None, "unreadable metadata: unknown, so every topic counts"


def test_kip848_group_is_deletable_only_without_members_and_names_its_subscriptions() -> None:
    assert coordinator.deletable(GroupState(group_id="g"))
    state = kip848_group_with_member("g", "t")
    assert not coordinator.deletable(state)
    assert coordinator.subscribed_topics(state) == {"t"}
    left, _ = coordinator.expire(state, "member-1")
    assert coordinator.deletable(left) and coordinator.subscribed_topics(left) == frozenset()


# ---- the handler with the broker's backend over an in-memory etcd -----------------------------


class _Replicas:
    def __init__(self) -> None:
        self.metadata = MetadataCache(
            partitions={
                (t, p): common_pb2.PartitionState(topic=t, partition=p, leader=1, leader_epoch=1)
                for t in ("t", "u")
                for p in (0, 1)
            }
        )


class OneBrokerBackend(BrokerKafkaBackend):
    """The real backend; the broker list is this one broker (so it coordinates every group)."""

    async def kafka_brokers(self) -> list[KafkaBroker]:
        return [KafkaBroker(1, "127.0.0.1", 19092, "")]


def new_backend() -> tuple[OneBrokerBackend, MemoryStore]:
    store = MemoryStore()
    return OneBrokerBackend(1, _Replicas(), store, None), store  # type: ignore[arg-type]


def call(backend: OneBrokerBackend, api_key: int, version: int, body: Any, access: Any = None) -> Any:
    handler = KafkaHandler(backend)
    if access is not None:
        handler = handler.for_connection(access)
    return asyncio.run(handler.handle(protocol.decode_request(request_frame(api_key, version, body))))


def commit(
    backend: OneBrokerBackend, group: str, offsets: dict[tuple[str, int], int], **member: Any
) -> list[int]:
    cls = protocol.request_class(protocol.OFFSET_COMMIT, 8)
    mod = module_of(cls)
    by_topic: dict[str, list[Any]] = {}
    for (t, p), offset in offsets.items():
        by_topic.setdefault(t, []).append(
            mod.OffsetCommitRequestPartition(
                partition_index=p, committed_offset=offset, committed_metadata=""
            )
        )
    body = cls(
        group_id=group,
        generation_id_or_member_epoch=member.get("generation", -1),
        member_id=member.get("member_id", ""),
        topics=tuple(
            mod.OffsetCommitRequestTopic(name=t, partitions=tuple(ps)) for t, ps in by_topic.items()
        ),
    )
    answer = call(backend, protocol.OFFSET_COMMIT, 8, body)
    return [p.error_code for t in answer.topics for p in t.partitions]


def stored(store: MemoryStore, group: str) -> dict[tuple[str, int], int]:
    held = asyncio.run(consumer_offsets.committed_offsets(store, group))
    return {tp: int(v["offset"]) for tp, v in held.items()}


def delete_groups(backend: OneBrokerBackend, *groups: str, access: Any = None) -> list[int]:
    cls = protocol.request_class(protocol.DELETE_GROUPS, 2)
    answer = call(backend, protocol.DELETE_GROUPS, 2, cls(groups_names=tuple(groups)), access)
    assert [r.group_id for r in answer.results] == list(groups)
    return [r.error_code for r in answer.results]


def offset_delete(
    backend: OneBrokerBackend, group: str, tps: Sequence[tuple[str, int]], access: Any = None
) -> tuple[int, dict[tuple[str, int], int]]:
    cls = protocol.request_class(protocol.OFFSET_DELETE, 0)
    mod = module_of(cls)
    by_topic: dict[str, list[Any]] = {}
    for t, p in tps:
        by_topic.setdefault(t, []).append(mod.OffsetDeleteRequestPartition(partition_index=p))
    body = cls(
        group_id=group,
        topics=tuple(
            mod.OffsetDeleteRequestTopic(name=t, partitions=tuple(ps)) for t, ps in by_topic.items()
        ),
    )
    answer = call(backend, protocol.OFFSET_DELETE, 0, body, access)
    return answer.error_code, {
        (t.name, p.partition_index): p.error_code for t in answer.topics for p in t.partitions
    }


def put_kip848_state(store: MemoryStore, state: GroupState) -> None:
    record = json.dumps(state.to_record()).encode()
    asyncio.run(store.put(store.keys.consumer_group_state(state.group_id), record))


def test_negative_offsets_are_stored_as_given_and_fetched_back_as_kafka_does() -> None:
    backend, store = new_backend()
    backend.classic_groups.core.groups["g"] = live_classic_group("g", "t")
    assert commit(backend, "g", {("t", 0): -2, ("t", 1): -1}, generation=1, member_id="m-1") == [NONE, NONE]
    assert commit(backend, "h", {("t", 0): -2}) == [NONE], "a commit from outside: an admin's reset"
    assert stored(store, "g") == {("t", 0): -2, ("t", 1): -1}
    cls = protocol.request_class(protocol.OFFSET_FETCH, 7)
    answer = call(backend, protocol.OFFSET_FETCH, 7, cls(group_id="h", topics=None, require_stable=False))
    assert [(t.name, p.partition_index, p.committed_offset) for t in answer.topics for p in t.partitions] == [
        ("t", 0, -2)
    ], "handed back as stored: the client resets per its auto.offset.reset"


def test_delete_groups_deletes_an_empty_group_and_refuses_a_live_or_unknown_one() -> None:
    backend, store = new_backend()
    assert commit(backend, "idle", {("t", 0): 5}) == [NONE]
    backend.classic_groups.core.groups["busy"] = live_classic_group("busy", "t")
    assert commit(backend, "busy", {("t", 0): 3}, generation=1, member_id="m-1") == [NONE]
    put_kip848_state(store, kip848_group_with_member("gateway-group", "t"))

    codes = delete_groups(backend, "idle", "busy", "gateway-group", "nobody")
    assert codes == [NONE, NON_EMPTY_GROUP, NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND]
    assert stored(store, "idle") == {}
    assert asyncio.run(consumer_offsets.read_group(store, "idle")) is None, "every key of it gone"
    assert stored(store, "busy") == {("t", 0): 3}, "a refused group keeps its offsets"
    assert delete_groups(backend, "idle") == [GROUP_ID_NOT_FOUND], "deleted once"


def test_offset_delete_spares_the_topics_a_live_group_subscribes_to() -> None:
    backend, store = new_backend()
    backend.classic_groups.core.groups["g"] = live_classic_group("g", "t")
    assert commit(backend, "g", {("t", 0): 1, ("u", 0): 2}, generation=1, member_id="m-1") == [NONE, NONE]
    error, codes = offset_delete(backend, "g", [("t", 0), ("u", 0), ("u", 7)])
    assert error == NONE
    assert codes == {
        ("t", 0): GROUP_SUBSCRIBED_TO_TOPIC,
        ("u", 0): NONE,
        ("u", 7): UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert stored(store, "g") == {("t", 0): 1}

    backend.classic_groups.core.groups["g"] = live_classic_group("g", "t", protocol_type="connect")
    assert offset_delete(backend, "g", [("u", 0)])[0] == NON_EMPTY_GROUP, "not a consumer group"

    put_kip848_state(store, kip848_group_with_member("k", "t"))
    asyncio.run(
        store.put(store.keys.consumer_offset("k", "u", 1), values.encode_consumer_offset(4, "", -1, 0))
    )
    assert offset_delete(backend, "k", [("t", 1), ("u", 1)]) == (
        NONE,
        {("t", 1): GROUP_SUBSCRIBED_TO_TOPIC, ("u", 1): NONE},
    )
    assert offset_delete(backend, "nobody", [("t", 0)])[0] == GROUP_ID_NOT_FOUND


def test_offset_delete_of_an_empty_group_deletes_every_named_offset() -> None:
    backend, store = new_backend()
    assert commit(backend, "g", {("t", 0): 1, ("t", 1): 2}) == [NONE, NONE]
    assert offset_delete(backend, "g", [("t", 0)]) == (NONE, {("t", 0): NONE})
    assert stored(store, "g") == {("t", 1): 2}


def test_describe_and_list_agree_on_a_group_with_offsets_and_no_members() -> None:
    backend, _ = new_backend()
    assert commit(backend, "idle", {("t", 0): 5}) == [NONE]
    describe = protocol.request_class(protocol.DESCRIBE_GROUPS, 5)
    answer = call(
        backend,
        protocol.DESCRIBE_GROUPS,
        5,
        describe(groups=("idle", "nobody"), include_authorized_operations=False),
    )
    assert [(g.group_id, g.error_code, g.group_state) for g in answer.groups] == [
        ("idle", NONE, "Empty"),
        ("nobody", NONE, "Dead"),
    ]
    assert answer.groups[0].protocol_type == "consumer"
    listing = protocol.request_class(protocol.LIST_GROUPS, 4)
    listed = call(backend, protocol.LIST_GROUPS, 4, listing(states_filter=()))
    assert [(g.group_id, g.group_state, g.protocol_type) for g in listed.groups] == [
        ("idle", "Empty", "consumer")
    ]
    only_stable = call(backend, protocol.LIST_GROUPS, 4, listing(states_filter=("Stable",)))
    assert only_stable.groups == ()


def test_group_admin_needs_delete_on_the_group_and_read_on_the_topic() -> None:
    backend, store = new_backend()
    assert commit(backend, "g", {("t", 0): 1, ("u", 0): 2}) == [NONE, NONE]
    acls = [
        AclBinding.of("User:alice", "Describe", "Group", "g"),
        AclBinding.of("User:bob", "Delete", "Group", "g"),
        AclBinding.of("User:bob", "Read", "Topic", "t"),
    ]
    alice = ConnectionAccess(certificate_caller("alice"), lambda: Authorizer(acls))
    bob = ConnectionAccess(certificate_caller("bob"), lambda: Authorizer(acls))
    assert delete_groups(backend, "g", access=alice) == [GROUP_AUTHORIZATION_FAILED]
    assert offset_delete(backend, "g", [("t", 0)], access=alice)[0] == GROUP_AUTHORIZATION_FAILED
    assert offset_delete(backend, "g", [("t", 0), ("u", 0)], access=bob) == (
        NONE,
        {("t", 0): NONE, ("u", 0): TOPIC_AUTHORIZATION_FAILED},
    )
    assert stored(store, "g") == {("u", 0): 2}
    assert delete_groups(backend, "g", access=bob) == [NONE]
