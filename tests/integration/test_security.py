"""The security layer on real processes: TLS everywhere, authentication, ACLs, limits (docs/SECURITY.md).

One cluster for the module: etcd with client-certificate auth, a controller,
two brokers and a gateway, all with --tls-dir, --authorizer acl, User:admin as
super user, quotas and request limits. Every service also has a --client-port
(TLS without client certificates) for token clients.

The bad-input matrix sends every RPC of every service with no credentials,
a wrong token, an expired token and a revoked token (UNAUTHENTICATED), with a
certificate of another authority (the TLS handshake fails: UNAVAILABLE, no RPC
reaches the service), with a client certificate on the control-plane RPCs and
with a forged forwarded principal (PERMISSION_DENIED), and as a principal
without ACLs (per-partition TOPIC_AUTHORIZATION_FAILED, hidden topics,
PERMISSION_DENIED for cluster and group operations). After each part, nothing
was written (log end offsets unchanged) and the cluster still serves the admin.

ACLs and tokens are managed as an operator does it: `highwater acl|token`
through the gateway to the controller's admin RPCs, with a certificate of the
cluster CA and no etcd client certificate (issue 17).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from clients.admin import Admin
from clients.common.records import Record, decode_batches, encode_batch
from clients.errors import HighwaterError
from clients.producer import Producer
from clients.tls import ClientTls
from clients.tools.cli import cli
from coordinator.acls import load_security
from coordinator.store import CoordinatorUnavailable, EtcdStore, EtcdTls
from protos.highwater.v1 import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    controller_pb2,
    controller_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
)
from services.security.certs import create_ca, issue_certificate
from tests.integration.conftest import TEST_LEASE_TTL_S, TestCluster
from tests.integration.helpers import consumer_fetch, wait_for

pytestmark = pytest.mark.integration

TAF = common_pb2.TOPIC_AUTHORIZATION_FAILED
PRODUCER_BYTE_RATE = 512 * 1024
CONSUMER_BYTE_RATE = 256 * 1024
MAX_REQUEST_BYTES = 4 * 1024 * 1024
MAX_BATCH_RECORDS = 1000
MAX_STREAMS = 8
CALL_TIMEOUT_S = 10.0
SERVICES = {
    "controller-1": controller_pb2.DESCRIPTOR.services_by_name["ControllerService"],
    "broker-1": broker_pb2.DESCRIPTOR.services_by_name["BrokerService"],
    "gateway-1": gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"],
}


# --- the cluster and credentials -----------------------------------------------------------


def acl_cluster(path: Path, *limits: str) -> TestCluster:
    """A two-broker TLS cluster (not started): ACL authorizer, User:admin its super user, and LIMITS."""
    return TestCluster(
        path,
        brokers=2,
        lease_ttl_s=TEST_LEASE_TTL_S,
        tls=True,
        service_args=["--authorizer", "acl", "--super-users", "User:admin", *limits],
    )


def create_topics_as_admin(c: TestCluster, *topics: str) -> None:
    """Create each topic (two partitions, two replicas) as User:admin; each must succeed."""
    admin = gw(c, "admin")
    for topic in topics:
        resp = admin.CreateTopics(
            common_pb2.CreateTopicsRequest(
                topics=[common_pb2.CreatableTopic(name=topic, num_partitions=2, replication_factor=2)]
            ),
            timeout=CALL_TIMEOUT_S,
        )
        assert resp.topics[0].error_code == common_pb2.NONE, resp


def alice_writes_and_reads(c: TestCluster, topic: str, *flags: str) -> str:
    """`acl add` for User:alice, Write and Read on TOPIC, with FLAGS such as --prefixed or --deny."""
    return acl(
        c,
        "add",
        "--principal",
        "User:alice",
        "--operation",
        "Write",
        "--operation",
        "Read",
        "--topic",
        topic,
        *flags,
    )


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = acl_cluster(
        tmp_path_factory.mktemp("secure"),
        "--producer-byte-rate",
        str(PRODUCER_BYTE_RATE),
        "--consumer-byte-rate",
        str(CONSUMER_BYTE_RATE),
        "--max-request-bytes",
        str(MAX_REQUEST_BYTES),
        "--max-batch-records",
        str(MAX_BATCH_RECORDS),
        "--max-concurrent-requests-per-connection",
        str(MAX_STREAMS),
    )
    c.start()
    try:
        for name in ("alice", "mallory"):
            c.issue_client_certificate(name)
        create_topics_as_admin(c, "sec-ok", "sec-secret", "sec-other", "sec-quota")
        # User:alice writes and reads every sec- topic but sec-secret (deny wins), and commits as group g1.
        alice_writes_and_reads(c, "sec-", "--prefixed")
        alice_writes_and_reads(c, "sec-secret", "--deny")
        acl(c, "add", "--principal", "User:alice", "--operation", "Read", "--group", "g1")
        acl(c, "add", "--principal", "User:tok", "--operation", "All", "--topic", "sec-quota")
        # sec-secret stays visible: denying Read and Write does not deny Describe (Kafka's rule).
        wait_for(
            lambda: topics_seen(c, "alice") == {"sec-ok", "sec-secret", "sec-other", "sec-quota"},
            timeout_s=10,
            what="alice's ACLs to reach the gateway",
        )
        # Every partition answers ListOffsets (-1 while a new partition's leader is not yet known),
        # so the tests' before/after comparisons see only what their own calls wrote.
        wait_for(
            lambda: all(offset >= 0 for offset in end_offsets(c).values()),
            timeout_s=30,
            what="every sec- partition to answer ListOffsets",
        )
        yield c
    finally:
        c.stop()


def highwater(
    c: TestCluster, *args: str, tls_dir: Path | None = None, name: str | None = None, expect_exit: int = 0
) -> str:
    """Run the `highwater` CLI against the cluster's gateway, as an operator would (no etcd involved)."""
    root = ["--bootstrap", c.gateway_address, "--tls-dir", str(tls_dir or c.tls_dir)]
    result = CliRunner().invoke(cli, [*root, *(["--tls-name", name] if name else []), *args])
    assert result.exit_code == expect_exit, (args, result.output)
    return result.output


def acl(c: TestCluster, *args: str) -> str:
    """`highwater acl ARGS` as the super user User:admin (the CLI's default certificate with --tls-dir)."""
    return highwater(c, "acl", *args)


def settings(c: TestCluster, name: str | None) -> ClientTls:
    s = c.client_settings(name)
    made = ClientTls.from_settings(
        ssl_cafile=s["ssl_cafile"],
        ssl_certfile=s.get("ssl_certfile"),
        ssl_keyfile=s.get("ssl_keyfile"),
        auth_token=None,
    )
    assert made is not None
    return made


def channel(
    c: TestCluster,
    process: str,
    name: str | None = "admin",
    *,
    token: str | None = None,
    client_port: bool = False,
) -> grpc.Channel:
    info = c.processes[process].info
    port = info["client_port"] if client_port else info["port"]
    base = settings(c, name)
    creds = ClientTls(base.ca_cert, base.cert_chain, base.private_key, token)
    return creds.channel(f"127.0.0.1:{port}")


def gw(c: TestCluster, name: str | None = "admin", **kw: object) -> gateway_pb2_grpc.GatewayServiceStub:
    return gateway_pb2_grpc.GatewayServiceStub(channel(c, "gateway-1", name, **kw))  # type: ignore[arg-type]


def topics_seen(c: TestCluster, name: str) -> set[str]:
    md = gw(c, name).Metadata(common_pb2.MetadataRequest(), timeout=CALL_TIMEOUT_S)
    return {t.name for t in md.topics}


def end_offsets(c: TestCluster) -> dict[tuple[str, int], int]:
    """Every sec- partition's high watermark, read by the admin (a super user)."""
    md = gw(c).Metadata(common_pb2.MetadataRequest(), timeout=CALL_TIMEOUT_S)
    req = common_pb2.ListOffsetsRequest(
        topics=[
            common_pb2.ListOffsetsTopic(
                topic=t.name,
                partitions=[
                    common_pb2.ListOffsetsPartition(partition=p.partition, timestamp=-1) for p in t.partitions
                ],
            )
            for t in md.topics
            if t.name.startswith("sec-")
        ]
    )
    resp = gw(c).ListOffsets(req, timeout=CALL_TIMEOUT_S)
    return {(t.topic, p.partition): p.offset for t in resp.topics for p in t.partitions}


def produce_request(*topics: str, records: int = 1, value: bytes = b"v") -> common_pb2.ProduceRequest:
    batch = encode_batch([Record(None, value, [], int(time.time() * 1000)) for _ in range(records)])
    return common_pb2.ProduceRequest(
        acks=-1,
        timeout_ms=5000,
        topics=[
            common_pb2.ProduceTopicData(
                topic=t, partitions=[common_pb2.ProducePartitionData(partition=0, records=batch)]
            )
            for t in topics
        ],
    )


def codes(resp: common_pb2.ProduceResponse) -> dict[str, int]:
    return {t.topic: p.error_code for t in resp.topics for p in t.partitions}


def make_token(c: TestCluster, principal: str, *, expires_in_ms: int = 0) -> str:
    """A token from the controller's CreateToken, asked by the super user through the gateway."""
    with Admin(c.gateway_address, **c.client_settings("admin")) as admin:
        return admin.create_token(principal, expires_in_ms).token


def raw_call(ch: grpc.Channel, service: str, method: str, payload: bytes = b"") -> grpc.StatusCode:
    """Call any method with raw bytes; the status it ends with (OK for an answer)."""
    desc = SERVICES[service].methods_by_name[method]
    path = f"/{SERVICES[service].full_name}/{method}"
    try:
        if desc.server_streaming:
            for _ in ch.unary_stream(path)(payload, timeout=CALL_TIMEOUT_S):
                break
        else:
            ch.unary_unary(path)(payload, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


ALL_METHODS = [(svc, m.name) for svc, d in SERVICES.items() for m in d.methods]


# --- authentication -------------------------------------------------------------------------


def test_every_rpc_of_every_service_refuses_missing_wrong_expired_and_revoked_credentials(secure):
    before = end_offsets(secure)
    expired = make_token(secure, "User:alice", expires_in_ms=1)
    revoked = make_token(secure, "User:alice")
    ok = gateway_pb2_grpc.GatewayServiceStub(
        channel(secure, "gateway-1", None, token=revoked, client_port=True)
    )
    wait_for(lambda: _works(ok), timeout_s=10, what="the new token to reach the gateway")
    assert "revoked" in highwater(secure, "token", "revoke", revoked)
    wait_for(lambda: not _works(ok), timeout_s=10, what="the revocation to reach the gateway")
    kinds = {
        "no credentials": None,
        "wrong token": "hwt.0123456789abcdef.not-the-secret",
        "malformed token": "not-a-token",
        "expired token": expired,
        "revoked token": revoked,
    }
    refused = []
    for svc, method in ALL_METHODS:
        for kind, token in kinds.items():
            ch = channel(secure, svc, None, token=token, client_port=True)
            refused.append((svc, method, kind, raw_call(ch, svc, method)))
    wrong = [r for r in refused if r[3] != grpc.StatusCode.UNAUTHENTICATED]
    assert not wrong, f"not UNAUTHENTICATED: {wrong[:10]}"
    assert len(refused) == len(ALL_METHODS) * len(kinds)
    # Health checks stay open for probes; nothing was written; the admin is still served.
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = health_pb2_grpc.HealthStub(channel(secure, "broker-1", None, client_port=True))
    assert (
        health.Check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT_S).status
        == health_pb2.HealthCheckResponse.SERVING
    )
    assert end_offsets(secure) == before
    assert codes(gw(secure).Produce(produce_request("sec-other"), timeout=CALL_TIMEOUT_S)) == {"sec-other": 0}


def _works(stub: gateway_pb2_grpc.GatewayServiceStub) -> bool:
    try:
        stub.Metadata(common_pb2.MetadataRequest(), timeout=CALL_TIMEOUT_S)
        return True
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.UNAUTHENTICATED, exc
        return False


def test_a_certificate_from_another_authority_fails_the_handshake_everywhere(secure, tmp_path: Path):
    create_ca(tmp_path, common_name="Evil CA")
    issue_certificate(tmp_path, "controller-1")  # even a service's name, signed by the wrong CA
    evil = ClientTls(
        settings(secure, None).ca_cert,
        (tmp_path / "controller-1.pem").read_bytes(),
        (tmp_path / "controller-1-key.pem").read_bytes(),
        None,
    )
    for svc in SERVICES:
        ch = evil.channel(f"127.0.0.1:{secure.processes[svc].info['port']}")
        assert (
            raw_call(ch, svc, "UpdateMetadata" if svc != "controller-1" else "AlterPartition")
            == grpc.StatusCode.UNAVAILABLE
        )
    # A plaintext client cannot talk to a TLS listener at all.
    plain = grpc.insecure_channel(secure.gateway_address)
    assert raw_call(plain, "gateway-1", "Metadata") == grpc.StatusCode.UNAVAILABLE


def test_etcd_refuses_clients_without_a_certificate_of_the_cluster(secure):
    async def connect(tls: EtcdTls | None) -> None:
        store = await EtcdStore.connect(secure.etcd_endpoint, tls=tls, timeout_s=1.0)
        await store.close()

    ca = settings(secure, None).ca_cert
    for tls in (None, EtcdTls(ca_cert=ca)):
        with pytest.raises(CoordinatorUnavailable):
            asyncio.run(connect(tls))
    asyncio.run(connect(secure.etcd_tls()))


def test_etcd_refuses_client_certificates_of_the_cluster_ca(secure):
    """A principal's certificate (User:alice, no ACLs) once read and wrote every key in etcd:
    granted itself All, wrote a token for User:admin, marked topics for deletion."""

    async def connect(tls: EtcdTls) -> None:
        store = await EtcdStore.connect(secure.etcd_endpoint, tls=tls, timeout_s=1.0)
        await store.close()

    alice = settings(secure, "alice")
    with pytest.raises(CoordinatorUnavailable):
        asyncio.run(
            connect(EtcdTls(ca_cert=alice.ca_cert, cert_chain=alice.cert_chain, cert_key=alice.private_key))
        )
    # A service's own cluster certificate is no key to etcd either: services use their etcd client ones.
    gateway = settings(secure, "gateway-1")
    with pytest.raises(CoordinatorUnavailable):
        asyncio.run(
            connect(
                EtcdTls(ca_cert=gateway.ca_cert, cert_chain=gateway.cert_chain, cert_key=gateway.private_key)
            )
        )
    # Nor is the CLI a way around: it goes through the controller, which wants Alter on the cluster.
    refused = highwater(
        secure,
        "acl",
        "add",
        "--principal",
        "User:alice",
        "--operation",
        "All",
        "--topic",
        "*",
        name="alice",
        expect_exit=1,
    )
    assert "CLUSTER_AUTHORIZATION_FAILED" in refused and "may not Alter Cluster" in refused, refused
    assert not [line for line in acl(secure, "list").splitlines() if "User:alice" in line and " All " in line]


# --- identities on the control plane ----------------------------------------------------------


CONTROL_PLANE = [
    ("broker-1", "LeaderAndIsr", broker_pb2.LeaderAndIsrRequest()),
    ("broker-1", "UpdateMetadata", broker_pb2.UpdateMetadataRequest(full=True)),
    (
        "broker-1",
        "StopReplica",
        broker_pb2.StopReplicaRequest(
            partitions=[
                broker_pb2.StopReplicaPartition(
                    topic="sec-ok", partition=0, leader_epoch=-2, delete_partition=True
                )
            ]
        ),
    ),
    (
        "broker-1",
        "Fetch",
        common_pb2.FetchRequest(
            replica_id=2,
            topics=[
                common_pb2.FetchTopic(
                    topic="sec-ok", partitions=[common_pb2.FetchPartition(partition=0, fetch_offset=10**9)]
                )
            ],
        ),
    ),
    ("broker-1", "OffsetsForLeaderEpoch", broker_pb2.OffsetsForLeaderEpochRequest(replica_id=2)),
    # A marker would commit or abort another producer's transaction: brokers only.
    (
        "broker-1",
        "WriteTxnMarkers",
        broker_pb2.WriteTxnMarkersRequest(
            markers=[
                broker_pb2.TxnMarker(
                    producer_id=1,
                    producer_epoch=0,
                    topics=[broker_pb2.TxnMarkerTopic(topic="sec-ok", partitions=[0])],
                )
            ]
        ),
    ),
    ("controller-1", "AlterPartition", controller_pb2.AlterPartitionRequest(broker_id=1)),
    ("controller-1", "ControlledShutdown", controller_pb2.ControlledShutdownRequest(broker_id=1)),
    ("gateway-1", "UpdateMetadata", broker_pb2.UpdateMetadataRequest(full=True)),
]


@pytest.mark.parametrize("caller", ["mallory", "admin", "broker-2-as-1", "gateway"])
def test_control_plane_rpcs_need_the_right_service_certificate(secure, caller):
    """A client certificate on the inter-service port, even a super user's, cannot act as a service;
    a broker cannot act as another broker, nor a gateway as a controller."""
    before = end_offsets(secure)
    name = {"mallory": "mallory", "admin": "admin", "broker-2-as-1": "broker-2", "gateway": "gateway-1"}[
        caller
    ]
    for svc, method, request in CONTROL_PLANE:
        if caller == "broker-2-as-1" and method in ("Fetch", "OffsetsForLeaderEpoch", "WriteTxnMarkers"):
            continue  # broker 2 may fetch as replica 2 (its own id), and any broker writes markers
        code = raw_call(channel(secure, svc, name), svc, method, request.SerializeToString())
        assert code == grpc.StatusCode.PERMISSION_DENIED, (caller, svc, method, code)
    assert end_offsets(secure) == before
    assert wait_for(
        lambda: (
            len(
                gw(secure)
                .Metadata(common_pb2.MetadataRequest(topics=["sec-ok"]), timeout=CALL_TIMEOUT_S)
                .topics[0]
                .partitions
            )
            == 2
        ),
        timeout_s=5,
        what="sec-ok intact",
    )


def test_only_a_gateway_may_forward_a_principal(secure):
    """A client that sends the forwarding header itself is refused, whatever principal it names."""
    stub = broker_pb2_grpc.BrokerServiceStub(channel(secure, "broker-1", "mallory"))
    with pytest.raises(grpc.RpcError) as err:
        stub.Produce(
            produce_request("sec-ok"),
            metadata=[("x-highwater-principal-bin", b"User:admin")],
            timeout=CALL_TIMEOUT_S,
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


# --- ACLs ----------------------------------------------------------------------------------------


def test_produce_writes_authorized_partitions_and_refuses_the_rest_of_the_same_request(secure):
    before = end_offsets(secure)
    resp = gw(secure, "alice").Produce(
        produce_request("sec-ok", "sec-secret", "sec-nonexistent-x"), timeout=CALL_TIMEOUT_S
    )
    assert codes(resp) == {
        "sec-ok": common_pb2.NONE,
        "sec-secret": TAF,
        "sec-nonexistent-x": common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
    }
    after = end_offsets(secure)
    assert after[("sec-ok", 0)] == before[("sec-ok", 0)] + 1
    assert {k: v for k, v in after.items() if k != ("sec-ok", 0)} == {
        k: v for k, v in before.items() if k != ("sec-ok", 0)
    }
    # mallory has no ACL at all: nothing of hers is written, through the gateway or at the leader.
    resp = gw(secure, "mallory").Produce(produce_request("sec-ok", "sec-other"), timeout=CALL_TIMEOUT_S)
    assert codes(resp) == {"sec-ok": TAF, "sec-other": TAF}
    leader = (
        gw(secure)
        .Metadata(common_pb2.MetadataRequest(topics=["sec-ok"]), timeout=CALL_TIMEOUT_S)
        .topics[0]
        .partitions[0]
        .leader
    )
    direct = broker_pb2_grpc.BrokerServiceStub(channel(secure, f"broker-{leader}", "mallory"))
    assert codes(direct.Produce(produce_request("sec-ok"), timeout=CALL_TIMEOUT_S)) == {"sec-ok": TAF}
    assert end_offsets(secure) == after


def test_reads_are_checked_per_topic_and_unauthorized_topics_are_hidden(secure):
    alice = gw(secure, "alice")
    fetch = alice.Fetch(
        common_pb2.FetchRequest(
            replica_id=-1,
            max_wait_ms=0,
            topics=[
                common_pb2.FetchTopic(
                    topic=t, partitions=[common_pb2.FetchPartition(partition=0, current_leader_epoch=-1)]
                )
                for t in ("sec-ok", "sec-secret")
            ],
        ),
        timeout=CALL_TIMEOUT_S,
    )
    assert {t.topic: t.partitions[0].error_code for t in fetch.topics} == {"sec-ok": 0, "sec-secret": TAF}
    offsets = gw(secure, "mallory").ListOffsets(
        common_pb2.ListOffsetsRequest(
            topics=[
                common_pb2.ListOffsetsTopic(
                    topic="sec-ok", partitions=[common_pb2.ListOffsetsPartition(partition=0, timestamp=-1)]
                )
            ]
        ),
        timeout=CALL_TIMEOUT_S,
    )
    assert offsets.topics[0].partitions[0].error_code == TAF
    assert topics_seen(secure, "mallory") == set()
    named = gw(secure, "mallory").Metadata(
        common_pb2.MetadataRequest(topics=["sec-ok"]), timeout=CALL_TIMEOUT_S
    )
    assert named.topics[0].error_code == TAF and not named.topics[0].partitions
    stream = alice.Subscribe(
        gateway_pb2.SubscribeRequest(
            partitions=[gateway_pb2.SubscribePartition(topic="sec-secret", partition=0, start_offset=-2)]
        ),
        timeout=CALL_TIMEOUT_S,
    )
    assert [m.error_code for m in stream] == [TAF]


def test_admin_and_group_operations_need_their_acls(secure):
    mallory = gw(secure, "mallory")
    created = mallory.CreateTopics(
        common_pb2.CreateTopicsRequest(
            topics=[common_pb2.CreatableTopic(name="sec-mallory", num_partitions=1, replication_factor=1)]
        ),
        timeout=CALL_TIMEOUT_S,
    )
    assert created.topics[0].error_code == TAF
    deleted = mallory.DeleteTopics(common_pb2.DeleteTopicsRequest(names=["sec-ok"]), timeout=CALL_TIMEOUT_S)
    assert deleted.topics[0].error_code == TAF
    for call, request in [
        (mallory.ElectLeaders, common_pb2.ElectLeadersRequest()),
        (mallory.DescribeCluster, common_pb2.DescribeClusterRequest()),
        (mallory.InitProducerId, common_pb2.InitProducerIdRequest(producer_id=-1)),
        (mallory.CommitOffsets, gateway_pb2.CommitOffsetsRequest(group_id="g1")),
        (gw(secure, "alice").CommitOffsets, gateway_pb2.CommitOffsetsRequest(group_id="g2")),
    ]:
        with pytest.raises(grpc.RpcError) as err:
            call(request, timeout=CALL_TIMEOUT_S)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, (call, err.value)
    commit = gw(secure, "alice").CommitOffsets(
        gateway_pb2.CommitOffsetsRequest(
            group_id="g1",
            topics=[
                gateway_pb2.OffsetCommitTopic(
                    topic=t, partitions=[gateway_pb2.OffsetCommitPartition(partition=0, offset=0)]
                )
                for t in ("sec-ok", "sec-secret")
            ],
        ),
        timeout=CALL_TIMEOUT_S,
    )
    assert {p.topic: p.error_code for p in commit.partitions} == {"sec-ok": 0, "sec-secret": TAF}
    assert "sec-ok" in topics_seen(secure, "admin")


def test_acl_changes_and_token_clients_through_the_library(secure):
    """A token client on the client port; its ACL removed then re-added takes effect at once."""
    token = make_token(secure, "User:tok")
    gateway_client = f"127.0.0.1:{secure.processes['gateway-1'].info['client_port']}"
    with Producer(
        gateway_client,
        ssl_cafile=str(secure.tls_dir / "ca.pem"),
        auth_token=token,
        request_timeout_ms=5000,
        delivery_timeout_ms=8000,
        linger_ms=0,
    ) as producer:
        assert producer.send("sec-quota", b"hello", partition=1).result(timeout=10).offset >= 0
        acl(secure, "remove", "--principal", "User:tok", "--operation", "All", "--topic", "sec-quota")
        resp_codes = wait_for(
            lambda: (
                codes(
                    gw(secure, None, token=token, client_port=True).Produce(
                        produce_request("sec-quota"), timeout=CALL_TIMEOUT_S
                    )
                )
                == {"sec-quota": TAF}
            ),
            timeout_s=10,
            what="the removed ACL to take effect",
        )
        assert resp_codes
        with pytest.raises(HighwaterError):
            producer.send("sec-quota", b"refused", partition=1).result(timeout=10)
        acl(secure, "add", "--principal", "User:tok", "--operation", "All", "--topic", "sec-quota")
    listed = acl(secure, "list", "--principal", "User:alice")
    assert "sec-secret" in listed and "Deny" in listed


# --- ACL and token administration: controller RPCs, not etcd (issue 17) ----------------------


SECURITY_ADMIN_CALLS = [
    (
        "CreateAcls",
        controller_pb2.CreateAclsRequest(
            creations=[
                controller_pb2.AclBinding(
                    principal="User:mallory", permission="Allow", operation="All", resource_type="Cluster"
                )
            ]
        ),
    ),
    (
        "DeleteAcls",
        controller_pb2.DeleteAclsRequest(
            deletions=[
                controller_pb2.AclBinding(
                    principal="User:alice",
                    permission="Allow",
                    operation="Read",
                    resource_type="Group",
                    resource_name="g1",
                )
            ]
        ),
    ),
    ("DescribeAcls", controller_pb2.DescribeAclsRequest()),
    ("CreateToken", controller_pb2.CreateTokenRequest(principal="User:admin")),
    ("RevokeToken", controller_pb2.RevokeTokenRequest(token_id="0123456789abcdef")),
    ("ListTokens", controller_pb2.ListTokensRequest()),
]


def security_records(c: TestCluster) -> tuple[dict[str, object], set[str]]:
    """What etcd holds under /security/
    (the test reads it with the etcd client certificate cluster up makes).
    """

    async def read() -> tuple[dict[str, object], set[str]]:
        store = await EtcdStore.connect(c.etcd_endpoint, tls=c.etcd_tls())
        try:
            snapshot = await load_security(store)
            return dict(snapshot.acls), set(snapshot.tokens)
        finally:
            await store.close()

    return asyncio.run(read())


def test_without_alter_on_the_cluster_no_principal_manages_acls_or_tokens(secure):
    """mallory (no ACL), alice (ACLs on topics and a group) and a token client with All on a topic are
    refused every ACL and token call, at the gateway and at the controller itself; nothing changes.
    The super user is served, at both."""
    before = security_records(secure)
    tok = make_token(secure, "User:tok")
    callers = {
        "mallory": gw(secure, "mallory"),
        "alice": gw(secure, "alice"),
        "token": gw(secure, None, token=tok, client_port=True),
        "mallory at the controller": controller_pb2_grpc.ControllerServiceStub(
            channel(secure, "controller-1", "mallory")
        ),
        "alice at the controller": controller_pb2_grpc.ControllerServiceStub(
            channel(secure, "controller-1", "alice")
        ),
    }
    wait_for(lambda: _works(callers["token"]), timeout_s=10, what="the token to reach the gateway")
    for who, stub in callers.items():
        for method, request in SECURITY_ADMIN_CALLS:
            with pytest.raises(grpc.RpcError) as err:
                getattr(stub, method)(request, timeout=CALL_TIMEOUT_S)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, (who, method, err.value)
            assert f"({method})" in str(err.value.details()), err.value.details()
    # Through the client library, the same refusal is the typed CLUSTER_AUTHORIZATION_FAILED.
    with (
        Admin(secure.gateway_address, **secure.client_settings("mallory")) as admin,
        pytest.raises(HighwaterError) as typed,
    ):
        admin.create_token("User:admin")
    assert typed.value.code == common_pb2.CLUSTER_AUTHORIZATION_FAILED
    assert security_records(secure)[0] == before[0] and len(security_records(secure)[1]) == len(before[1]) + 1
    # The super user may, at the gateway and at the controller.
    binding = controller_pb2.AclBinding(
        principal="User:nobody",
        permission="Deny",
        operation="Read",
        resource_type="Topic",
        resource_name="sec-nobody",
    )
    for stub in (
        gw(secure),
        controller_pb2_grpc.ControllerServiceStub(channel(secure, "controller-1", "admin")),
    ):
        created = stub.CreateAcls(
            controller_pb2.CreateAclsRequest(creations=[binding]), timeout=CALL_TIMEOUT_S
        )
        assert created.error_code == common_pb2.NONE and created.results[0].changed, created
        listed = stub.DescribeAcls(
            controller_pb2.DescribeAclsRequest(principal="User:nobody"), timeout=CALL_TIMEOUT_S
        )
        assert [(b.operation, b.resource_name) for b in listed.acls] == [("Read", "sec-nobody")]
        deleted = stub.DeleteAcls(
            controller_pb2.DeleteAclsRequest(deletions=[binding]), timeout=CALL_TIMEOUT_S
        )
        assert deleted.results[0].changed, deleted


def test_operators_manage_acls_and_tokens_with_the_cli_and_no_etcd_certificate(secure, tmp_path: Path):
    """`highwater acl add/list/remove` and `highwater token create/list/revoke` as User:ops, whose TLS
    directory holds only the cluster CA and its own certificate. A super user delegates ACL management
    to it with Alter on the cluster; a token it creates works until it revokes it."""
    import shutil

    secure.issue_client_certificate("ops")
    ops_dir = tmp_path / "ops-tls"
    ops_dir.mkdir()
    for name in ("ca.pem", "ops.pem", "ops-key.pem"):
        shutil.copy(secure.tls_dir / name, ops_dir / name)
    assert not [f for f in ops_dir.iterdir() if "etcd" in f.name], "no etcd client CA or certificate"

    def ops(*args: str, expect_exit: int = 0) -> str:
        return highwater(secure, *args, tls_dir=ops_dir, name="ops", expect_exit=expect_exit)

    def ops_list_exit_code() -> int:
        """`highwater acl list` as User:ops, without asserting its exit code (for polling)."""
        root = ["--bootstrap", secure.gateway_address, "--tls-dir", str(ops_dir), "--tls-name", "ops"]
        return CliRunner().invoke(cli, [*root, "acl", "list"]).exit_code

    refused = ops("acl", "list", expect_exit=1)
    assert "CLUSTER_AUTHORIZATION_FAILED" in refused and "may not Describe Cluster" in refused, refused
    assert "1 added, 0 already present" in acl(
        secure, "add", "--principal", "User:ops", "--operation", "Alter", "--cluster"
    )
    try:
        wait_for(
            lambda: ops_list_exit_code() == 0,
            timeout_s=10,
            what="the grant to reach the gateway and the controller",
        )
        added = ops("acl", "add", "--principal", "User:carol", "--operation", "Read", "--topic", "sec-ok")
        assert "User:carol has Allow permission for Read on Topic:LITERAL:sec-ok" in added
        assert "1 added, 0 already present" in added
        assert "0 added, 1 already present" in ops(
            "acl", "add", "--principal", "User:carol", "--operation", "Read", "--topic", "sec-ok"
        )
        listed = ops("acl", "list", "--principal", "User:carol", "--topic", "sec-ok", "--output", "json")
        assert json.loads(listed) == [
            {
                "principal": "User:carol",
                "permission": "Allow",
                "operation": "Read",
                "resource_type": "Topic",
                "resource_name": "sec-ok",
                "pattern_type": "Literal",
                "host": "*",
            }
        ]
        assert "User:carol" in ops("acl", "list", "--topic", "sec-ok")

        created = ops(
            "token", "create", "--principal", "User:carol", "--expires-in-s", "3600", "--description", "ci"
        )
        token = next(line for line in created.splitlines() if line.startswith("hwt."))
        token_id = token.split(".")[1]
        assert f"token id {token_id} for User:carol, expires in 3600 s" in created
        carol = gw(secure, None, token=token, client_port=True)
        wait_for(lambda: _works(carol), timeout_s=10, what="the new token to reach the gateway")
        assert topics_seen_by(carol) == {"sec-ok"}, "the token acts as User:carol, with carol's ACLs"
        listed_tokens = ops("token", "list")
        assert token_id in listed_tokens and "User:carol" in listed_tokens and "ci" in listed_tokens
        assert token.split(".")[2] not in listed_tokens, "a secret is shown once, at creation"

        assert f"{token_id}: revoked" in ops("token", "revoke", token)
        wait_for(lambda: not _works(carol), timeout_s=10, what="the revocation to reach the gateway")
        assert f"{token_id}: no such token" in ops("token", "revoke", token_id)
        assert token_id not in ops("token", "list")
        assert "1 removed, 0 were not present" in ops(
            "acl", "remove", "--principal", "User:carol", "--operation", "Read", "--topic", "sec-ok"
        )
        # Services never hand out tokens for their own names, whoever asks.
        assert "service identity" in ops("token", "create", "--principal", "User:controller-1", expect_exit=1)
        # The old direct-to-etcd option says what replaced it.
        assert "--etcd is gone" in ops("acl", "list", "--etcd", secure.etcd_endpoint, expect_exit=2)
    finally:
        acl(secure, "remove", "--principal", "User:ops", "--operation", "Alter", "--cluster")
    wait_for(
        lambda: ops_list_exit_code() == 1,
        timeout_s=10,
        what="the removed grant to take effect",
    )


def topics_seen_by(stub: gateway_pb2_grpc.GatewayServiceStub) -> set[str]:
    return {t.name for t in stub.Metadata(common_pb2.MetadataRequest(), timeout=CALL_TIMEOUT_S).topics}


# --- limits ----------------------------------------------------------------------------------


def test_produce_quota_throttles_and_the_client_backs_off(secure):
    """512 KiB/s for User:tok: over the one-second burst, answers carry throttle_time_ms; a client that
    ignores it is held back by the server; the library client waits it out, so 1.5 MiB take >= ~1 s."""
    token = make_token(secure, "User:tok")
    stub = gw(secure, None, token=token, client_port=True)
    wait_for(lambda: _works(stub), timeout_s=10, what="the token")
    value = b"x" * 1000
    start = time.monotonic()
    throttles = [
        stub.Produce(
            produce_request("sec-quota", records=256, value=value), timeout=CALL_TIMEOUT_S
        ).throttle_time_ms
        for _ in range(4)
    ]
    assert throttles[:2] == [0, 0] and all(t > 0 for t in throttles[2:]), throttles
    assert time.monotonic() - start >= throttles[2] / 1000 * 0.9, "the 4th call, sent at once, was held back"
    time.sleep(throttles[-1] / 1000)
    start = time.monotonic()
    total = 1536 * 1024
    value = b"x" * 2000  # a full 1 MiB batch stays under MAX_BATCH_RECORDS
    with Producer(
        f"127.0.0.1:{secure.processes['gateway-1'].info['client_port']}",
        ssl_cafile=str(secure.tls_dir / "ca.pem"),
        auth_token=token,
        linger_ms=5,
        batch_size_bytes=64 * 1024,
    ) as producer:
        futures = [producer.send("sec-quota", value, partition=0) for _ in range(total // len(value))]
        producer.flush()
        assert all(f.result(timeout=30).offset >= 0 for f in futures)
    elapsed = time.monotonic() - start
    # The first second of quota is a free burst; the rest goes at the rate.
    assert elapsed >= (total - PRODUCER_BYTE_RATE) / PRODUCER_BYTE_RATE * 0.8, elapsed


def test_fetch_quota_throttles_and_brokers_check_tokens_too(secure):
    """256 KiB/s of fetch for User:tok: a second 300 KB fetch at once carries throttle_time_ms.
    The same token works directly at the leader broker's client port."""
    token = make_token(secure, "User:tok")
    admin = gw(secure)
    for _ in range(3):  # ~300 KB on sec-quota-2 (the admin is a super user but has a quota too)
        req = produce_request("sec-quota", records=100, value=b"y" * 1000)
        req.topics[0].partitions[0].partition = 1
        assert admin.Produce(req, timeout=CALL_TIMEOUT_S).topics[0].partitions[0].error_code == 0
    md = admin.Metadata(common_pb2.MetadataRequest(topics=["sec-quota"]), timeout=CALL_TIMEOUT_S)
    leader = next(p.leader for p in md.topics[0].partitions if p.partition == 1)
    direct = broker_pb2_grpc.BrokerServiceStub(
        channel(secure, f"broker-{leader}", None, token=token, client_port=True)
    )
    wait_for(
        lambda: _fetch(direct).topics[0].partitions[0].error_code == 0,
        timeout_s=10,
        what="the token at the broker",
    )
    throttles = [_fetch(direct).throttle_time_ms for _ in range(3)]
    assert throttles[1] > 0 and throttles[2] > 0, throttles


def _fetch(stub: broker_pb2_grpc.BrokerServiceStub) -> common_pb2.FetchResponse:
    request = consumer_fetch("sec-quota", 1, 0, max_bytes=8 << 20, partition_max_bytes=4 << 20)
    return stub.Fetch(request, timeout=CALL_TIMEOUT_S)


def test_oversized_requests_and_batches_are_refused_without_writing(secure):
    before = end_offsets(secure)
    huge = produce_request("sec-other", records=1, value=b"x" * (MAX_REQUEST_BYTES + 1))
    with pytest.raises(grpc.RpcError) as err:
        gw(secure).Produce(huge, timeout=CALL_TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    resp = gw(secure).Produce(
        produce_request("sec-other", records=MAX_BATCH_RECORDS + 1), timeout=CALL_TIMEOUT_S
    )
    assert codes(resp) == {"sec-other": common_pb2.INVALID_REQUEST}
    assert end_offsets(secure) == before


def test_concurrent_requests_per_connection_are_bounded(secure):
    """MAX_STREAMS long polls of 1 s run at once on one connection; the rest wait their turn."""
    md = gw(secure).Metadata(common_pb2.MetadataRequest(topics=["sec-other"]), timeout=CALL_TIMEOUT_S)
    leader = next(p.leader for p in md.topics[0].partitions if p.partition == 1)
    hw = end_offsets(secure)[("sec-other", 1)]
    stub = broker_pb2_grpc.BrokerServiceStub(channel(secure, f"broker-{leader}", "admin"))
    # Nobody writes sec-other-1: each Fetch at its end waits the whole max_wait_ms for min_bytes.
    request = common_pb2.FetchRequest(
        replica_id=-1,
        max_wait_ms=1000,
        min_bytes=10**6,
        topics=[
            common_pb2.FetchTopic(
                topic="sec-other",
                partitions=[common_pb2.FetchPartition(partition=1, fetch_offset=hw, current_leader_epoch=-1)],
            )
        ],
    )
    start = time.monotonic()
    stub.Fetch(request, timeout=CALL_TIMEOUT_S)
    assert time.monotonic() - start >= 0.9, "a single long poll waits its max_wait_ms"
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(MAX_STREAMS * 2) as pool:
        answers = list(
            pool.map(lambda _: stub.Fetch(request, timeout=CALL_TIMEOUT_S), range(MAX_STREAMS * 2))
        )
    assert all(a.topics[0].partitions[0].error_code == 0 for a in answers)
    assert time.monotonic() - start >= 1.8, "twice the streams allowed take two rounds"


# --- hostile input found by the adversarial review (each failed before its fix) --------------


def create(
    c: TestCluster, name: str, configs: dict[str, str] | None = None, *, rf: int = 2
) -> common_pb2.TopicResult:
    resp = gw(c).CreateTopics(
        common_pb2.CreateTopicsRequest(
            topics=[
                common_pb2.CreatableTopic(
                    name=name, num_partitions=1, replication_factor=rf, configs=configs or {}
                )
            ]
        ),
        timeout=CALL_TIMEOUT_S,
    )
    return resp.topics[0]


def test_create_topics_refuses_configs_out_of_bounds_and_names_with_a_newline(secure):
    for configs, says in (
        ({"max.message.bytes": "3000000000"}, "an integer from 61 to 67108864 bytes"),
        ({"max.message.bytes": "1"}, "an integer from 61 to"),
        ({"retention.ms": "0"}, "-1 (unlimited)"),
    ):
        result = create(secure, "sec-bad-config", configs)
        assert result.error_code == common_pb2.INVALID_CONFIG and says in result.error_message, result
    for name in ("sec-orders\n", "sec-orders\r\n", "sec-\x00"):
        assert create(secure, name).error_code == common_pb2.INVALID_TOPIC
    assert not {"sec-bad-config", "sec-orders\n"} & topics_seen(secure, "admin")
    # The controller is still active: it answers, and a good topic is created.
    assert create(secure, "sec-good-config", {"max.message.bytes": "2000000"}).error_code == common_pb2.NONE


def test_subscribe_from_earliest_and_latest_works_after_a_leader_change(secure):
    assert create(secure, "sec-sub").error_code == common_pb2.NONE
    wait_for(
        lambda: (
            codes(gw(secure).Produce(produce_request("sec-sub"), timeout=CALL_TIMEOUT_S)) == {"sec-sub": 0}
        ),
        timeout_s=20,
        what="the first write to sec-sub",
    )
    md = gw(secure).Metadata(common_pb2.MetadataRequest(topics=["sec-sub"]), timeout=CALL_TIMEOUT_S)
    first = md.topics[0].partitions[0]
    # Stop the leader: the other replica (in the ISR) leads in a newer epoch.
    wait_for(
        lambda: (
            len(
                gw(secure)
                .Metadata(common_pb2.MetadataRequest(topics=["sec-sub"]), timeout=CALL_TIMEOUT_S)
                .topics[0]
                .partitions[0]
                .isr
            )
            == 2
        ),
        timeout_s=20,
        what="both replicas in the ISR",
    )
    other = next(r for r in first.replicas if r != first.leader)
    admin = gw(secure)
    secure.kill_broker(first.leader)

    def moved() -> bool:
        p = admin.Metadata(common_pb2.MetadataRequest(topics=["sec-sub"]), timeout=CALL_TIMEOUT_S).topics[0]
        return p.partitions[0].leader == other and p.partitions[0].leader_epoch > first.leader_epoch

    try:
        wait_for(moved, timeout_s=20, what="the leader to move")
    finally:
        secure.start_broker(first.leader)

    def keep_producing(stop: threading.Event) -> None:
        # A stream from the end sees only records written after it resolved "latest".
        while not stop.is_set():
            admin.Produce(produce_request("sec-sub"), timeout=CALL_TIMEOUT_S)
            stop.wait(0.2)

    for start in (-2, -1):
        stream = admin.Subscribe(
            gateway_pb2.SubscribeRequest(
                partitions=[gateway_pb2.SubscribePartition(topic="sec-sub", partition=0, start_offset=start)]
            ),
            timeout=CALL_TIMEOUT_S,
        )
        stop = threading.Event()
        producer = threading.Thread(target=keep_producing, args=(stop,)) if start == -1 else None
        if producer is not None:
            producer.start()
        try:
            message = next(iter(stream))
        finally:
            stop.set()
            if producer is not None:
                producer.join(timeout=CALL_TIMEOUT_S)
            stream.cancel()
        assert message.error_code == common_pb2.NONE, message.error_message
        assert message.records


def test_commit_offsets_refuses_huge_or_unprintable_group_ids_and_oversized_metadata(secure):
    admin = gw(secure)

    def commit(group_id: str, metadata: str = "") -> gateway_pb2.CommitOffsetsResponse:
        return admin.CommitOffsets(
            gateway_pb2.CommitOffsetsRequest(
                group_id=group_id,
                topics=[
                    gateway_pb2.OffsetCommitTopic(
                        topic="sec-ok",
                        partitions=[
                            gateway_pb2.OffsetCommitPartition(partition=0, offset=0, metadata=metadata)
                        ],
                    )
                ],
            ),
            timeout=CALL_TIMEOUT_S,
        )

    huge = commit("g" * (2 * 1024 * 1024))
    assert huge.error_code == common_pb2.INVALID_REQUEST and "the limit is 255" in huge.error_message
    nul = commit("g\x00")
    assert nul.error_code == common_pb2.INVALID_REQUEST and "control characters" in nul.error_message
    big_metadata = commit("sec-group", metadata="m" * 5000)
    assert big_metadata.partitions[0].error_code == common_pb2.INVALID_REQUEST
    assert "the limit is 4096" in big_metadata.partitions[0].error_message
    fetched = admin.FetchCommittedOffsets(
        gateway_pb2.FetchCommittedOffsetsRequest(group_id="sec-group"), timeout=CALL_TIMEOUT_S
    )
    assert list(fetched.offsets) == [], "nothing was stored"


def test_produce_naming_a_partition_twice_or_with_a_negative_timeout_writes_nothing(secure):
    before = end_offsets(secure)
    twice = produce_request("sec-other")
    twice.topics[0].partitions.append(twice.topics[0].partitions[0])
    negative = produce_request("sec-other")
    negative.timeout_ms = -1
    for request, says in ((twice, "appears more than once"), (negative, "timeout_ms must be >= 0")):
        with pytest.raises(grpc.RpcError) as err:
            gw(secure).Produce(request, timeout=CALL_TIMEOUT_S)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in str(err.value.details())
        # Straight to the leader (a broker is reachable too): refused there as well.
        md = gw(secure).Metadata(common_pb2.MetadataRequest(topics=["sec-other"]), timeout=CALL_TIMEOUT_S)
        leader = next(p.leader for p in md.topics[0].partitions if p.partition == 0)
        stub = broker_pb2_grpc.BrokerServiceStub(channel(secure, f"broker-{leader}", "admin"))
        resp = stub.Produce(request, timeout=CALL_TIMEOUT_S)
        assert {p.error_code for t in resp.topics for p in t.partitions} == {common_pb2.INVALID_REQUEST}
    assert end_offsets(secure) == before


def test_revoking_a_token_ends_its_open_subscribe_stream(secure):
    token = make_token(secure, "User:tok")
    admin = gw(secure)
    client = gw(secure, None, token=token, client_port=True)
    wait_for(lambda: _works(client), timeout_s=10, what="the token to reach the gateway")
    stream = client.Subscribe(
        gateway_pb2.SubscribeRequest(
            partitions=[gateway_pb2.SubscribePartition(topic="sec-quota", partition=0, start_offset=-1)]
        ),
        timeout=60,
    )
    stop = threading.Event()

    def keep_producing() -> None:
        while not stop.is_set():
            admin.Produce(produce_request("sec-quota"), timeout=CALL_TIMEOUT_S)
            stop.wait(0.2)

    producer = threading.Thread(target=keep_producing)
    producer.start()
    try:
        first = next(iter(stream))
        assert first.error_code == common_pb2.NONE and first.records, "the stream works before the revocation"
        highwater(secure, "token", "revoke", token)
        wait_for(lambda: not _works(client), timeout_s=10, what="the revocation to reach the gateway")
        cutoff = end_offsets(secure)[("sec-quota", 0)]  # written while the gateway already knew
        delivered_after: list[int] = []
        with pytest.raises(grpc.RpcError) as ended:
            for message in stream:  # records keep coming in; the stream must end instead
                delivered_after += [r.offset for r in decode_batches(message.records) if r.offset >= cutoff]
        assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED, ended.value
        assert "revoked or expired while the stream was open" in str(ended.value.details())
        assert delivered_after == [], "records written after the revocation reached the revoked token"
    finally:
        stop.set()
        producer.join(timeout=CALL_TIMEOUT_S)
        stream.cancel()


def test_a_bad_topic_config_already_in_etcd_is_skipped_and_the_controller_comes_up(secure):
    """Last in the module: it restarts the controller."""
    assert create(secure, "sec-stored-config").error_code == common_pb2.NONE

    async def put_bad_config() -> None:
        store = await EtcdStore.connect(secure.etcd_endpoint, tls=secure.etcd_tls())
        try:
            await store.put(
                store.keys.topic_config("sec-stored-config"),
                b'{"max.message.bytes": "3000000000", "retention.ms": "60000"}',
            )
        finally:
            await store.close()

    asyncio.run(put_bad_config())
    secure.kill("controller-1")
    secure.start_process("controller-1")

    def described() -> common_pb2.DescribeClusterResponse | None:
        resp = gw(secure).DescribeCluster(common_pb2.DescribeClusterRequest(), timeout=CALL_TIMEOUT_S)
        return resp if resp.error_code == common_pb2.NONE else None

    cluster = wait_for(described, timeout_s=30, what="the restarted controller to become active")
    assert cluster.topic_configs["sec-stored-config"].retention_ms == 60000
    assert cluster.topic_configs["sec-stored-config"].max_message_bytes == 0, "skipped: the default applies"
    log = secure.processes["controller-1"].log_path.read_text()
    assert "topic sec-stored-config: stored config skipped: max.message.bytes must be" in log
    assert create(secure, "sec-after-restart").error_code == common_pb2.NONE
