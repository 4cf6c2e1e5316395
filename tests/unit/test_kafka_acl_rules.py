"""Kafka's ACL rules on the Kafka listener (services/kafka/acl_rules.py), and the handler answering
what they refuse with Kafka's authorization codes (services/kafka/handler.py, fake backend)."""

from __future__ import annotations

import asyncio
import datetime
from types import SimpleNamespace as NS
from typing import Any

import pytest

from services.kafka import acl_rules, protocol
from services.kafka.acl_rules import ConnectionAccess, Decision, decide
from services.kafka.handler import KafkaHandler
from services.security.authz import CLUSTER, AclBinding, Authorizer, Operation, ResourceType, group, topic
from services.security.identity import certificate_caller
from tests.unit.test_kafka_protocol import FakeBackend, module_of, request_frame

TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31


def access(*bindings: tuple[str, str, str], principal: str = "User:alice", super_users: tuple[str, ...] = ()):
    """Access for `principal` under Allow bindings given as (operation, resource type, name)."""
    acls = [AclBinding.of(principal, op, rtype, name) for op, rtype, name in bindings]
    return ConnectionAccess(
        certificate_caller(principal[len("User:") :]), lambda: Authorizer(acls, super_users)
    )


def decided(a: ConnectionAccess, api_key: int, body: Any) -> Decision:
    return decide(api_key, body, a.allowed, a.allowed_any)


def test_every_served_api_has_a_rule():
    assert acl_rules.uncovered(protocol.SUPPORTED_VERSIONS) == set()
    with pytest.raises(ValueError, match="no ACL rule"):
        decide(57, NS(), lambda o, r: True, lambda o, t: True)


def test_produce_needs_write_fetch_read_and_offsets_describe_per_topic():
    a = access(("Write", "Topic", "orders"), ("Read", "Topic", "logs"))
    produce = NS(topic_data=[NS(name="orders"), NS(name="logs")])
    assert decided(a, protocol.PRODUCE, produce).topics_refused == {"logs"}
    fetch = NS(topics=[NS(topic="orders"), NS(topic="logs")])
    assert decided(a, protocol.FETCH, fetch).topics_refused == {"orders"}
    # Read and Write imply Describe (Kafka's rule): both may list offsets and ask epochs.
    listing = NS(topics=[NS(name="orders"), NS(name="logs"), NS(name="secret")])
    assert decided(a, protocol.LIST_OFFSETS, listing).topics_refused == {"secret"}
    epochs = NS(topics=[NS(topic="secret")])
    assert decided(a, protocol.OFFSET_FOR_LEADER_EPOCH, epochs).topics_refused == {"secret"}


def test_metadata_refuses_named_topics_and_leaves_full_listings_to_the_handler():
    a = access(("Describe", "Topic", "orders"))
    named = NS(topics=[NS(name="orders", topic_id=None), NS(name="secret", topic_id=None)])
    assert decided(a, protocol.METADATA, named).topics_refused == {"secret"}
    assert not decided(a, protocol.METADATA, NS(topics=None)).refuses_anything


def test_admin_topics_need_create_delete_alter_and_create_on_the_cluster_covers_every_topic():
    a = access(("Create", "Topic", "new"), ("Delete", "Topic", "old"), ("Alter", "Topic", "old"))
    create = NS(topics=[NS(name="new"), NS(name="other")])
    assert decided(a, protocol.CREATE_TOPICS, create).topics_refused == {"other"}
    admin = access(("Create", "Cluster", "kafka-cluster"))
    assert not decided(admin, protocol.CREATE_TOPICS, create).refuses_anything
    assert decided(a, protocol.DELETE_TOPICS, NS(topic_names=["old", "new"])).topics_refused == {"new"}
    grow = NS(topics=[NS(name="old"), NS(name="new")])
    assert decided(a, protocol.CREATE_PARTITIONS, grow).topics_refused == {"new"}
    configs = NS(resources=[NS(resource_type=2, resource_name="old"), NS(resource_type=4, resource_name="1")])
    assert decided(a, protocol.DESCRIBE_CONFIGS, configs).topics_refused == set(), "Alter implies Describe"


def test_cluster_rules_describe_cluster_and_init_producer_id():
    nobody = access()
    assert decided(nobody, protocol.DESCRIBE_CLUSTER, NS()).cluster_refused
    assert decided(nobody, protocol.INIT_PRODUCER_ID, NS()).cluster_refused
    assert not decided(access(("Describe", "Cluster", "")), protocol.DESCRIBE_CLUSTER, NS()).cluster_refused
    # Kafka 3: IdempotentWrite on the Cluster (our stand-in: Write on it) or Write on any topic.
    assert not decided(access(("Write", "Cluster", "")), protocol.INIT_PRODUCER_ID, NS()).cluster_refused
    assert not decided(access(("Write", "Topic", "x")), protocol.INIT_PRODUCER_ID, NS()).cluster_refused
    assert not decided(access(("Read", "Topic", "x")), protocol.API_VERSIONS, NS()).refuses_anything


def test_group_apis_need_read_or_describe_on_the_group_and_offsets_on_the_topic():
    a = access(("Read", "Group", "g"), ("Read", "Topic", "t"))
    for api in (protocol.JOIN_GROUP, protocol.SYNC_GROUP, protocol.HEARTBEAT, protocol.LEAVE_GROUP):
        assert not decided(a, api, NS(group_id="g")).refuses_anything
        assert decided(a, api, NS(group_id="h")).groups_refused == {"h"}
    assert decided(a, protocol.FIND_COORDINATOR, NS(coordinator_keys=["g", "h"])).groups_refused == {"h"}
    assert decided(a, protocol.FIND_COORDINATOR, NS(key="h")).groups_refused == {"h"}
    commit = NS(group_id="g", topics=[NS(name="t"), NS(name="u")])
    assert decided(a, protocol.OFFSET_COMMIT, commit) == Decision(topics_refused=frozenset({"u"}))
    fetch = NS(group_id="h", topics=None)
    assert decided(a, protocol.OFFSET_FETCH, fetch).groups_refused == {"h"}
    assert decided(a, protocol.DESCRIBE_GROUPS, NS(groups=["g", "h"])).groups_refused == {"h"}


def test_deny_wins_super_users_and_service_certificates_pass():
    acls = [
        AclBinding.of("User:*", "Write", "Topic", "*"),
        AclBinding.of("User:mallory", "Write", "Topic", "orders", permission="Deny"),
    ]
    mallory = ConnectionAccess(certificate_caller("mallory"), lambda: Authorizer(acls))
    assert mallory.allowed(Operation.WRITE, topic("logs"))
    assert not mallory.allowed(Operation.WRITE, topic("orders"))
    root = ConnectionAccess(certificate_caller("root"), lambda: Authorizer((), ["User:root"]))
    assert root.allowed(Operation.DELETE, topic("x")) and root.allowed(Operation.DESCRIBE, CLUSTER)
    broker = ConnectionAccess(certificate_caller("broker-2"), lambda: Authorizer(()))
    assert broker.allowed(Operation.READ, group("g")) and broker.allowed_any(
        Operation.WRITE, ResourceType.TOPIC
    )


def test_a_new_acl_snapshot_applies_to_an_open_connection():
    snapshot = [Authorizer(())]
    a = ConnectionAccess(certificate_caller("alice"), lambda: snapshot[0])
    assert not a.allowed(Operation.WRITE, topic("t"))
    snapshot[0] = Authorizer([AclBinding.of("User:alice", "Write", "Topic", "t")])
    assert a.allowed(Operation.WRITE, topic("t"))


# ---- the handler's answers ----------------------------------------------------------------------


def handle_as(a: ConnectionAccess, backend: FakeBackend, api_key: int, version: int, body: Any) -> Any:
    request = protocol.decode_request(request_frame(api_key, version, body))
    return asyncio.run(KafkaHandler(backend).for_connection(a).handle(request))


def test_refused_partitions_are_answered_29_and_never_written_the_rest_proceeds():
    backend = FakeBackend()
    cls = protocol.request_class(protocol.PRODUCE, 9)
    mod = module_of(cls)
    body = cls(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=1),
        topic_data=tuple(
            mod.TopicProduceData(name=name, partition_data=(mod.PartitionProduceData(index=0, records=b"b"),))
            for name in ("t", "secret")
        ),
    )
    answer = handle_as(access(("Write", "Topic", "t")), backend, protocol.PRODUCE, 9, body)
    (sent,) = backend.produced
    assert [t.topic for t in sent.topics] == ["t"], "the refused topic never reached the log"
    codes = {t.name: t.partition_responses[0].error_code for t in answer.responses}
    assert codes == {"t": 6, "secret": TOPIC_AUTHORIZATION_FAILED}

    backend = FakeBackend()
    answer = handle_as(access(), backend, protocol.PRODUCE, 9, body)
    assert backend.produced == [], "nothing allowed: the broker is not called at all"
    assert {p.error_code for t in answer.responses for p in t.partition_responses} == {
        TOPIC_AUTHORIZATION_FAILED
    }


def test_metadata_hides_topics_from_a_full_listing_and_answers_29_when_named():
    cls = protocol.request_class(protocol.METADATA, 12)
    full = protocol.build(
        cls, topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    assert handle_as(access(), FakeBackend(), protocol.METADATA, 12, full).topics == ()
    seen = handle_as(access(("Describe", "Topic", "t")), FakeBackend(), protocol.METADATA, 12, full)
    assert [t.name for t in seen.topics] == ["t"]
    named = protocol.build(
        cls,
        topics=(module_of(cls).MetadataRequestTopic(topic_id=None, name="t"),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    (refused,) = handle_as(access(), FakeBackend(), protocol.METADATA, 12, named).topics
    assert (refused.name, refused.error_code, refused.partitions) == ("t", TOPIC_AUTHORIZATION_FAILED, ())


def test_fetch_init_producer_id_and_group_refusals_carry_kafkas_codes():
    cls = protocol.request_class(protocol.FETCH, 12)
    mod = module_of(cls)
    body = protocol.build(
        cls,
        replica_id=-1,
        max_wait=datetime.timedelta(0),
        min_bytes=0,
        max_bytes=1000,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(
            mod.FetchTopic(
                topic="secret",
                partitions=(mod.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=100),),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    backend = FakeBackend()
    answer = handle_as(access(), backend, protocol.FETCH, 12, body)
    assert backend.fetched == []
    assert answer.responses[0].partitions[0].error_code == TOPIC_AUTHORIZATION_FAILED

    init = protocol.build(
        protocol.request_class(protocol.INIT_PRODUCER_ID, 4),
        transactional_id=None,
        transaction_timeout=datetime.timedelta(0),
        producer_id=-1,
        producer_epoch=-1,
    )
    assert (
        handle_as(access(), FakeBackend(), protocol.INIT_PRODUCER_ID, 4, init).error_code
        == CLUSTER_AUTHORIZATION_FAILED
    )
    assert (
        handle_as(
            access(("Write", "Topic", "t")), FakeBackend(), protocol.INIT_PRODUCER_ID, 4, init
        ).producer_id
        == 7000
    )

    find = protocol.build(
        protocol.request_class(protocol.FIND_COORDINATOR, 4), key_type=0, coordinator_keys=("g",)
    )
    (coordinator,) = handle_as(access(), FakeBackend(), protocol.FIND_COORDINATOR, 4, find).coordinators
    assert coordinator.error_code == GROUP_AUTHORIZATION_FAILED
    (coordinator,) = handle_as(
        access(("Read", "Group", "g")), FakeBackend(), protocol.FIND_COORDINATOR, 4, find
    ).coordinators
    assert coordinator.error_code == 0
