"""Fast crash detection on real processes: the brokers' liveness streams to the controller, and
the standby controllers' streams to the active one.

A broker killed with SIGKILL resets its connections at once; the controller revokes its
lease after the grace period (300 ms) and its partitions move well within the lease TTL.
A broker paused with SIGSTOP keeps its connections open: only its lease expiring moves
its partitions, so the lease stays the authority for silent failures. The same holds for
an active controller and its standby.
"""

from __future__ import annotations

import json
import time

import pytest

from protos.highwater.v1 import common_pb2, gateway_pb2_grpc
from tests.integration.helpers import create_topic, etcd_value, gateway_stub, produce, wait_for
from tests.integration.test_metrics import scrape

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LEASE_TTL_S = 6  # the default: the point is to be well under it
PARTITIONS = 6


def leaders(gw: gateway_pb2_grpc.GatewayServiceStub, topic: str) -> dict[int, int]:
    resp = gw.DescribeCluster(common_pb2.DescribeClusterRequest(), timeout=5)
    return {p.partition: p.leader for p in resp.partitions if p.topic == topic}


def busiest_leader(gw: gateway_pb2_grpc.GatewayServiceStub, topic: str) -> tuple[int, list[int]]:
    """The broker leading the most partitions of topic, and those partitions."""
    led: dict[int, list[int]] = {}
    for partition, leader in leaders(gw, topic).items():
        led.setdefault(leader, []).append(partition)
    broker = max(led, key=lambda b: len(led[b]))
    return broker, sorted(led[broker])


def writable(gw: gateway_pb2_grpc.GatewayServiceStub, topic: str, partitions: list[int]) -> bool:
    return all(
        produce(gw, topic, p, [b"after"], timeout_ms=1_000).error_code == common_pb2.NONE for p in partitions
    )


def moved_from(
    gw: gateway_pb2_grpc.GatewayServiceStub, topic: str, partitions: list[int], broker: int
) -> bool:
    now = leaders(gw, topic)
    return all(now[p] not in (-1, broker) for p in partitions)


def start(make_cluster, topic: str, controllers: int = 1):  # type: ignore[no-untyped-def]
    c = make_cluster(brokers=3, controllers=controllers, lease_ttl_s=LEASE_TTL_S)
    gw = gateway_stub(c.gateway_address)
    assert create_topic(gw, topic, partitions=PARTITIONS).error_code == 0
    wait_for(lambda: writable(gw, topic, list(range(PARTITIONS))), timeout_s=30, what=f"{topic} writable")
    broker, led = busiest_leader(gw, topic)
    return c, gw, broker, led


def kill_until_healed(c, gw, topic, broker, led) -> float:
    """SIGKILL `broker`; seconds until every partition it led has moved and takes writes."""
    killed = time.monotonic()
    c.kill_broker(broker)
    wait_for(
        lambda: moved_from(gw, topic, led, broker) and writable(gw, topic, led),
        timeout_s=LEASE_TTL_S + 5,
        interval_s=0.02,
        what=f"partitions {led} of killed broker {broker} to move and take writes",
    )
    return time.monotonic() - killed


def test_killed_broker_loses_its_leaderships_well_within_the_lease_ttl(make_cluster):
    c, gw, broker, led = start(make_cluster, "crash")
    took_s = kill_until_healed(c, gw, "crash", broker, led)
    print(f"SIGKILL of broker {broker} leading {len(led)} partitions: all writable after {took_s:.3f} s")
    assert took_s < 3.0, f"took {took_s:.3f} s with a {LEASE_TTL_S} s lease: the connection path did not act"
    log = c.processes["controller-1"].log_path.read_text(errors="replace")
    assert f"broker {broker}'s connection closed and was not reopened" in log


def test_paused_broker_loses_its_leaderships_only_when_its_lease_expires(make_cluster):
    c, gw, broker, led = start(make_cluster, "paused")
    name = f"broker-{broker}"
    paused = time.monotonic()
    c.pause(name)
    try:
        # Well past the grace period (300 ms) and below the earliest expiry of a 6 s lease kept
        # alive every 1.5 s: nothing may move, since the paused broker's connections stay open.
        while time.monotonic() - paused < 3.0:
            assert leaders(gw, "paused")[led[0]] == broker, "moved before the lease expired"
            time.sleep(0.1)
        wait_for(
            lambda: moved_from(gw, "paused", led, broker),
            timeout_s=LEASE_TTL_S + 5,
            what=f"partitions {led} of paused broker {broker} to move after its lease expired",
        )
        took_s = time.monotonic() - paused
        print(
            f"SIGSTOP of broker {broker}: leaderships moved after {took_s:.3f} s (lease TTL {LEASE_TTL_S} s)"
        )
        assert took_s > 3.0
        log = c.processes["controller-1"].log_path.read_text(errors="replace")
        assert f"broker {broker}'s connection closed" not in log
    finally:
        c.resume(name)
    # The resumed broker finds its lease gone, registers again and stops cleanly.
    assert c.terminate(name) == 0


def test_brokers_hold_their_stream_to_a_new_controller(make_cluster):
    c, gw, broker, led = start(make_cluster, "handover", controllers=2)

    def active() -> int | None:
        raw = etcd_value(c.etcd_endpoint, "/highwater/controller")
        return json.loads(raw)["controller_id"] if raw else None

    first = active()
    assert c.terminate(f"controller-{first}") == 0  # resigns: the standby takes over at once
    second = wait_for(
        lambda: (a := active()) not in (None, first) and a, timeout_s=LEASE_TTL_S + 5, what="a new controller"
    )
    wait_for(lambda: writable(gw, "handover", led), timeout_s=30, what="the new controller to serve")
    wait_for(
        lambda: scrape(c, f"controller-{second}").get("highwater_controller_connected_brokers") == 3,
        timeout_s=10,
        what="every broker's stream to reach the new controller",
    )
    # Streams moved to the new controller: a killed broker is again noticed by its connection.
    took_s = kill_until_healed(c, gw, "handover", broker, led)
    print(f"after the handover to controller {second}: SIGKILL of broker {broker} healed in {took_s:.3f} s")
    assert took_s < 3.0
    log = c.processes[f"controller-{second}"].log_path.read_text(errors="replace")
    assert f"broker {broker}'s connection closed and was not reopened" in log


def active_controller(c) -> dict | None:  # type: ignore[no-untyped-def]
    raw = etcd_value(c.etcd_endpoint, "/highwater/controller")
    return json.loads(raw) if raw else None


def serving_controller(gw: gateway_pb2_grpc.GatewayServiceStub) -> tuple[int, int] | None:
    """(controller id, epoch) of the controller answering DescribeCluster through the gateway."""
    try:
        resp = gw.DescribeCluster(common_pb2.DescribeClusterRequest(), timeout=2)
    except Exception:
        return None
    return (resp.controller_id, resp.controller_epoch) if resp.error_code == common_pb2.NONE else None


def test_killed_controller_is_replaced_well_within_the_lease_ttl(make_cluster):
    c, gw, _, _ = start(make_cluster, "ctl-crash", controllers=2)
    first = active_controller(c)
    assert first is not None
    standby = 3 - first["controller_id"]
    # The standby's stream to the active controller is open before the kill (its log says nothing
    # until it acts, so wait for the stream on the active side: a standby connects within ~0.2 s).
    killed = time.monotonic()
    c.kill(f"controller-{first['controller_id']}")
    wait_for(
        lambda: (s := serving_controller(gw)) is not None and s[0] == standby and s[1] > first["epoch"],
        timeout_s=LEASE_TTL_S + 5,
        interval_s=0.02,
        what="the standby controller to answer DescribeCluster",
    )
    took_s = time.monotonic() - killed
    print(f"SIGKILL of the active controller: the standby answered after {took_s:.3f} s")
    log = c.processes[f"controller-{standby}"].log_path.read_text(errors="replace")
    assert "reset its connections and accepted none" in log, "the standby did not act on the reset"
    assert took_s < 3.0, f"took {took_s:.3f} s with a {LEASE_TTL_S} s lease: the connection path did not act"
    # It manages the cluster: a topic created now is writable.
    assert create_topic(gw, "after-ctl-crash", partitions=2).error_code == 0
    wait_for(lambda: writable(gw, "after-ctl-crash", [0, 1]), timeout_s=30, what="a topic created after")


def test_paused_controller_is_replaced_only_when_its_lease_expires(make_cluster):
    c, _, _, _ = start(make_cluster, "ctl-paused", controllers=2)
    first = active_controller(c)
    assert first is not None
    name = f"controller-{first['controller_id']}"
    standby = 3 - first["controller_id"]
    paused = time.monotonic()
    c.pause(name)
    try:
        # Its connections stay open: nothing may change before its 6 s lease (kept alive every
        # 1.5 s) can expire.
        while time.monotonic() - paused < 3.0:
            now = active_controller(c)
            assert now is not None and now["epoch"] == first["epoch"], "replaced before its lease expired"
            time.sleep(0.1)
        wait_for(
            lambda: (a := active_controller(c)) is not None and a["controller_id"] == standby,
            timeout_s=LEASE_TTL_S + 5,
            what="the standby to win once the paused controller's lease expired",
        )
        log = c.processes[f"controller-{standby}"].log_path.read_text(errors="replace")
        assert "reset its connections" not in log
    finally:
        c.resume(name)
    # The resumed controller finds its lease gone, stands by, and stops cleanly.
    assert c.terminate(name) == 0
