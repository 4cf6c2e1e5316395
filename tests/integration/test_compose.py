"""The container deployment, really run: deploy/docker-compose.test.yml on this machine.

Builds the image with deploy/build_image.py (installs docker.io, docker-compose
and debootstrap with apt when missing, starts dockerd when none answers, makes
the debootstrap base image once and reuses it), brings up three etcd members,
two controllers, three brokers and a gateway with host networking on
127.0.0.1, waits until Docker calls every container healthy, then creates a
topic, produces and consumes through the gateway, reads the records back
through the brokers' Kafka listeners (confluent-kafka), SIGKILLs the container of a
partition leader and checks that a new leader is elected from the ISR and
that every acknowledged record is still there at its offset.

Everything the test brings up is torn down in `finally` (`docker-compose down
-v`), and a dockerd the test started is stopped by its pid. Skipped only when
docker or debootstrap is missing and cannot be installed (no apt-get, not
root). Wall times of each phase are printed.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import confluent_kafka
import pytest

from protos.highwater.v1 import common_pb2
from tests.integration.helpers import (
    create_topic,
    describe_partition,
    fetch_all,
    gateway_stub,
    produce,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "deploy" / "docker-compose.test.yml"
# A fixed project name, so a run that died half-way is cleaned up by the next one.
PROJECT = "hwcomposetest"
IMAGE = "highwater:dev"

# The ports deploy/docker-compose.test.yml gives each service on 127.0.0.1.
GATEWAY_ADDRESS = "127.0.0.1:19092"
KAFKA_BOOTSTRAP = "127.0.0.1:19301,127.0.0.1:19302,127.0.0.1:19303"
PORTS = (
    19379,
    19380,
    19381,
    19382,
    19383,
    19384,  # etcd client/peer
    19093,
    19094,
    19193,
    19194,  # controllers: gRPC, metrics
    19101,
    19102,
    19103,
    19201,
    19202,
    19203,
    19301,
    19302,
    19303,  # brokers: gRPC, metrics, Kafka
    19092,
    19192,
)  # gateway: gRPC, metrics
SERVICES = (
    "etcd-1",
    "etcd-2",
    "etcd-3",
    "controller-1",
    "controller-2",
    "broker-1",
    "broker-2",
    "broker-3",
    "gateway",
)

# Cold: apt-get of the tools (~20 s), debootstrap (~1 min), image build (~2 min).
TEST_TIMEOUT_S = 900
# `up -d` itself waits for the etcd members to be healthy (depends_on).
COMPOSE_UP_TIMEOUT_S = 180.0
# Health checks run every 2 s; a Python service is ready in a few seconds.
HEALTHY_TIMEOUT_S = 120.0
# Lease TTL is 3 s in the test compose file; the rest is election and metadata.
FAILOVER_TIMEOUT_S = 60.0
# The controller is elected once it is healthy; its first CreateTopics may see
# NOT_CONTROLLER for a moment.
ADMIN_READY_TIMEOUT_S = 30.0
COMPOSE_DOWN_TIMEOUT_S = 180.0
DOCKER_CALL_TIMEOUT_S = 60.0


def _load_build_image() -> ModuleType:
    """deploy/build_image.py is a script, not a package: load it by path."""
    spec = importlib.util.spec_from_file_location(
        "highwater_build_image", REPO_ROOT / "deploy" / "build_image.py"
    )
    if spec is None or spec.loader is None:
        raise RuntimeError("cannot load deploy/build_image.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Compose:
    """docker-compose for the test project, every call bounded."""

    def __init__(self, compose_bin: str, docker_bin: str) -> None:
        self.compose_bin = compose_bin
        self.docker_bin = docker_bin

    def run(
        self, *args: str, timeout_s: float = DOCKER_CALL_TIMEOUT_S, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = [self.compose_bin, "-f", str(COMPOSE_FILE), "-p", PROJECT, *args]
        env = {**os.environ, "HIGHWATER_IMAGE": IMAGE}
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False, env=env)
        if check and res.returncode != 0:
            raise AssertionError(f"`{' '.join(cmd)}` failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
        return res

    def container_id(self, service: str) -> str:
        cid = self.run("ps", "-q", service).stdout.strip()
        if not cid:
            raise AssertionError(f"no container for service {service}")
        return cid

    def health(self) -> dict[str, str]:
        """service -> Docker's health status ('healthy', 'starting', 'unhealthy') or the container state."""
        out = subprocess.run(
            [
                self.docker_bin,
                "ps",
                "-a",
                "--filter",
                f"label=com.docker.compose.project={PROJECT}",
                "--format",
                '{{.Label "com.docker.compose.service"}} {{.State}} {{.Status}}',
            ],
            capture_output=True,
            text=True,
            timeout=DOCKER_CALL_TIMEOUT_S,
            check=True,
        ).stdout
        states: dict[str, str] = {}
        for line in out.splitlines():
            service, state, status = line.split(" ", 2)
            if state != "running":
                states[service] = state
            elif "(healthy)" in status:
                states[service] = "healthy"
            elif "unhealthy" in status:
                states[service] = "unhealthy"
            else:
                states[service] = "starting"
        return states

    def logs_tail(self, lines: int = 40) -> str:
        res = self.run("logs", "--no-color", "--tail", str(lines), check=False)
        return res.stdout[-20_000:]


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@pytest.fixture(scope="module")
def docker_image() -> Iterator[tuple[ModuleType, float]]:
    """Tools installed, dockerd answering, image built; yields (build_image module, build seconds)."""
    build_image = _load_build_image()
    try:
        build_image.install_tools()
    except build_image.ToolsUnavailable as exc:
        pytest.skip(f"docker/debootstrap cannot be installed on this machine: {exc}")
    started = time.monotonic()
    daemon_pid = build_image.start_daemon()
    try:
        build_image.ensure_image(IMAGE)
        yield build_image, time.monotonic() - started
    finally:
        if daemon_pid is not None:
            build_image.stop_daemon(daemon_pid)


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_compose_cluster_survives_a_killed_leader_broker(
    docker_image: tuple[ModuleType, float], capsys: pytest.CaptureFixture[str]
) -> None:
    build_image, build_s = docker_image
    compose = Compose(build_image.compose_bin(), build_image.docker_bin())
    times: dict[str, float] = {"image (tools, base, build)": build_s}
    t0 = time.monotonic()
    compose.run("down", "-v", "--remove-orphans", "--timeout", "5", timeout_s=COMPOSE_DOWN_TIMEOUT_S)
    busy = [p for p in PORTS if _port_in_use(p)]
    assert not busy, f"ports {busy} on 127.0.0.1 are in use; deploy/docker-compose.test.yml needs them"
    try:
        compose.run("up", "-d", "--no-build", timeout_s=COMPOSE_UP_TIMEOUT_S)

        def all_healthy() -> bool:
            states = compose.health()
            failed = {s: st for s, st in states.items() if st in ("exited", "dead", "unhealthy")}
            if failed:
                raise AssertionError(f"containers failed: {failed}\n{compose.logs_tail()}")
            return len(states) == len(SERVICES) and all(st == "healthy" for st in states.values())

        try:
            wait_for(all_healthy, timeout_s=HEALTHY_TIMEOUT_S, interval_s=0.5, what="every container healthy")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{compose.health()}\n{compose.logs_tail()}") from exc
        times["up until healthy"] = time.monotonic() - t0

        gw = gateway_stub(GATEWAY_ADDRESS)
        topic = "compose-failover"

        def topic_created() -> bool:
            code = create_topic(
                gw, topic, partitions=3, replication_factor=3, configs={"min.insync.replicas": "2"}
            ).error_code
            return code in (common_pb2.NONE, common_pb2.TOPIC_ALREADY_EXISTS)

        wait_for(
            topic_created, timeout_s=ADMIN_READY_TIMEOUT_S, interval_s=0.5, what=f"topic {topic} created"
        )
        before = [f"before-{i}".encode() for i in range(100)]
        res = wait_for(
            lambda: _produced(gw, topic, before),
            timeout_s=ADMIN_READY_TIMEOUT_S,
            interval_s=0.5,
            what="first produce acknowledged",
        )
        assert res.base_offset == 0
        assert [r.value for r in fetch_all(gw, topic, 0)] == before
        _kafka_reads(topic, before)

        old = describe_partition(gw, topic, 0)
        assert sorted(old.isr) == [1, 2, 3], f"ISR before the kill: {list(old.isr)}"
        t_kill = time.monotonic()
        subprocess.run(
            [build_image.docker_bin(), "kill", compose.container_id(f"broker-{old.leader}")],
            capture_output=True,
            timeout=DOCKER_CALL_TIMEOUT_S,
            check=True,
        )

        def new_leader() -> common_pb2.PartitionState | None:
            state = describe_partition(gw, topic, 0)
            moved = state.leader not in (-1, old.leader) and state.leader_epoch > old.leader_epoch
            return state if moved and old.leader not in state.isr else None

        new = wait_for(
            new_leader,
            timeout_s=FAILOVER_TIMEOUT_S,
            interval_s=0.2,
            what=f"a new leader for {topic}-0 after killing broker {old.leader}",
        )
        times["kill until new leader"] = time.monotonic() - t_kill
        assert new.leader in old.isr, "a clean election picks the new leader from the ISR"

        # Every acknowledged record survives, at its offset.
        records = fetch_all(gw, topic, 0, timeout_s=FAILOVER_TIMEOUT_S)
        assert [r.value for r in records[:100]] == before
        assert [r.offset for r in records[:100]] == list(range(100))

        # Two live replicas still meet min.insync.replicas=2: acks=all writes go on.
        after = [f"after-{i}".encode() for i in range(50)]
        wait_for(
            lambda: _produced(gw, topic, after),
            timeout_s=FAILOVER_TIMEOUT_S,
            interval_s=0.5,
            what="produce acknowledged by the new leader",
        )
        values = [r.value for r in fetch_all(gw, topic, 0, timeout_s=FAILOVER_TIMEOUT_S)]
        assert values[:100] == before
        assert values[-50:] == after
        times["total, cluster part"] = time.monotonic() - t0
    finally:
        t_down = time.monotonic()
        down = compose.run(
            "down", "-v", "--remove-orphans", "--timeout", "10", timeout_s=COMPOSE_DOWN_TIMEOUT_S, check=False
        )
        times["down"] = time.monotonic() - t_down
        with capsys.disabled():
            print("\ncompose test wall times: " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))
        assert down.returncode == 0, f"docker-compose down failed:\n{down.stderr}"


def _produced(gw: object, topic: str, values: list[bytes]) -> common_pb2.ProducePartitionResponse | None:
    """One acks=all produce to partition 0; the response when acknowledged, else None (retry)."""
    res = produce(gw, topic, 0, values, acks=-1)  # type: ignore[arg-type]
    return res if res.error_code == common_pb2.NONE else None


def _kafka_reads(topic: str, values: list[bytes]) -> None:
    """Each broker's Kafka listener is up and registered: a Kafka client sees all three and
    reads partition 0 back."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": KAFKA_BOOTSTRAP, "group.id": "compose-kafka"})
    try:
        metadata = consumer.list_topics(topic, timeout=DOCKER_CALL_TIMEOUT_S)
        listed = sorted(f"{b.host}:{b.port}" for b in metadata.brokers.values())
        assert listed == sorted(KAFKA_BOOTSTRAP.split(",")), f"brokers' Kafka addresses: {listed}"
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + FAILOVER_TIMEOUT_S
        while len(got) < len(values) and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value())
        assert got == values, "the gateway's records, read over Kafka's protocol"
    finally:
        consumer.close()
