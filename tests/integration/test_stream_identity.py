"""Liveness streams on a real TLS cluster: only a broker holds its own BrokerHeartbeat, only a
controller a StandbyHeartbeat (issue 37).

One cluster with mutual TLS everywhere (etcd, two controllers, three brokers, a gateway) and a
long lease (LEASE_TTL_S), so that a process noticed by its lease and one noticed by its
connection reset differ by seconds. A hostile client reads broker 1's epoch from Metadata and
opens BrokerHeartbeat as broker 1, with a client certificate without ACLs or with broker 2's
certificate: the controller refuses the stream PERMISSION_DENIED, so when broker 1 is SIGKILLed
its connection reset is still seen and it leaves Metadata within the grace period, not a lease
TTL later. Before issue 37 both forged streams were accepted (controller_epoch 1) and broker 1
stayed in Metadata for its whole lease. StandbyHeartbeat alike: refused to a client's and a
broker's certificate, held by the real standby, which takes over at once when the active
controller is killed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from clients.tls import ClientTls
from protos.highwater.v1 import common_pb2, controller_pb2, controller_pb2_grpc, gateway_pb2_grpc
from tests.integration.conftest import TestCluster
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.integration

# Long enough that a process left to its lease is told apart from one noticed by its connection.
LEASE_TTL_S = 10
# A killed broker leaves Metadata, a killed controller is replaced, this soon: the connection
# grace period (300 ms) plus the revocation and what follows, with room for a loaded 2-core
# machine; far under the lease.
NOTICED_WITHIN_S = 3.0
CALL_TIMEOUT_S = 10.0
HOSTILE = ("mallory", "broker-2")


def channel(c: TestCluster, address: str, name: str) -> grpc.Channel:
    settings = c.client_settings(name)
    tls = ClientTls.from_settings(
        ssl_cafile=settings["ssl_cafile"],
        ssl_certfile=settings["ssl_certfile"],
        ssl_keyfile=settings["ssl_keyfile"],
        auth_token=None,
    )
    assert tls is not None
    return tls.channel(address)


def gateway(c: TestCluster) -> Any:
    return gateway_pb2_grpc.GatewayServiceStub(  # type: ignore[no-untyped-call]
        channel(c, c.gateway_address, "admin")
    )


def active_controller(c: TestCluster) -> tuple[int, int] | None:
    """(controller id, controller epoch) of the controller answering DescribeCluster, if any."""
    try:
        resp = gateway(c).DescribeCluster(common_pb2.DescribeClusterRequest(), timeout=CALL_TIMEOUT_S)
    except grpc.RpcError:
        return None
    return (resp.controller_id, resp.controller_epoch) if resp.error_code == common_pb2.NONE else None


def wait_active(c: TestCluster) -> tuple[int, int]:
    active = wait_for(lambda: active_controller(c), timeout_s=30, what="an active controller")
    assert active is not None
    return active


def controller(c: TestCluster, name: str) -> Any:
    """A ControllerService stub to the active controller, presenting certificate `name`."""
    active = wait_active(c)
    return controller_pb2_grpc.ControllerServiceStub(  # type: ignore[no-untyped-call]
        channel(c, c.processes[f"controller-{active[0]}"].address, name)
    )


def brokers_listed(c: TestCluster) -> dict[int, int]:
    """Broker id -> broker epoch, as the gateway's Metadata lists them (asked by the admin)."""
    resp = gateway(c).Metadata(common_pb2.MetadataRequest(topics=[]), timeout=CALL_TIMEOUT_S)
    return {b.broker_id: b.broker_epoch for b in resp.brokers}


class HeldStream:
    """A liveness stream that sends one request and then holds the call open until `release`."""

    def __init__(self, opened: Callable[[Iterator[Any]], Any], request: Any) -> None:
        self._released = threading.Event()
        self.call = opened(self._requests(request))

    def _requests(self, request: Any) -> Iterator[Any]:
        yield request
        self._released.wait(timeout=LEASE_TTL_S * 3)  # bounded: never outlives the test by much

    def answer(self) -> str:
        """ "accepted" with the controller's epoch, or the status the stream ended with."""
        try:
            first = next(self.call)
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        return f"accepted at controller epoch {first.controller_epoch}"

    def release(self) -> None:
        self._released.set()
        self.call.cancel()


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    """The module's cluster; each test kills another process (a broker, the active controller)."""
    c = TestCluster(
        Path(tmp_path_factory.mktemp("stream-identity")),
        brokers=3,
        controllers=2,
        lease_ttl_s=LEASE_TTL_S,
        tls=True,
    )
    c.start()
    try:
        c.issue_client_certificate("mallory")
        wait_for(lambda: 1 in brokers_listed(c), timeout_s=30, what="broker 1 in Metadata")
        yield c
    finally:
        c.stop()


def test_a_forged_broker_heartbeat_is_refused_and_a_killed_broker_still_leaves_at_once(
    secure: TestCluster,
) -> None:
    epoch = brokers_listed(secure)[1]
    forged = controller_pb2.BrokerHeartbeatRequest(broker_id=1, broker_epoch=epoch)
    held = [HeldStream(controller(secure, name).BrokerHeartbeat, forged) for name in HOSTILE]
    try:
        answers = {name: stream.answer() for name, stream in zip(HOSTILE, held, strict=True)}
        # Broker 1 dies while the forged streams are (or would be) held open.
        killed = time.monotonic()
        secure.kill_broker(1)
        left_s = None
        while time.monotonic() - killed < LEASE_TTL_S * 2:
            if 1 not in brokers_listed(secure):
                left_s = time.monotonic() - killed
                break
            time.sleep(0.05)
    finally:
        for stream in held:
            stream.release()
    assert answers == {
        "mallory": "PERMISSION_DENIED: BrokerHeartbeat is only accepted from broker certificates, "
        "not from User:mallory",
        "broker-2": "PERMISSION_DENIED: BrokerHeartbeat names broker 1 but the certificate is broker-2",
    }
    assert left_s is not None and left_s < NOTICED_WITHIN_S, (
        f"broker 1 left Metadata after {left_s} s (lease {LEASE_TTL_S} s): a forged stream kept it"
    )
    # Broker 1 was noticed by its connection, not its lease: the controller revoked the lease.
    log = "".join(p.log_path.read_text(errors="replace") for p in secure.by_kind("controller"))
    assert "broker 1's connection closed and was not reopened" in log


def test_only_a_controller_holds_a_standby_heartbeat_and_the_real_standby_takes_over_at_once(
    secure: TestCluster,
) -> None:
    first = wait_active(secure)
    standby = 3 - first[0]
    forged = controller_pb2.StandbyHeartbeatRequest(controller_id=standby)
    held = {
        name: HeldStream(controller(secure, name).StandbyHeartbeat, forged)
        for name in ("mallory", "broker-1")
    }
    try:
        answers = {name: stream.answer() for name, stream in held.items()}
    finally:
        for stream in held.values():
            stream.release()
    refused = "PERMISSION_DENIED: StandbyHeartbeat is only accepted from controller certificates, not from"
    assert answers == {"mallory": f"{refused} User:mallory", "broker-1": f"{refused} service broker-1"}
    # The standby's own stream, made with its controller certificate, is held: when the active
    # controller is killed the standby sees the reset and takes over well within the lease.
    killed = time.monotonic()
    secure.kill(f"controller-{first[0]}")
    wait_for(
        lambda: (a := active_controller(secure)) is not None and a[0] == standby and a[1] > first[1],
        timeout_s=LEASE_TTL_S * 2,
        interval_s=0.05,
        what="the standby controller to answer DescribeCluster",
    )
    took_s = time.monotonic() - killed
    log = secure.processes[f"controller-{standby}"].log_path.read_text(errors="replace")
    assert "reset its connections and accepted none" in log, "the standby held no stream to act on"
    assert took_s < NOTICED_WITHIN_S, f"took {took_s:.3f} s with a {LEASE_TTL_S} s lease"
