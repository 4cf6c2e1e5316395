"""Malformed, nonsense and oversized requests at every service: no crash, no hang, no write.

One TLS cluster with ACLs (the configuration these requests would meet in
production). Requests go, as an authenticated client without special rights
(User:fuzzer: Read/Write/Describe on topics fz-*, Read on groups fz-*) and
sometimes with no credentials at all, to the controller, both brokers and the
gateway:

- random bytes as the request payload of a random method (a generic
  unary_unary/unary_stream call with identity serializers);
- structurally valid messages of the method's request type with nonsense
  values (extreme integers, unknown enum values, odd names, random record
  bytes, small repeated and map fields, nested to depth 3), built from the
  protobuf descriptors, so every field of every request is exercised;
- requests one byte over --max-request-bytes.

Every call has a deadline and must end within it (a status or an answer); any
status is acceptable except UNKNOWN, which means a handler raised. Afterwards
every process is alive and SERVING, and the canary topic's offsets are what
they were: nothing was written. Control-plane RPCs are refused here by the
identity checks (only a controller certificate may send LeaderAndIsr); what a
trusted but buggy controller could do is out of scope.

Bounded: hypothesis examples are capped so the module runs in well under a
minute; set HIGHWATER_FUZZ_EXAMPLES to run more.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients.records import Record, encode_batch
from protos.highwater.v1 import broker_pb2, common_pb2, controller_pb2, gateway_pb2, gateway_pb2_grpc
from services.security.client import ClientTls
from tests.integration.conftest import TEST_LEASE_TTL_S, TestCluster
from tests.integration.test_security import acl

pytestmark = pytest.mark.integration

MAX_REQUEST_BYTES = 1 << 20
CALL_DEADLINE_S = 1.5
# A call must end within its deadline plus this (the answer of a refused call is immediate).
HANG_SLACK_S = 2.0
EXAMPLES = int(os.environ.get("HIGHWATER_FUZZ_EXAMPLES", "200"))
CANARY = "fz-canary"
SERVICES = {
    "controller-1": controller_pb2.DESCRIPTOR.services_by_name["ControllerService"],
    "broker-1": broker_pb2.DESCRIPTOR.services_by_name["BrokerService"],
    "broker-2": broker_pb2.DESCRIPTOR.services_by_name["BrokerService"],
    "gateway-1": gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"],
}
TARGETS = sorted((process, m.name) for process, svc in SERVICES.items() for m in svc.methods)
MESSAGE_CLASSES = {msg.DESCRIPTOR.full_name: msg for module in (broker_pb2, common_pb2, controller_pb2, gateway_pb2)
                   for msg in (getattr(module, name) for name in dir(module))
                   if isinstance(msg, type) and hasattr(msg, "DESCRIPTOR") and hasattr(msg, "SerializeToString")}


class Harness:
    def __init__(self, cluster: TestCluster) -> None:
        self.cluster = cluster
        tls_dir = cluster.tls_dir
        assert tls_dir is not None
        ca = (tls_dir / "ca.pem").read_bytes()
        self.credentials = {
            "fuzzer": ClientTls(ca, (tls_dir / "fuzzer.pem").read_bytes(), (tls_dir / "fuzzer-key.pem").read_bytes(),
                                None),
            "admin": ClientTls(ca, (tls_dir / "admin.pem").read_bytes(), (tls_dir / "admin-key.pem").read_bytes(),
                               None),
            "none": ClientTls(ca, None, None, None),
        }
        self._channels: dict[tuple[str, str], grpc.Channel] = {}
        self.outcomes: dict[str, int] = {}
        self.unknown: list[str] = []
        self.before: list[int] = []

    def channel(self, process: str, who: str) -> grpc.Channel:
        key = (process, who)
        if key not in self._channels:
            info = self.cluster.processes[process].info
            port = info["client_port"] if who == "none" else info["port"]
            options = [("grpc.max_send_message_length", 64 << 20)]
            self._channels[key] = self.credentials[who].channel(f"127.0.0.1:{port}", options)
        return self._channels[key]

    def call(self, process: str, method: str, payload: bytes, who: str = "fuzzer") -> grpc.StatusCode:
        svc = SERVICES[process]
        path = f"/{svc.full_name}/{method}"
        ch = self.channel(process, who)
        start = time.monotonic()
        code, details = grpc.StatusCode.OK, ""
        try:
            if svc.methods_by_name[method].server_streaming:
                stream = ch.unary_stream(path)(payload, timeout=CALL_DEADLINE_S)
                for n, _ in enumerate(stream):
                    if n >= 3:
                        stream.cancel()
                        break
            else:
                ch.unary_unary(path)(payload, timeout=CALL_DEADLINE_S)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details()
        elapsed = time.monotonic() - start
        assert elapsed <= CALL_DEADLINE_S + HANG_SLACK_S, f"{process} {method} hung for {elapsed:.1f} s"
        self.outcomes[code.name] = self.outcomes.get(code.name, 0) + 1
        if code == grpc.StatusCode.UNKNOWN:
            self.unknown.append(f"{process} {method} {payload[:64]!r}: {details}")
        assert self.cluster.processes[process].running, f"{process} died on {method} with {payload[:200]!r}"
        return code

    def serving(self) -> None:
        for process in SERVICES:
            assert self.cluster.processes[process].running, process
            health = health_pb2_grpc.HealthStub(self.channel(process, "none"))
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING, process

    def canary_offsets(self) -> list[int]:
        gw = gateway_pb2_grpc.GatewayServiceStub(self.channel("gateway-1", "admin"))
        resp = gw.ListOffsets(common_pb2.ListOffsetsRequest(topics=[common_pb2.ListOffsetsTopic(
            topic=CANARY, partitions=[common_pb2.ListOffsetsPartition(partition=p, timestamp=-1) for p in (0, 1)])]),
            timeout=10)
        return [p.offset for p in resp.topics[0].partitions]


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    c = TestCluster(tmp_path_factory.mktemp("fuzz"), brokers=2, lease_ttl_s=TEST_LEASE_TTL_S, tls=True,
                    service_args=["--authorizer", "acl", "--super-users", "User:admin",
                                  "--max-request-bytes", str(MAX_REQUEST_BYTES), "--max-batch-records", "1000",
                                  "--max-concurrent-requests-per-connection", "64"])
    c.start()
    try:
        c.issue_client_certificate("fuzzer")
        h = Harness(c)
        gw = gateway_pb2_grpc.GatewayServiceStub(h.channel("gateway-1", "admin"))
        assert gw.CreateTopics(common_pb2.CreateTopicsRequest(topics=[common_pb2.CreatableTopic(
            name=CANARY, num_partitions=2, replication_factor=2)]), timeout=10).topics[0].error_code == 0
        batch = encode_batch([Record(b"k", b"canary", [], int(time.time() * 1000))])
        resp = gw.Produce(common_pb2.ProduceRequest(acks=-1, timeout_ms=5000, topics=[common_pb2.ProduceTopicData(
            topic=CANARY, partitions=[common_pb2.ProducePartitionData(partition=0, records=batch)])]), timeout=10)
        assert resp.topics[0].partitions[0].error_code == 0
        acl(c, "add", "--principal", "User:fuzzer", "--operation", "Read", "--operation", "Write",
            "--operation", "Describe", "--topic", "fz-", "--prefixed")
        acl(c, "add", "--principal", "User:fuzzer", "--operation", "Read", "--group", "fz-", "--prefixed")
        h.before = h.canary_offsets()
        yield h
    finally:
        c.stop()


# --- strategies: a message of any request type with nonsense in every field -----------------------

NAMES = st.one_of(st.sampled_from(["", CANARY, "fz-x", "/", "..", ".", "a/b", "fz-" + "x" * 300, "\x00", "é",
                                   "User:admin", "*", "highwater-cluster"]), st.text(max_size=40))
INT32 = st.one_of(st.sampled_from([0, -1, -2, -3, 1, 2, 3, 2**31 - 1, -(2**31)]), st.integers(-(2**31), 2**31 - 1))
INT64 = st.one_of(st.sampled_from([0, -1, -2, 2**63 - 1, -(2**63)]), st.integers(-(2**63), 2**63 - 1))


def _corrupted(batch: bytes, position: int) -> bytes:
    """A well-formed batch with one byte changed after the CRC field: it parses, its CRC fails."""
    at = 21 + position % (len(batch) - 21)
    return batch[:at] + bytes([batch[at] ^ 0xFF]) + batch[at + 1:]


# Record bytes: random, or real batches with one byte flipped, so a produce that passes every
# check up to the CRC still must not be written (a valid batch would be a legitimate write).
RECORDS = st.one_of(st.binary(max_size=300),
                    st.builds(lambda n, v, at: _corrupted(encode_batch([Record(None, v, [], 0) for _ in range(n)]), at),
                              st.integers(1, 5), st.binary(max_size=50), st.integers(0, 10_000)))


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32):
        return INT32
    if t in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return INT64
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1)
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_STRING:
        return NAMES
    if t == FieldDescriptor.TYPE_BYTES:
        return RECORDS
    if t == FieldDescriptor.TYPE_ENUM:
        return st.integers(-1, 60)  # unknown values included: proto3 enums are open
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, width=32)
    raise AssertionError(f"no strategy for field type {t} ({field.full_name})")


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    cls = MESSAGE_CLASSES[descriptor.full_name]
    if depth > 3:
        return st.just(cls())
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field, value_field = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            value = (messages(value_field.message_type, depth + 1) if value_field.message_type is not None
                     else _scalar(value_field))
            fields[field.name] = st.dictionaries(_scalar(key_field), value, max_size=3)
            continue
        one = messages(field.message_type, depth + 1) if field.message_type is not None else _scalar(field)
        fields[field.name] = st.lists(one, max_size=3) if field.is_repeated else one

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        msg = cls()
        for name, strategy in fields.items():
            if not draw(st.booleans()):
                continue
            value = draw(strategy)
            target = getattr(msg, name) if hasattr(msg, name) else None
            if isinstance(value, dict):
                for k, v in value.items():
                    if hasattr(target[k], "CopyFrom"):
                        target[k].CopyFrom(v)
                    else:
                        target[k] = v
            elif isinstance(value, list):
                target.extend(value)
            elif hasattr(value, "SerializeToString"):
                getattr(msg, name).CopyFrom(value)
            else:
                setattr(msg, name, value)
        return msg

    return build()


STRUCTURED = st.sampled_from(TARGETS).flatmap(
    lambda t: st.tuples(st.just(t), messages(SERVICES[t[0]].methods_by_name[t[1]].input_type)))
FUZZ_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                HealthCheck.data_too_large])


@FUZZ_SETTINGS
@given(target=st.sampled_from(TARGETS), payload=st.binary(max_size=2048),
       who=st.sampled_from(["fuzzer", "fuzzer", "fuzzer", "none"]))
def test_random_bytes_at_every_method(harness: Harness, target: tuple[str, str], payload: bytes, who: str) -> None:
    harness.call(*target, payload, who=who)


@FUZZ_SETTINGS
@given(case=STRUCTURED)
def test_valid_messages_with_nonsense_values_at_every_method(harness: Harness, case: tuple[tuple[str, str], Any]
                                                            ) -> None:
    (process, method), message = case
    harness.call(process, method, message.SerializeToString())


def test_oversized_requests_are_refused_before_they_are_read(harness: Harness) -> None:
    payload = os.urandom(MAX_REQUEST_BYTES + 1)
    for process in SERVICES:
        method = "Produce" if process != "controller-1" else "CreateTopics"
        assert harness.call(process, method, payload) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_every_service_still_serves_and_nothing_was_written(harness: Harness) -> None:
    """Runs last in this module: the state after every fuzz call above."""
    harness.serving()
    assert harness.canary_offsets() == harness.before
    assert not harness.unknown, f"handlers raised (status UNKNOWN) on: {harness.unknown[:10]}"
    gw = gateway_pb2_grpc.GatewayServiceStub(harness.channel("gateway-1", "admin"))
    batch = encode_batch([Record(None, b"after", [], int(time.time() * 1000))])
    resp = gw.Produce(common_pb2.ProduceRequest(acks=-1, timeout_ms=5000, topics=[common_pb2.ProduceTopicData(
        topic=CANARY, partitions=[common_pb2.ProducePartitionData(partition=1, records=batch)])]), timeout=10)
    assert resp.topics[0].partitions[0].error_code == 0
    print("fuzz outcomes:", dict(sorted(harness.outcomes.items())))
