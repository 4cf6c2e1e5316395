"""The security layer's pure parts: the ACL authorizer, quotas, tokens, identities and per-RPC rules.

No sockets, no etcd: each rule gets a request and an Access and must say what
the servicer may see and what the caller gets back (docs/SECURITY.md).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from protos.highwater.v1 import broker_pb2, common_pb2, controller_pb2, gateway_pb2
from services.security import rules, tokens
from services.security.authz import (
    CLUSTER,
    AclBinding,
    AclError,
    Authorizer,
    Operation,
    ResourceType,
    group,
    parse_super_users,
    topic,
)
from services.security.identity import Caller, ServiceIdentity, is_reserved_principal, parse_service_name
from services.security.quotas import QuotaKind, QuotaManager
from tests.python_source import parse_python

ROOT = Path(__file__).resolve().parents[2]


def acl(principal: str, op: str, rtype: str, name: str, **kw: str) -> AclBinding:
    return AclBinding.of(principal, op, rtype, name, **kw)  # type: ignore[arg-type]


# --- the authorizer ---------------------------------------------------------------------------


def test_no_acl_means_no_access_and_super_users_may_do_everything() -> None:
    authz = Authorizer([], super_users=["User:admin"])
    assert not authz.authorize("User:alice", Operation.READ, topic("orders"))
    assert authz.authorize("User:admin", Operation.DELETE, topic("orders"))
    assert authz.authorize("User:admin", Operation.ALTER, CLUSTER)


def test_literal_prefixed_and_wildcard_patterns() -> None:
    authz = Authorizer(
        [
            acl("User:alice", "Read", "Topic", "orders"),
            acl("User:alice", "Write", "Topic", "logs-", pattern_type="Prefixed"),
            acl("User:*", "Read", "Topic", "public"),
            acl("User:bob", "Read", "Topic", "*"),
        ]
    )
    assert authz.authorize("User:alice", Operation.READ, topic("orders"))
    assert not authz.authorize("User:alice", Operation.READ, topic("orders2")), "a literal is not a prefix"
    assert authz.authorize("User:alice", Operation.WRITE, topic("logs-app"))
    assert not authz.authorize("User:alice", Operation.WRITE, topic("log"))
    assert authz.authorize("User:carol", Operation.READ, topic("public"))
    assert authz.authorize("User:bob", Operation.READ, topic("anything"))
    assert not authz.authorize("User:bob", Operation.WRITE, topic("anything"))
    assert not authz.authorize("User:alice", Operation.READ, group("orders")), "resource types do not mix"


def test_deny_wins_over_allow_whatever_the_pattern() -> None:
    authz = Authorizer(
        [
            acl("User:alice", "All", "Topic", "*"),
            acl("User:alice", "Write", "Topic", "secret-", pattern_type="Prefixed", permission="Deny"),
            acl("User:*", "Read", "Topic", "payroll", permission="Deny"),
        ]
    )
    assert authz.authorize("User:alice", Operation.WRITE, topic("orders"))
    assert not authz.authorize("User:alice", Operation.WRITE, topic("secret-plans"))
    assert authz.authorize("User:alice", Operation.READ, topic("secret-plans")), "deny is per operation"
    assert not authz.authorize("User:alice", Operation.READ, topic("payroll")), (
        "a wildcard deny applies to all"
    )


def test_read_write_delete_alter_imply_describe_but_a_deny_only_denies_its_operation() -> None:
    authz = Authorizer(
        [
            acl("User:alice", "Write", "Topic", "orders"),
            acl("User:bob", "Read", "Topic", "orders"),
            acl("User:bob", "Describe", "Topic", "orders", permission="Deny"),
        ]
    )
    assert authz.authorize("User:alice", Operation.DESCRIBE, topic("orders"))
    assert not authz.authorize("User:alice", Operation.READ, topic("orders"))
    assert not authz.authorize("User:bob", Operation.DESCRIBE, topic("orders"))
    assert authz.authorize("User:bob", Operation.READ, topic("orders"))


def test_authorize_any_finds_write_on_some_topic_unless_denied_everywhere() -> None:
    authz = Authorizer(
        [
            acl("User:alice", "Write", "Topic", "logs-", pattern_type="Prefixed"),
            acl("User:bob", "Write", "Topic", "x"),
            acl("User:bob", "Write", "Topic", "*", permission="Deny"),
        ]
    )
    assert authz.authorize_any("User:alice", Operation.WRITE, ResourceType.TOPIC)
    assert not authz.authorize_any("User:bob", Operation.WRITE, ResourceType.TOPIC)
    assert not authz.authorize_any("User:carol", Operation.WRITE, ResourceType.TOPIC)


def test_bindings_are_checked_when_built_and_round_trip_through_their_stored_form() -> None:
    b = acl("User:alice", "read", "topic", "orders", pattern_type="prefixed", permission="deny")
    assert AclBinding.from_dict(b.to_dict()) == b
    assert acl("User:ops", "Alter", "Cluster", "ignored").resource_name == CLUSTER.name
    for bad in [
        ("alice", "Read", "Topic", "t"),
        ("User:alice", "Fly", "Topic", "t"),
        ("User:alice", "Read", "Table", "t"),
        ("User:alice", "Read", "Topic", ""),
    ]:
        with pytest.raises(AclError):
            acl(*bad)
    with pytest.raises(AclError):
        acl("User:alice", "Read", "Topic", "*", pattern_type="Prefixed")
    with pytest.raises(AclError):
        AclBinding.from_dict({"principal": "User:alice"})
    assert parse_super_users("User:a; User:b,User:c") == ("User:a", "User:b", "User:c")
    with pytest.raises(AclError):
        parse_super_users("admin")


# --- quotas ---------------------------------------------------------------------------------


def test_quota_throttles_once_the_burst_is_spent_for_exactly_the_debt() -> None:
    q = QuotaManager(produce_bytes_per_s=1000)
    assert q.record("User:a", QuotaKind.PRODUCE, 1000, now_ms=0) == 0, "one second of burst is free"
    assert q.record("User:a", QuotaKind.PRODUCE, 500, now_ms=0) == 500
    assert q.delay_ms("User:a", QuotaKind.PRODUCE, now_ms=100) == 400
    assert q.record("User:b", QuotaKind.PRODUCE, 1000, now_ms=0) == 0, "principals have their own buckets"
    assert q.record("User:a", QuotaKind.PRODUCE, 0, now_ms=500) == 0
    assert q.record("User:a", QuotaKind.PRODUCE, 1, now_ms=500) == 1, "the debt is paid back at the rate"
    assert q.record("User:a", QuotaKind.FETCH, 10**9, now_ms=0) == 0, "fetch quota off: unlimited"


def test_quota_rate_over_time_converges_to_the_limit_when_clients_obey_throttles() -> None:
    q = QuotaManager(fetch_bytes_per_s=10_000)
    now = sent = 0
    while now < 60_000:
        sent += 4_000
        now += 1 + q.record("User:a", QuotaKind.FETCH, 4_000, now)
    assert 9_500 <= sent / (now / 1000) <= 10_500 + 10_000 / 60


def test_quota_buckets_are_bounded() -> None:
    q = QuotaManager(produce_bytes_per_s=10, principals_max=3)
    for i in range(10):
        q.record(f"User:{i}", QuotaKind.PRODUCE, 5, now_ms=i)
    assert len(q._buckets) == 3


# --- tokens and identities ------------------------------------------------------------------


def test_a_token_verifies_until_it_expires_and_only_with_its_secret() -> None:
    text, token_id, record = tokens.new_token("User:alice", now_ms=1_000, expires_in_ms=60_000)
    parsed = tokens.parse_token(text)
    assert parsed is not None and parsed[0] == token_id
    secret = parsed[1]
    assert secret not in str(record.to_dict()), "only a salted hash is stored"
    stored = tokens.TokenRecord.from_dict(record.to_dict())
    assert tokens.verify(stored, secret, now_ms=2_000) == "User:alice"
    assert tokens.verify(stored, secret + "x", now_ms=2_000) is None
    assert tokens.verify(stored, secret, now_ms=61_000) is None, "expired"
    assert tokens.verify(None, secret, now_ms=2_000) is None, "revoked (no record)"
    assert tokens.parse_token("hwt.only-two") is None
    assert tokens.parse_token("x" * 1000) is None
    assert tokens.bearer_value("Bearer abc") == "abc"
    assert tokens.bearer_value("Basic abc") is None


def test_service_names_are_reserved_for_certificates() -> None:
    assert parse_service_name("broker-3") == ServiceIdentity("broker", 3)
    assert parse_service_name("controller") == ServiceIdentity("controller", None)
    assert parse_service_name("gateway-1") == ServiceIdentity("gateway", 1)
    for other in ("broker", "broker-x", "alice", "broker-1-evil", "gateway-"):
        assert parse_service_name(other) is None
    assert is_reserved_principal("User:controller-1")
    with pytest.raises(tokens.TokenError):
        tokens.new_token("User:broker-1", now_ms=0)


# --- per-RPC rules ---------------------------------------------------------------------------


ALICE = Caller("User:alice", authenticated_by="certificate")
CONTROLLER = Caller("User:controller-1", service=ServiceIdentity("controller", 1))
BROKER_2 = Caller("User:broker-2", service=ServiceIdentity("broker", 2))
AUTHZ = Authorizer(
    [
        acl("User:alice", "Write", "Topic", "ok"),
        acl("User:alice", "Read", "Topic", "ok"),
        acl("User:alice", "Read", "Group", "g"),
    ]
)
LIMITS = rules.Limits()


def access(caller: Caller = ALICE, authorizer: Authorizer | None = AUTHZ) -> rules.Access:
    return rules.Access(caller, authorizer, identities_checked=True)


def batch(records: int) -> bytes:
    from clients.common.records import Record, encode_batch

    return encode_batch([Record(None, b"v", [], 0) for _ in range(records)])


def produce_request(*topics: str) -> common_pb2.ProduceRequest:
    return common_pb2.ProduceRequest(
        acks=-1,
        timeout_ms=100,
        topics=[
            common_pb2.ProduceTopicData(
                topic=t,
                partitions=[common_pb2.ProducePartitionData(partition=p, records=batch(1)) for p in (0, 1)],
            )
            for t in topics
        ],
    )


def test_produce_keeps_authorized_partitions_and_answers_the_rest_with_topic_authorization_failed() -> None:
    req = produce_request("ok", "no")
    admission = rules.produce(req, access(), LIMITS)
    assert [t.topic for t in admission.request.topics] == ["ok"], "the servicer never sees the refused topic"
    resp = common_pb2.ProduceResponse(
        topics=[
            common_pb2.ProduceTopicResponse(
                topic="ok",
                partitions=[
                    common_pb2.ProducePartitionResponse(partition=0),
                    common_pb2.ProducePartitionResponse(partition=1),
                ],
            )
        ]
    )
    merged = admission.respond(resp)
    codes = {(t.topic, p.partition): p.error_code for t in merged.topics for p in t.partitions}
    assert codes == {
        ("ok", 0): 0,
        ("ok", 1): 0,
        ("no", 0): common_pb2.TOPIC_AUTHORIZATION_FAILED,
        ("no", 1): common_pb2.TOPIC_AUTHORIZATION_FAILED,
    }


def test_produce_to_only_refused_topics_is_answered_without_the_servicer() -> None:
    admission = rules.produce(produce_request("no"), access(), LIMITS)
    assert admission.answer is not None
    assert {p.error_code for t in admission.answer.topics for p in t.partitions} == {
        common_pb2.TOPIC_AUTHORIZATION_FAILED
    }


def test_produce_untouched_when_everything_is_allowed_and_batches_over_the_record_limit_are_refused() -> None:
    req = produce_request("ok")
    assert rules.produce(req, access(), LIMITS).request is req
    assert rules.produce(produce_request("no"), access(authorizer=None), LIMITS).answer is None, "ACLs off"
    big = common_pb2.ProduceRequest(
        topics=[
            common_pb2.ProduceTopicData(
                topic="ok",
                partitions=[
                    common_pb2.ProducePartitionData(partition=0, records=batch(11)),
                    common_pb2.ProducePartitionData(partition=1, records=batch(10)),
                ],
            )
        ]
    )
    admission = rules.produce(big, access(), rules.Limits(max_batch_records=10))
    assert [p.partition for p in admission.request.topics[0].partitions] == [1]
    merged = admission.respond(common_pb2.ProduceResponse())
    assert merged.topics[0].partitions[0].error_code == common_pb2.INVALID_REQUEST


def test_fetch_filters_topics_and_replica_fetches_need_that_brokers_certificate() -> None:
    req = common_pb2.FetchRequest(
        replica_id=-1,
        topics=[
            common_pb2.FetchTopic(topic="ok", partitions=[common_pb2.FetchPartition(partition=0)]),
            common_pb2.FetchTopic(topic="no", partitions=[common_pb2.FetchPartition(partition=0)]),
        ],
    )
    admission = rules.fetch(req, access(), LIMITS)
    assert [t.topic for t in admission.request.topics] == ["ok"]
    follower = common_pb2.FetchRequest(replica_id=2)
    assert rules.fetch(follower, access(BROKER_2), LIMITS).request is follower
    for caller in (ALICE, CONTROLLER, Caller("User:broker-3", service=ServiceIdentity("broker", 3))):
        with pytest.raises(rules.Denied) as denied:
            rules.fetch(follower, access(caller), LIMITS)
        assert denied.value.code == "PERMISSION_DENIED"


def test_control_rpcs_only_from_the_controller_and_broker_rpcs_only_from_the_named_broker() -> None:
    lai = rules.RULES["/highwater.v1.BrokerService/LeaderAndIsr"]
    assert lai(broker_pb2.LeaderAndIsrRequest(), access(CONTROLLER), LIMITS).answer is None
    for caller in (ALICE, BROKER_2, Caller("User:alice", forwarded_by=ServiceIdentity("gateway", 1))):
        with pytest.raises(rules.Denied):
            lai(broker_pb2.LeaderAndIsrRequest(), access(caller), LIMITS)
    alter = rules.RULES["/highwater.v1.ControllerService/AlterPartition"]
    alter(controller_pb2.AlterPartitionRequest(broker_id=2), access(BROKER_2), LIMITS)
    with pytest.raises(rules.Denied):
        alter(controller_pb2.AlterPartitionRequest(broker_id=1), access(BROKER_2), LIMITS)
    plaintext = rules.Access(ALICE, None, identities_checked=False)
    lai(broker_pb2.LeaderAndIsrRequest(), plaintext, LIMITS)  # no TLS: no identities to check, as before


def test_metadata_hides_unauthorized_topics_unless_named() -> None:
    resp = common_pb2.MetadataResponse(
        topics=[common_pb2.TopicMetadata(name="ok"), common_pb2.TopicMetadata(name="no")]
    )
    listed = rules.metadata(common_pb2.MetadataRequest(), access(), LIMITS).respond(resp)
    assert [t.name for t in listed.topics] == ["ok"]
    resp = common_pb2.MetadataResponse(
        topics=[common_pb2.TopicMetadata(name="no", partitions=[common_pb2.PartitionMetadata(partition=0)])]
    )
    named = rules.metadata(common_pb2.MetadataRequest(topics=["no"]), access(), LIMITS).respond(resp)
    assert (
        named.topics[0].error_code == common_pb2.TOPIC_AUTHORIZATION_FAILED and not named.topics[0].partitions
    )


def test_admin_calls_are_per_topic_or_cluster_wide() -> None:
    create = common_pb2.CreateTopicsRequest(topics=[common_pb2.CreatableTopic(name="a")])
    answer = rules.create_topics(create, access(), LIMITS).answer
    assert answer.topics[0].error_code == common_pb2.TOPIC_AUTHORIZATION_FAILED
    creator = Authorizer([acl("User:alice", "Create", "Cluster", "x")])
    assert rules.create_topics(create, access(authorizer=creator), LIMITS).answer is None
    with pytest.raises(rules.Denied):
        rules.RULES["/highwater.v1.GatewayService/ElectLeaders"](
            common_pb2.ElectLeadersRequest(), access(), LIMITS
        )
    with pytest.raises(rules.Denied):
        rules.commit_offsets(gateway_pb2.CommitOffsetsRequest(group_id="other"), access(), LIMITS)
    commit = gateway_pb2.CommitOffsetsRequest(
        group_id="g",
        topics=[
            gateway_pb2.OffsetCommitTopic(
                topic="no", partitions=[gateway_pb2.OffsetCommitPartition(partition=0)]
            )
        ],
    )
    assert (
        rules.commit_offsets(commit, access(), LIMITS).answer.partitions[0].error_code
        == common_pb2.TOPIC_AUTHORIZATION_FAILED
    )
    rules.init_producer_id(common_pb2.InitProducerIdRequest(), access(), LIMITS)
    with pytest.raises(rules.Denied):
        rules.init_producer_id(common_pb2.InitProducerIdRequest(), access(authorizer=Authorizer()), LIMITS)


SECURITY_ADMIN = {
    "CreateAcls": (controller_pb2.CreateAclsRequest(), "Alter"),
    "DeleteAcls": (controller_pb2.DeleteAclsRequest(), "Alter"),
    "CreateToken": (controller_pb2.CreateTokenRequest(principal="User:alice"), "Alter"),
    "RevokeToken": (controller_pb2.RevokeTokenRequest(token_id="ab"), "Alter"),
    "DescribeAcls": (controller_pb2.DescribeAclsRequest(), "Describe"),
    "ListTokens": (controller_pb2.ListTokensRequest(), "Describe"),
}


@pytest.mark.parametrize("service", ["ControllerService", "GatewayService"])
@pytest.mark.parametrize("method", sorted(SECURITY_ADMIN))
def test_acl_and_token_admin_needs_alter_or_describe_on_the_cluster(service: str, method: str) -> None:
    """Kafka's rules: altering ACLs and tokens needs Alter on the Cluster, describing them Describe;
    ACLs on topics (even All on every topic) grant nothing here; super users and services may."""
    request, needed = SECURITY_ADMIN[method]
    rule = rules.RULES[f"/highwater.v1.{service}/{method}"]
    everything_but_the_cluster = Authorizer(
        [
            acl("User:alice", "All", "Topic", "*"),
            acl("User:alice", "All", "Group", "*"),
            acl("User:alice", "Create", "Cluster", "x"),
        ]
    )
    for authorizer in (Authorizer(), everything_but_the_cluster):
        with pytest.raises(rules.Denied) as denied:
            rule(request, access(authorizer=authorizer), LIMITS)
        assert denied.value.code == "PERMISSION_DENIED" and method in denied.value.message
    granted = Authorizer([acl("User:alice", needed, "Cluster", "x")])
    assert rule(request, access(authorizer=granted), LIMITS).request is request
    if needed == "Describe":  # Alter implies Describe, as in Kafka
        assert (
            rule(
                request, access(authorizer=Authorizer([acl("User:alice", "Alter", "Cluster", "x")])), LIMITS
            ).request
            is request
        )
    else:  # Describe alone does not let one change anything
        with pytest.raises(rules.Denied):
            rule(
                request,
                access(authorizer=Authorizer([acl("User:alice", "Describe", "Cluster", "x")])),
                LIMITS,
            )
    denied_alter = Authorizer(
        [
            acl("User:alice", "All", "Cluster", "x"),
            acl("User:alice", needed, "Cluster", "x", permission="Deny"),
        ]
    )
    with pytest.raises(rules.Denied):
        rule(request, access(authorizer=denied_alter), LIMITS)
    assert rule(request, access(authorizer=Authorizer((), ["User:alice"])), LIMITS).request is request
    assert rule(request, access(CONTROLLER, Authorizer()), LIMITS).request is request


def test_security_admin_calls_carry_the_clients_principal_to_the_controller() -> None:
    """Were they not forwarded, the controller would see the gateway's certificate: a service, which
    may do everything, so anyone reaching a gateway could grant itself anything."""
    for method in SECURITY_ADMIN:
        assert f"/highwater.v1.ControllerService/{method}" in rules.FORWARDED_METHODS


def test_acl_filters_match_a_principal_and_everyone_and_patterns_that_cover_a_resource() -> None:
    from services.security.authz import AclError, AclFilter

    bindings = [
        acl("User:alice", "Read", "Topic", "orders"),
        acl("User:*", "Read", "Topic", "ord", pattern_type="Prefixed"),
        acl("User:bob", "Read", "Topic", "*"),
        acl("User:alice", "Read", "Group", "orders"),
        acl("User:ops", "Alter", "Cluster", "x"),
    ]

    def names(f: AclFilter) -> list[str]:
        return [f"{b.principal} {b.resource_type.value}:{b.resource_name}" for b in bindings if f.matches(b)]

    assert names(AclFilter.of()) == names(AclFilter()) and len(names(AclFilter.of())) == 5
    assert names(AclFilter.of("User:alice")) == [
        "User:alice Topic:orders",
        "User:* Topic:ord",
        "User:alice Group:orders",
    ]
    assert names(AclFilter.of("", "Topic", "orders")) == [
        "User:alice Topic:orders",
        "User:* Topic:ord",
        "User:bob Topic:*",
    ]
    assert names(AclFilter.of("", "topic", "other")) == ["User:bob Topic:*"]
    assert names(AclFilter.of("", "Group")) == ["User:alice Group:orders"]
    assert names(AclFilter.of("User:ops", "Cluster")) == ["User:ops Cluster:highwater-cluster"]
    for bad in (("alice", "", ""), ("", "Table", ""), ("", "", "orders")):
        with pytest.raises(AclError):
            AclFilter.of(*bad)


def test_token_ids_are_read_from_a_whole_token_or_alone() -> None:
    text, token_id, _ = tokens.new_token("User:bob", now_ms=0)
    assert tokens.token_id_of(text) == token_id and tokens.token_id_of(token_id) == token_id
    for bad in ("", "hwt..x", "a/b", "x" * 65, "../etc", "é"):
        assert tokens.token_id_of(bad) is None, bad
    with pytest.raises(tokens.TokenError):
        tokens.new_token("User:bob", now_ms=0, expires_in_ms=tokens.TOKEN_LIFETIME_MS_MAX + 1)


def test_every_rpc_of_every_service_has_a_rule() -> None:
    methods = {
        f"/{svc.full_name}/{m.name}"
        for module in (broker_pb2, controller_pb2, gateway_pb2)
        for svc in module.DESCRIPTOR.services_by_name.values()
        for m in svc.methods
    }
    assert methods - set(rules.RULES) == set()
    assert set(rules.RULES) >= rules.FORWARDED_METHODS


def test_unary_over_stream_methods_are_streams_of_their_unary_methods_messages_with_its_rule() -> None:
    methods = {
        f"/{svc.full_name}/{m.name}": m
        for module in (broker_pb2, controller_pb2, gateway_pb2)
        for svc in module.DESCRIPTOR.services_by_name.values()
        for m in svc.methods
    }
    assert rules.UNARY_OVER_STREAM, "FetchStream at least"
    for stream, unary in rules.UNARY_OVER_STREAM.items():
        s, u = methods[stream], methods[unary]
        assert s.client_streaming and s.server_streaming, stream
        assert not u.client_streaming and not u.server_streaming, unary
        assert (s.input_type, s.output_type) == (u.input_type, u.output_type), stream
        assert rules.rule_for(stream) is rules.rule_for(unary) is rules.RULES[stream], stream


@pytest.mark.parametrize(
    "module",
    [
        "services/security/authz.py",
        "services/security/quotas.py",
        "services/security/identity.py",
        "services/security/tokens.py",
    ],
)
def test_decision_modules_stay_pure(module: str) -> None:
    tree = parse_python((ROOT / module).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"grpc", "etcd3aio", "asyncio", "coordinator", "time", "socket", "threading"}


# --- the per-connection limiter -----------------------------------------------------------------


@pytest.mark.asyncio
async def test_connection_limiter_queues_in_order_and_refuses_beyond_its_queue() -> None:
    import asyncio

    from services.security.interceptor import WAITING_PER_SLOT_MAX, ConnectionLimiter

    limiter = ConnectionLimiter(2)
    assert await limiter.acquire("a") and await limiter.acquire("a")
    assert await limiter.acquire("b"), "connections are counted apart"
    waiting = [asyncio.ensure_future(limiter.acquire("a")) for _ in range(2 * WAITING_PER_SLOT_MAX)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiting)
    assert not await limiter.acquire("a"), "the queue is bounded"
    waiting[0].cancel()
    await asyncio.sleep(0)
    limiter.release("a")
    await asyncio.sleep(0)
    assert waiting[1].done() and not waiting[2].done(), "a slot goes to the next live waiter in order"
    for _ in range(len(waiting)):
        limiter.release("a")
        await asyncio.sleep(0)
    assert all(w.done() for w in waiting)
    limiter.release("b")
    assert "b" not in limiter._connections


# --- flags ------------------------------------------------------------------------------------


def test_security_is_off_by_default_and_flags_that_need_tls_say_so() -> None:
    from services.security.config import SecurityConfig, SecurityConfigError

    assert not SecurityConfig().active and not SecurityConfig().needs_interceptor
    SecurityConfig().check()
    for flags in (
        {"authorizer": "acl"},
        {"client_port": 0},
        {"producer_byte_rate": 1},
        {"super_users": ("User:admin",)},
    ):
        with pytest.raises(SecurityConfigError, match="--tls-dir"):
            SecurityConfig(**flags).check()  # type: ignore[arg-type]
    with pytest.raises(SecurityConfigError, match="service name"):
        SecurityConfig(tls_dir=Path("/nonexistent"), name="alice").check()
    SecurityConfig(tls_dir=Path("/nonexistent"), name="broker-1", authorizer="acl").check()
    limits_only = SecurityConfig(max_batch_records=10)
    assert limits_only.needs_interceptor and not limits_only.tls
    with pytest.raises(SecurityConfigError):
        SecurityConfig(max_request_bytes=10).check()


def test_the_service_commands_take_the_security_flags() -> None:
    from click.testing import CliRunner

    from services.cli import broker_command

    result = CliRunner().invoke(broker_command, ["--help"])
    for flag in (
        "--tls-dir",
        "--client-port",
        "--authorizer",
        "--super-users",
        "--max-request-bytes",
        "--max-batch-records",
        "--producer-byte-rate",
        "--consumer-byte-rate",
        "--max-concurrent-requests-per-connection",
    ):
        assert flag in result.output
