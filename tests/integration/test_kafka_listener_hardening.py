"""The Kafka listener's answers, frames and connection bounds against real brokers (issue 37).

- A refused JoinGroup below v7 is answered: aiokafka (JoinGroup v5) asks a broker that does not
  coordinate the group, with a group id the broker refuses, and (on a TLS cluster with ACLs) as a
  principal no ACL allows; each gets its error at once instead of a connection left hanging
  (the answer once failed to encode and nothing said so).
- A frame body that does not arrive closes its connection at --kafka-request-body-timeout-ms,
  and bodies read in part share --kafka-partial-frame-bytes-max: eight connections announcing
  60 MiB and sending all but a byte no longer grow the broker by ~500 MiB.
- --kafka-connections-per-ip-max: 1,050 idle connections from 127.0.0.2 no longer lock other
  clients out; ApiVersions from 127.0.0.3 is answered and a librdkafka producer delivers.

One cluster (etcd, a controller, 3 brokers, a gateway) with short Kafka bounds set by flag.
Every wait is bounded; every socket a test opens is closed by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.group import JoinGroupRequest

from services.kafka import protocol
from services.kafka.classic_groups import coordinator_of
from tests.integration.conftest import TEST_LEASE_TTL_S, TestCluster
from tests.integration.test_kafka_protocol import create, kafka_address, read_answer
from tests.integration.test_security import acl_cluster
from tests.unit.test_kafka_listener import framed
from tests.unit.test_kafka_protocol import request_frame

pytestmark = pytest.mark.integration

BODY_TIMEOUT_MS = 2_000
PARTIAL_FRAME_BYTES_MAX = 64 * 1024 * 1024  # the largest request: one at a time in part
PER_IP_MAX = 50
WAIT_S = 30.0  # every wait's bound; CI machines are shared
MIB = 1024 * 1024

NOT_COORDINATOR = 16
INVALID_GROUP_ID = 24
GROUP_AUTHORIZATION_FAILED = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(
        tmp_path_factory.mktemp("kafka-hardening"),
        brokers=3,
        lease_ttl_s=TEST_LEASE_TTL_S,
        broker_args=[
            "--kafka-request-body-timeout-ms",
            str(BODY_TIMEOUT_MS),
            "--kafka-partial-frame-bytes-max",
            str(PARTIAL_FRAME_BYTES_MAX),
            "--kafka-connections-per-ip-max",
            str(PER_IP_MAX),
        ],
    )
    c.start()
    try:
        yield c
    finally:
        c.stop()


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {pid}")


def closed_within(sock: socket.socket, timeout_s: float) -> bool:
    """True when the broker closes `sock` within timeout_s (it sends nothing before)."""
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


# ---- fault 1: refused JoinGroup below v7 ----------------------------------------------------


def test_refused_join_group_below_v7_is_answered_to_a_real_client(cluster: TestCluster) -> None:
    broker_ids = [1, 2, 3]
    group = next(g for i in range(100) if coordinator_of(g := f"join-{i}", broker_ids) == 1)
    elsewhere = 2  # not the group's coordinator

    async def join(client: AIOKafkaClient, node_id: int, group_id: str) -> tuple[int, int, float]:
        request = JoinGroupRequest(group_id, 10_000, 10_000, "", None, "consumer", [("range", b"")])
        started = time.monotonic()
        response = await asyncio.wait_for(client.send(node_id, request), WAIT_S)
        return response.API_VERSION, response.error_code, time.monotonic() - started

    async def main() -> list[tuple[int, int, float]]:
        client = AIOKafkaClient(
            bootstrap_servers=cluster.kafka_bootstrap(), request_timeout_ms=int(WAIT_S * 1000)
        )
        await client.bootstrap()
        try:
            return [
                await join(client, elsewhere, group),
                await join(client, 1, "bad/group"),  # '/' cannot name a group here
            ]
        finally:
            await client.close()

    (not_coordinator, invalid) = asyncio.run(main())
    print(f"JoinGroup refusals: NOT_COORDINATOR {not_coordinator}, INVALID_GROUP_ID {invalid}")
    assert not_coordinator[:2] == (5, NOT_COORDINATOR) and not_coordinator[2] < 5.0
    assert invalid[:2] == (5, INVALID_GROUP_ID) and invalid[2] < 5.0


def test_join_group_refused_by_the_acls_below_v7_is_answered(tmp_path: Path) -> None:
    """GROUP_AUTHORIZATION_FAILED at JoinGroup v5, over mutual TLS with a principal no ACL allows."""
    c = acl_cluster(tmp_path / "acl-cluster")
    c.start()
    try:
        settings = c.issue_client_certificate("mallory")
        context = ssl.create_default_context(cafile=settings["ssl_cafile"])
        context.load_cert_chain(settings["ssl_certfile"], settings["ssl_keyfile"])

        async def main() -> tuple[int, int, float]:
            client = AIOKafkaClient(
                bootstrap_servers=c.kafka_bootstrap(),
                security_protocol="SSL",
                ssl_context=context,
                request_timeout_ms=int(WAIT_S * 1000),
            )
            await client.bootstrap()
            try:
                request = JoinGroupRequest(
                    "mallorys-group", 10_000, 10_000, "", None, "consumer", [("range", b"")]
                )
                started = time.monotonic()
                response = await asyncio.wait_for(client.send(1, request), WAIT_S)
                return response.API_VERSION, response.error_code, time.monotonic() - started
            finally:
                await client.close()

        answer = asyncio.run(main())
    finally:
        c.stop()
    print(f"JoinGroup refusal: GROUP_AUTHORIZATION_FAILED {answer}")
    assert answer[:2] == (5, GROUP_AUTHORIZATION_FAILED) and answer[2] < 5.0


# ---- fault 4: frame bodies bounded in time and memory ---------------------------------------


def test_a_body_that_stalls_is_closed_at_the_body_deadline(cluster: TestCluster) -> None:
    with socket.create_connection(kafka_address(cluster, 1), timeout=WAIT_S) as s:
        s.sendall(struct.pack(">i", MIB) + b"\0" * 100)  # announces 1 MiB, sends 100 bytes
        started = time.monotonic()
        assert closed_within(s, WAIT_S), f"still open {WAIT_S} s later"
        took_s = time.monotonic() - started
    print(f"stalled body: connection closed after {took_s:.2f} s (deadline {BODY_TIMEOUT_MS} ms)")
    assert BODY_TIMEOUT_MS / 1000 - 0.5 <= took_s < BODY_TIMEOUT_MS / 1000 + 3.0


def test_bodies_read_in_part_share_one_budget_and_the_broker_stays_small(cluster: TestCluster) -> None:
    pid = cluster.broker_pid(1)
    assert pid is not None
    announced = 60 * MIB
    before = rss_bytes(pid)
    sockets = [socket.create_connection(kafka_address(cluster, 1), timeout=WAIT_S) for _ in range(8)]
    peak = before

    def send_all_but_a_byte(s: socket.socket) -> None:
        with contextlib.suppress(OSError):  # the broker may close it mid-way: that is the point
            s.sendall(struct.pack(">i", announced) + b"\0" * (announced - 1))

    try:
        senders = [threading.Thread(target=send_all_but_a_byte, args=(s,)) for s in sockets]
        for t in senders:
            t.start()
        deadline = time.monotonic() + WAIT_S
        while any(t.is_alive() for t in senders) and time.monotonic() < deadline:
            peak = max(peak, rss_bytes(pid))
            time.sleep(0.05)
        sent_at = time.monotonic()
        assert not any(t.is_alive() for t in senders), f"the senders did not finish within {WAIT_S} s"
        closed = [
            closed_within(s, max(0.1, sent_at + BODY_TIMEOUT_MS / 1000 + 5.0 - time.monotonic()))
            for s in sockets
        ]
        took_s = time.monotonic() - sent_at
        peak = max(peak, rss_bytes(pid))
    finally:
        for s in sockets:
            s.close()
    grown = peak - before
    print(
        f"8 x 60 MiB partial bodies: broker RSS {before / MIB:.0f} MiB before, peak {peak / MIB:.0f} MiB "
        f"(+{grown / MIB:.0f} MiB); all closed {took_s:.2f} s after the last byte sent"
    )
    assert all(closed), f"{closed.count(False)} of 8 still open after the body deadline"
    # The budget (64 MiB) plus a piece per connection and the allocator's slack; unbounded, the
    # eight bodies took ~500 MiB.
    assert grown < PARTIAL_FRAME_BYTES_MAX + 100 * MIB, f"broker grew by {grown / MIB:.0f} MiB"


# ---- fault 5: one client address cannot take every connection ------------------------------


def api_versions_from(address: tuple[str, int], local: str) -> Any:
    body = protocol.build(
        protocol.request_class(protocol.API_VERSIONS, 3),
        client_software_name="t",
        client_software_version="1",
    )
    with socket.create_connection(address, timeout=WAIT_S, source_address=(local, 0)) as s:
        return read_answer(protocol.API_VERSIONS, 3, _call(s, protocol.API_VERSIONS, 3, body))


def _call(s: socket.socket, api_key: int, version: int, body: Any) -> bytes:
    """raw_call's exchange on a socket already open (bound to a source address)."""
    s.sendall(framed(request_frame(api_key, version, body, correlation_id=7)))
    (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
    return s.recv(size, socket.MSG_WAITALL)


def test_idle_connections_from_one_address_do_not_lock_out_the_others(cluster: TestCluster) -> None:
    create(cluster, "kafka-fairness", partitions=1)
    address = kafka_address(cluster, 1)
    flood: list[socket.socket] = []
    try:
        deadline = time.monotonic() + WAIT_S
        while len(flood) < 1_050 and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                flood.append(socket.create_connection(address, timeout=5.0, source_address=("127.0.0.2", 0)))
        assert len(flood) == 1_050, f"opened {len(flood)} of 1,050 connections from 127.0.0.2"
        answer = api_versions_from(address, "127.0.0.3")
        assert answer.error_code == 0 and answer.api_keys, "another address is still answered"

        producer = confluent_kafka.Producer(
            {"bootstrap.servers": f"{address[0]}:{address[1]}", "acks": "all", "message.timeout.ms": 20_000}
        )
        delivered: list[Any] = []
        errors: list[Any] = []
        for i in range(10):
            producer.produce(
                "kafka-fairness",
                value=f"v{i}".encode(),
                on_delivery=lambda err, msg: (errors if err else delivered).append(err or msg),
            )
        left = producer.flush(WAIT_S)
        assert (left, errors, len(delivered)) == (0, [], 10), "a producer from 127.0.0.1 still delivers"
        still_open = sum(not closed_within(s, 0.05) for s in flood)
        print(
            f"1,050 idle connections from 127.0.0.2: {still_open} kept open (per-address bound {PER_IP_MAX})"
        )
        assert still_open <= PER_IP_MAX

    finally:
        for s in flood:
            s.close()
