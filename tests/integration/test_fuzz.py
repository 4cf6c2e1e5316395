"""Malformed, nonsense, hostile and oversized requests at every service: no crash, no hang, no bad write.

Two clusters, one after the other: TLS with ACLs (the configuration these
requests would meet in production) and plaintext (no authentication: what a
private network exposes). Requests go to the controller, both brokers and the
gateway; in TLS mode as an authenticated client without special rights
(User:fuzzer: Read/Write/Describe/Create/Delete/Alter on topics fz-*, Read on
groups fz-*) and sometimes with no credentials at all:

- random bytes as the request payload of a random method (a generic
  unary_unary/unary_stream call with identity serializers);
- structurally valid messages of the method's request type with nonsense
  values (extreme integers, unknown enum values, odd names, random record
  bytes, small repeated and map fields, nested to depth 3), built from the
  protobuf descriptors, so every field of every request is exercised;
- well-formed but hostile record batches: real batches of every codec with
  their contents spoiled (unknown codec, a codec flag on a body it does not fit,
  record counts and offset deltas that lie, flipped bytes, truncated or padded
  record sections) and the CRC recomputed, so only a check of the contents
  can refuse them; produced to the gateway and straight to the brokers;
- requests one byte over --max-request-bytes.

Every call has a deadline and must end within it (a status or an answer); any
status is acceptable except UNKNOWN, which means a handler raised. Afterwards
every process is alive and SERVING, its open files and memory grew by less
than a stated bound, the canary topic's offsets are what they were, and every
record batch stored in the hostile topic decodes: nothing was stored that a
consumer cannot read.

Plaintext mode trusts the network by design (docs/SECURITY.md): anyone may send
a broker LeaderAndIsr or delete a topic, so structured messages skip the
control plane and the calls that change the cluster's shape there (random bytes
still go to every method). In TLS mode they all are fuzzed: identity checks and
ACLs must refuse them.

Bounded: hypothesis examples are capped so the module runs in about a minute
per mode; set HIGHWATER_FUZZ_EXAMPLES to run more.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from crc32c import crc32c
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients.common.record_batch import (
    ATTRIBUTES_POS,
    BATCH_HEADER_SIZE,
    BATCH_LENGTH_POS,
    CRC_POS,
    CRC_START_POS,
    LAST_OFFSET_DELTA_POS,
    LOG_OVERHEAD,
    RECORDS_COUNT_POS,
)
from clients.common.records import COMPRESSION_CODES, Record, decode_batches, encode_batch
from clients.tls import ClientTls
from protos.highwater.v1 import broker_pb2, common_pb2, controller_pb2, gateway_pb2, gateway_pb2_grpc
from tests.integration.conftest import TEST_LEASE_TTL_S, TestCluster
from tests.integration.helpers import consumer_fetch, produce_batch
from tests.integration.test_security import acl

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_REQUEST_BYTES = 1 << 20
CALL_DEADLINE_S = 1.5
# A call must end within its deadline plus this (the answer of a refused call is immediate).
HANG_SLACK_S = 2.0
EXAMPLES = int(os.environ.get("HIGHWATER_FUZZ_EXAMPLES", "200"))
# What a process may gain over the whole fuzz run: a leak of one handle or buffer per
# request would pass these only by luck (each mode sends over a thousand requests).
OPEN_FILES_GROWTH_MAX = 64
RSS_GROWTH_MAX_BYTES = 256 << 20
CANARY = "canary"  # outside the fuzzer's fz-* prefix: it may not write or delete it
HOSTILE = "fz-hostile"
HOSTILE_PARTITIONS = 2
SERVICES = {
    "controller-1": controller_pb2.DESCRIPTOR.services_by_name["ControllerService"],
    "broker-1": broker_pb2.DESCRIPTOR.services_by_name["BrokerService"],
    "broker-2": broker_pb2.DESCRIPTOR.services_by_name["BrokerService"],
    "gateway-1": gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"],
}
TARGETS = sorted((process, m.name) for process, svc in SERVICES.items() for m in svc.methods)
# Plaintext mode lets anyone do these, by design: a structured message there is a legitimate
# (if unwelcome) command, not a fuzz finding, and would tear down the cluster under test.
TRUSTED_NETWORK_ONLY = frozenset(
    {
        "LeaderAndIsr",
        "UpdateMetadata",
        "StopReplica",
        "AlterPartition",
        "ControlledShutdown",
        "BrokerHeartbeat",  # a closed stream naming a live incarnation revokes its lease
        "DeleteTopics",
        "AlterPartitionReassignments",
        "ElectLeaders",
        "CreatePartitions",
    }
)
MESSAGE_CLASSES = {
    msg.DESCRIPTOR.full_name: msg
    for module in (broker_pb2, common_pb2, controller_pb2, gateway_pb2)
    for msg in (getattr(module, name) for name in dir(module))
    if isinstance(msg, type) and hasattr(msg, "DESCRIPTOR") and hasattr(msg, "SerializeToString")
}


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class Harness:
    def __init__(self, cluster: TestCluster, mode: str) -> None:
        self.cluster = cluster
        self.mode = mode
        self.credentials: dict[str, ClientTls] = {}
        if cluster.tls_dir is not None:
            tls_dir = cluster.tls_dir
            ca = (tls_dir / "ca.pem").read_bytes()
            self.credentials = {
                who: ClientTls(
                    ca, (tls_dir / f"{who}.pem").read_bytes(), (tls_dir / f"{who}-key.pem").read_bytes(), None
                )
                for who in ("fuzzer", "admin")
            }
            self.credentials["none"] = ClientTls(ca, None, None, None)
        self._channels: dict[tuple[str, str], grpc.Channel] = {}
        self.outcomes: dict[str, int] = {}
        self.unknown: list[str] = []
        self.before: list[int] = []
        self.resources_before: dict[str, tuple[int, int]] = {}

    def channel(self, process: str, who: str) -> grpc.Channel:
        key = (process, who)
        if key not in self._channels:
            info = self.cluster.processes[process].info
            port = info["client_port"] if who == "none" and self.credentials else info["port"]
            options = [("grpc.max_send_message_length", 64 << 20)]
            address = f"127.0.0.1:{port}"
            self._channels[key] = (
                self.credentials[who].channel(address, options)
                if self.credentials
                else grpc.insecure_channel(address, options)
            )
        return self._channels[key]

    def call(self, process: str, method: str, payload: bytes, who: str = "fuzzer") -> grpc.StatusCode:
        code, _ = self.call_for_answer(process, method, payload, who)
        return code

    def call_for_answer(
        self, process: str, method: str, payload: bytes, who: str = "fuzzer"
    ) -> tuple[grpc.StatusCode, bytes | None]:
        svc = SERVICES[process]
        path = f"/{svc.full_name}/{method}"
        ch = self.channel(process, who)
        start = time.monotonic()
        code, details, answer = grpc.StatusCode.OK, "", None
        try:
            if svc.methods_by_name[method].server_streaming:
                stream = ch.unary_stream(path)(payload, timeout=CALL_DEADLINE_S)
                for n, _ in enumerate(stream):
                    if n >= 3:
                        stream.cancel()
                        break
            else:
                answer = ch.unary_unary(path)(payload, timeout=CALL_DEADLINE_S)
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details()
        elapsed = time.monotonic() - start
        assert elapsed <= CALL_DEADLINE_S + HANG_SLACK_S, f"{process} {method} hung for {elapsed:.1f} s"
        self.outcomes[code.name] = self.outcomes.get(code.name, 0) + 1
        if code == grpc.StatusCode.UNKNOWN:
            self.unknown.append(f"{process} {method} {payload[:64]!r}: {details}")
        assert self.cluster.processes[process].running, f"{process} died on {method} with {payload[:200]!r}"
        return code, answer

    def gateway(self) -> gateway_pb2_grpc.GatewayServiceStub:
        return gateway_pb2_grpc.GatewayServiceStub(self.channel("gateway-1", "admin"))

    def serving(self) -> None:
        for process in SERVICES:
            assert self.cluster.processes[process].running, process
            health = health_pb2_grpc.HealthStub(self.channel(process, "none"))
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING, process

    def end_offsets(self, topic: str, partitions: int) -> list[int]:
        resp = self.gateway().ListOffsets(
            common_pb2.ListOffsetsRequest(
                topics=[
                    common_pb2.ListOffsetsTopic(
                        topic=topic,
                        partitions=[
                            common_pb2.ListOffsetsPartition(partition=p, timestamp=-1)
                            for p in range(partitions)
                        ],
                    )
                ]
            ),
            timeout=10,
        )
        return [p.offset for p in resp.topics[0].partitions]

    def canary_offsets(self) -> list[int]:
        return self.end_offsets(CANARY, 2)

    def resources(self) -> dict[str, tuple[int, int]]:
        """(open files, RSS bytes) of every fuzzed process."""
        out = {}
        for process in SERVICES:
            pid = self.cluster.processes[process].pid
            assert pid is not None, process
            out[process] = (_open_files(pid), _rss_bytes(pid))
        return out

    def read_everything(self, topic: str, partitions: int) -> int:
        """Decode every record below the HW of every partition, as a consumer would; returns the count."""
        records = 0
        for partition, end in enumerate(self.end_offsets(topic, partitions)):
            offset = 0
            while offset < end:
                resp = self.gateway().Fetch(
                    consumer_fetch(topic, partition, offset, max_bytes=4 << 20, partition_max_bytes=4 << 20),
                    timeout=10,
                )
                part = resp.topics[0].partitions[0]
                assert part.error_code == common_pb2.NONE, (topic, partition, offset, part.error_message)
                decoded = list(
                    decode_batches(part.records)
                )  # raises CorruptMessage on what a consumer cannot read
                assert decoded, f"{topic}-{partition}: no record at offset {offset} below the end {end}"
                records += len(decoded)
                offset = decoded[-1].offset + 1
        return records


def _start_cluster(base: Any, mode: str) -> TestCluster:
    limits_args = [
        "--max-request-bytes",
        str(MAX_REQUEST_BYTES),
        "--max-batch-records",
        "1000",
        "--max-concurrent-requests-per-connection",
        "64",
    ]
    if mode == "tls":
        c = TestCluster(
            base,
            brokers=2,
            lease_ttl_s=TEST_LEASE_TTL_S,
            tls=True,
            service_args=["--authorizer", "acl", "--super-users", "User:admin", *limits_args],
        )
    else:
        c = TestCluster(base, brokers=2, lease_ttl_s=TEST_LEASE_TTL_S, service_args=limits_args)
    return c.start()


@pytest.fixture(scope="module", params=["tls", "plaintext"])
def harness(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    mode = request.param
    c = _start_cluster(tmp_path_factory.mktemp(f"fuzz-{mode}"), mode)
    try:
        if mode == "tls":
            c.issue_client_certificate("fuzzer")
        h = Harness(c, mode)
        gw = h.gateway()
        created = gw.CreateTopics(
            common_pb2.CreateTopicsRequest(
                topics=[
                    common_pb2.CreatableTopic(name=CANARY, num_partitions=2, replication_factor=2),
                    common_pb2.CreatableTopic(
                        name=HOSTILE, num_partitions=HOSTILE_PARTITIONS, replication_factor=2
                    ),
                ]
            ),
            timeout=10,
        )
        assert [t.error_code for t in created.topics] == [0, 0], created
        batch = encode_batch([Record(b"k", b"canary", [], int(time.time() * 1000))])
        for topic in (CANARY, HOSTILE):
            result = produce_batch(gw, topic, 0, batch, acks=-1, timeout_ms=5000, timeout=10)
            assert result.error_code == 0, result
        if mode == "tls":
            acl(
                c,
                "add",
                "--principal",
                "User:fuzzer",
                "--operation",
                "Read",
                "--operation",
                "Write",
                "--operation",
                "Describe",
                "--operation",
                "Create",
                "--operation",
                "Delete",
                "--operation",
                "Alter",
                "--topic",
                "fz-",
                "--prefixed",
            )
            acl(c, "add", "--principal", "User:fuzzer", "--operation", "Read", "--group", "fz-", "--prefixed")
        h.before = h.canary_offsets()
        h.resources_before = h.resources()
        yield h
    finally:
        c.stop()


def _allowed(harness: Harness, method: str) -> bool:
    return harness.mode == "tls" or method not in TRUSTED_NETWORK_ONLY


# --- strategies: a message of any request type with nonsense in every field -----------------------

NAMES = st.one_of(
    st.sampled_from(
        [
            "",
            CANARY,
            "fz-x",
            HOSTILE,
            "/",
            "..",
            ".",
            "a/b",
            "fz-" + "x" * 300,
            "\x00",
            "é",
            "fz-\n",
            "User:admin",
            "*",
            "highwater-cluster",
        ]
    ),
    st.text(max_size=40),
)
INT32 = st.one_of(
    st.sampled_from([0, -1, -2, -3, 1, 2, 3, 2**31 - 1, -(2**31)]), st.integers(-(2**31), 2**31 - 1)
)
INT64 = st.one_of(st.sampled_from([0, -1, -2, 2**63 - 1, -(2**63)]), st.integers(-(2**63), 2**63 - 1))


def _corrupted(batch: bytes, position: int) -> bytes:
    """A well-formed batch with one byte changed after the CRC field: it parses, its CRC fails."""
    at = 21 + position % (len(batch) - 21)
    return batch[:at] + bytes([batch[at] ^ 0xFF]) + batch[at + 1 :]


# Record bytes: random, or real batches with one byte flipped, so a produce that passes every
# check up to the CRC still must not be written (a valid batch would be a legitimate write).
RECORDS = st.one_of(
    st.binary(max_size=300),
    st.builds(
        lambda n, v, at: _corrupted(encode_batch([Record(None, v, [], 0) for _ in range(n)]), at),
        st.integers(1, 5),
        st.binary(max_size=50),
        st.integers(0, 10_000),
    ),
)


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
            key_field, value_field = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            value = (
                messages(value_field.message_type, depth + 1)
                if value_field.message_type is not None
                else _scalar(value_field)
            )
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


# --- hostile batches: a valid CRC over contents no consumer can read -------------------------------


def _with_crc(batch: bytearray) -> bytes:
    """The batch with its CRC recomputed, so that only a check of its contents can refuse it."""
    struct.pack_into(">I", batch, CRC_POS, crc32c(bytes(batch[CRC_START_POS:])))
    return bytes(batch)


def _set_length(batch: bytearray) -> bytearray:
    struct.pack_into(">i", batch, BATCH_LENGTH_POS, len(batch) - LOG_OVERHEAD)
    return batch


def _codec(code: int) -> Callable[[bytearray, int], bytearray]:
    def spoil(batch: bytearray, _: int) -> bytearray:
        attributes = struct.unpack_from(">h", batch, ATTRIBUTES_POS)[0]
        struct.pack_into(">h", batch, ATTRIBUTES_POS, (attributes & ~0x07) | code)
        return batch

    return spoil


def _records_count(count: int) -> Callable[[bytearray, int], bytearray]:
    def spoil(batch: bytearray, _: int) -> bytearray:
        struct.pack_into(">i", batch, RECORDS_COUNT_POS, count)
        struct.pack_into(">i", batch, LAST_OFFSET_DELTA_POS, count - 1)
        return batch

    return spoil


def _flip(batch: bytearray, at: int) -> bytearray:
    if len(batch) > BATCH_HEADER_SIZE:
        position = BATCH_HEADER_SIZE + at % (len(batch) - BATCH_HEADER_SIZE)
        batch[position] ^= 0xFF
    return batch


def _truncate(batch: bytearray, at: int) -> bytearray:
    return _set_length(batch[: BATCH_HEADER_SIZE + at % max(len(batch) - BATCH_HEADER_SIZE, 1)])


def _pad(batch: bytearray, at: int) -> bytearray:
    return _set_length(batch + bytes([at % 256]) * (1 + at % 7))


# Each keeps the header parseable and the CRC right; each spoils what the records say.
SPOILERS: dict[str, Callable[[bytearray, int], bytearray]] = {
    "codec 5": _codec(5),
    "codec 6": _codec(6),
    "codec 7": _codec(7),
    "gzip flag": _codec(1),
    "zstd flag": _codec(4),
    "no codec flag": _codec(0),
    "records_count 2^31-1": _records_count(2**31 - 1),
    "records_count +1": lambda b, a: _records_count(struct.unpack_from(">i", b, RECORDS_COUNT_POS)[0] + 1)(
        b, a
    ),
    "records_count 0": _records_count(0),
    "flipped byte": _flip,
    "truncated records": _truncate,
    "padded records": _pad,
}


@st.composite
def hostile_batches(draw: st.DrawFn) -> tuple[str, bytes]:
    codec = draw(st.sampled_from(sorted(COMPRESSION_CODES)))
    now_ms = int(time.time() * 1000)
    records = [
        Record(
            draw(st.one_of(st.none(), st.binary(max_size=8))),
            draw(st.binary(max_size=40)),
            [("h", b"v")] if draw(st.booleans()) else [],
            now_ms,
        )
        for _ in range(draw(st.integers(1, 6)))
    ]
    spoiler = draw(st.sampled_from(sorted(SPOILERS)))
    batch = bytearray(encode_batch(records, compression=codec))
    return f"{spoiler} on {codec}", _with_crc(SPOILERS[spoiler](batch, draw(st.integers(0, 10_000))))


STRUCTURED = st.sampled_from(TARGETS).flatmap(
    lambda t: st.tuples(st.just(t), messages(SERVICES[t[0]].methods_by_name[t[1]].input_type))
)
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


@FUZZ_SETTINGS
@given(
    target=st.sampled_from(TARGETS),
    payload=st.binary(max_size=2048),
    who=st.sampled_from(["fuzzer", "fuzzer", "fuzzer", "none"]),
)
def test_random_bytes_at_every_method(
    harness: Harness, target: tuple[str, str], payload: bytes, who: str
) -> None:
    harness.call(*target, payload, who=who)


@FUZZ_SETTINGS
@given(case=STRUCTURED)
def test_valid_messages_with_nonsense_values_at_every_method(
    harness: Harness, case: tuple[tuple[str, str], Any]
) -> None:
    (process, method), message = case
    if _allowed(harness, method):
        harness.call(process, method, message.SerializeToString())


@FUZZ_SETTINGS
@given(
    case=hostile_batches(),
    process=st.sampled_from(["gateway-1", "broker-1", "broker-2"]),
    partition=st.integers(0, HOSTILE_PARTITIONS - 1),
    acks=st.sampled_from([-1, 1, 0]),
)
def test_well_formed_batches_with_hostile_contents_are_refused(
    harness: Harness, case: tuple[str, bytes], process: str, partition: int, acks: int
) -> None:
    what, batch = case
    request = common_pb2.ProduceRequest(
        acks=acks,
        timeout_ms=1000,
        topics=[
            common_pb2.ProduceTopicData(
                topic=HOSTILE,
                partitions=[common_pb2.ProducePartitionData(partition=partition, records=batch)],
            )
        ],
    )
    code, answer = harness.call_for_answer(process, "Produce", request.SerializeToString())
    if code != grpc.StatusCode.OK or answer is None or acks == 0:
        return
    result = common_pb2.ProduceResponse.FromString(answer).topics[0].partitions[0]
    # Some spoilers leave a batch that still decodes (a flipped byte inside a value, a codec
    # flag equal to the batch's own): accepting those is right. Whatever was accepted is
    # checked by decoding it at the end (test_every_service_...).
    outcome = (
        f"accepted: {what}"
        if result.error_code == common_pb2.NONE
        else f"refused {common_pb2.ErrorCode.Name(result.error_code)}"
    )
    harness.outcomes[outcome] = harness.outcomes.get(outcome, 0) + 1


def test_oversized_requests_are_refused_before_they_are_read(harness: Harness) -> None:
    payload = os.urandom(MAX_REQUEST_BYTES + 1)
    for process in SERVICES:
        method = "Produce" if process != "controller-1" else "CreateTopics"
        assert harness.call(process, method, payload) == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_every_service_still_serves_nothing_unreadable_was_stored_and_nothing_leaked(
    harness: Harness,
) -> None:
    """Runs last in this module: the state after every fuzz call above."""
    harness.serving()
    assert harness.canary_offsets() == harness.before
    assert not harness.unknown, f"handlers raised (status UNKNOWN) on: {harness.unknown[:10]}"
    readable = harness.read_everything(HOSTILE, HOSTILE_PARTITIONS)
    after = harness.resources()
    for process, (files, rss) in after.items():
        files_before, rss_before = harness.resources_before[process]
        assert files - files_before <= OPEN_FILES_GROWTH_MAX, (
            f"{process}: open files {files_before} -> {files} after the fuzz run"
        )
        assert rss - rss_before <= RSS_GROWTH_MAX_BYTES, (
            f"{process}: RSS {rss_before >> 20} MiB -> {rss >> 20} MiB after the fuzz run"
        )
    gw = harness.gateway()
    batch = encode_batch([Record(None, b"after", [], int(time.time() * 1000))])
    assert produce_batch(gw, CANARY, 1, batch, acks=-1, timeout_ms=5000, timeout=10).error_code == 0
    print(f"fuzz ({harness.mode}) outcomes:", dict(sorted(harness.outcomes.items())))
    print(f"fuzz ({harness.mode}) records readable in {HOSTILE}: {readable}")
    print(
        f"fuzz ({harness.mode}) open files and RSS MiB before -> after:",
        {
            p: f"{harness.resources_before[p][0]}->{f}, {harness.resources_before[p][1] >> 20}->{r >> 20}"
            for p, (f, r) in after.items()
        },
    )
