"""Upgrades as a promise (docs/UPGRADING.md): data written by an earlier release reads back whole.

An earlier commit of this repository, OLD_COMMIT (the code of 2026-11-23), is checked out with
`git worktree` and its services run as processes of their own: the same interpreter as this
test (.venv), with PYTHONPATH naming the worktree, so `python -m services` and every
`clients.*`, `coordinator.*`, `protos.*` import resolve to the old tree before the editable
install of this checkout (PYTHONPATH precedes site-packages on sys.path). That is the old
release's environment as far as its code can tell: it needs no package the current .venv lacks
(its dependencies are a subset), and nothing of the current tree is on its path. The old
release's own client library writes the data (a subprocess with the same PYTHONPATH), so the
records, topic and group offsets are exactly what that release stores.

- Offline upgrade: an old cluster creates a topic with configs, produces with acks=all and
  commits group offsets; it stops; the current code starts on the same data directories and
  the same etcd data, and every acknowledged record (partition, offset, value), every committed
  offset, the topic id and the topic's configs are as they were.
- Rolling upgrade: an old cluster runs under an old producer's acks=all load; brokers are
  replaced one at a time (SIGTERM: a controlled shutdown, the last one SIGKILL instead; then
  the current code on the same data directory, then wait for every ISR to be full again),
  then the standby controller (which must leave the older active one be), then the active
  one, then the gateway; every record the producer saw acknowledged is read back at its offset.

CI clones main with its whole history, so OLD_COMMIT is there; if it is not (a shallow clone),
the test fails saying so rather than skipping: the promise would otherwise go untested.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clients.admin import Admin
from clients.producer import Producer
from clients.types import TopicPartition
from services.broker.core import RUN_MARKER_FILE, RUN_MARKER_VERSION
from services.launcher.local_cluster import Placement
from tests.integration.conftest import TEST_LEASE_TTL_S, TestCluster
from tests.integration.helpers import etcd_value, fetch_all, gateway_stub, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# The last commit of 2026-11-23 ("Simulation tests drive the broker core's AlterPartition task"):
# the release operators upgrade from. Pinned by hash: a branch or date would move.
OLD_COMMIT = "46636f8539d3df03f4859149ffe347e87c685de1"
REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 3
TOPIC_CONFIGS = {"retention.ms": "86400000", "min.insync.replicas": "2", "segment.bytes": "1048576"}
GROUP = "upgrade-group"
COMMITS = {0: 11, 1: 22, 2: 33}
OFFLINE_RECORDS = 3000
ROLLBACK_RECORDS = 300
WRITER_TIMEOUT_S = 90.0
ISR_FULL_TIMEOUT_S = 30.0
# How long an upgraded standby is watched beside the older active controller: ~7 of its
# 300 ms grace periods (limits.CONTROLLER_CONNECTION_GRACE_MS), after which it would have acted.
STANDBY_WATCH_S = 2.0


@pytest.fixture(scope="module")
def old_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A worktree of OLD_COMMIT, removed afterwards even when a test failed."""
    found = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{OLD_COMMIT}^{{commit}}"], capture_output=True
    )
    if found.returncode != 0:
        pytest.fail(
            f"commit {OLD_COMMIT} (the release upgraded from) is not in this clone: clone with full "
            "history (`git fetch --unshallow`) so the upgrade test can check out the old release"
        )
    tree = tmp_path_factory.mktemp("old-release") / "tree"
    added = subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), OLD_COMMIT],
        capture_output=True,
        text=True,
    )
    if added.returncode != 0:
        pytest.fail(f"could not check out {OLD_COMMIT} with git worktree: {added.stderr.strip()}")
    try:
        yield tree
    finally:
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True
        )


def old_placement(tree: Path) -> Placement:
    """Run a service of the old release: its tree first on the path (see the module docstring)."""
    return Placement("127.0.0.1", ("env", f"PYTHONPATH={tree}"))


def old_cluster(base_dir: Path, tree: Path, *, controllers: int = 1) -> TestCluster:
    """Every process of the old release. No Kafka listener: that release has none
    (kafka_port=None passes no --kafka-port, a flag it would refuse)."""
    names = [*(f"controller-{i}" for i in range(1, controllers + 1)), "broker-1", "broker-2", "broker-3"]
    return TestCluster(
        base_dir,
        brokers=3,
        controllers=controllers,
        lease_ttl_s=TEST_LEASE_TTL_S,
        kafka_port=None,
        placements={name: old_placement(tree) for name in [*names, "gateway-1"]},
    )


def to_current(cluster: TestCluster, name: str) -> None:
    """The process runs the current code from its next start on."""
    cluster.placements.pop(name, None)
    cluster.processes[name].placement = Placement()


def run_old(tree: Path, script: str, *args: str, timeout_s: float = WRITER_TIMEOUT_S) -> str:
    """Run `script` with the old release's code; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise AssertionError(f"the old release's client failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout


# The old release's client library: create the topic, produce with acks=all, commit offsets.
OLD_WRITER = """
import asyncio, json, sys
from clients.admin import Admin
from clients.consumer import AsyncConsumer
from clients.producer import Producer
from clients.types import TopicPartition

bootstrap, topic, count, group = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
configs, commits = json.loads(sys.argv[5]), json.loads(sys.argv[6])
with Admin(bootstrap) as admin:
    admin.create_topics(topic, partitions=len(commits), replication_factor=3, configs=configs)
    topic_id = admin.describe_topics(topic)[0].topic_id
acked = []
with Producer(bootstrap, acks="all") as producer:
    futures = [(i, producer.send(topic, f"v{i}".encode(), key=f"k{i}".encode())) for i in range(count)]
    producer.flush()
    for i, future in futures:
        md = future.result(timeout=30)
        acked.append([md.partition, md.offset, f"v{i}"])

async def commit():
    consumer = AsyncConsumer(bootstrap=bootstrap, group_id=group)
    try:
        await consumer.commit({TopicPartition(topic, int(p)): o for p, o in commits.items()})
    finally:
        await consumer.close()

asyncio.run(commit())
print(json.dumps({"topic_id": topic_id, "acked": acked}))
"""

# The old release's client library: the topic id and the group's committed offsets.
OLD_READER = """
import json, sys
from clients.admin import Admin

bootstrap, topic, group = sys.argv[1:4]
with Admin(bootstrap) as admin:
    topic_id = admin.describe_topics(topic)[0].topic_id
    committed = {str(tp.partition): o for tp, o in admin.list_group_offsets(group).items()}
print(json.dumps({"topic_id": topic_id, "committed": committed}))
"""

# The old release's producer under load until `stop_file` exists: acks=all, one line per
# acknowledged record (partition offset value) appended to `acked_file` as it is acknowledged.
OLD_LOAD = """
import os, sys, time
from clients.admin import Admin
from clients.producer import Producer

bootstrap, topic, acked_file, stop_file = sys.argv[1:5]
with Admin(bootstrap) as admin:
    admin.create_topics(topic, partitions=3, replication_factor=3, configs={"min.insync.replicas": "2"})
out = open(acked_file, "a", buffering=1)

def on_done(value):
    def callback(md, error):
        if error is None:
            out.write(f"{md.partition} {md.offset} {value}\\n")
    return callback

with Producer(bootstrap, acks="all", delivery_timeout_ms=60000) as producer:
    i = 0
    while not os.path.exists(stop_file):
        value = f"r{i}"
        producer.send(topic, value.encode(), key=value.encode(), callback=on_done(value))
        i += 1
        if i % 50 == 0:
            time.sleep(0.01)
    producer.flush()
out.close()
"""


def records_by_offset(cluster: TestCluster, topic: str) -> dict[tuple[int, int], str]:
    gw = gateway_stub(cluster.gateway_address)
    return {
        (p, r.offset): (r.value or b"").decode()
        for p in range(PARTITIONS)
        for r in fetch_all(gw, topic, p, timeout_s=30.0)
    }


def active_controller(cluster: TestCluster) -> int:
    """The id in /controller (the active controller's lease); -1 while none holds it."""
    raw = etcd_value(cluster.etcd_endpoint, "/highwater/controller")
    return -1 if raw is None else int(json.loads(raw)["controller_id"])


def isr_full(cluster: TestCluster, topic: str) -> bool:
    with Admin(cluster.gateway_address) as admin:
        parts = admin.describe_topics(topic)[0].partitions
    return all(p.leader != -1 and len(p.isr) == len(p.replicas) for p in parts)


def test_offline_upgrade_and_rollback_keep_records_offsets_commits_topic_id_and_configs(
    old_tree: Path, tmp_path: Path
) -> None:
    cluster = old_cluster(tmp_path / "cluster", old_tree)
    try:
        cluster.start()
        topic = "upgrade-offline"
        written = json.loads(
            run_old(
                old_tree,
                OLD_WRITER,
                cluster.gateway_address,
                topic,
                str(OFFLINE_RECORDS),
                GROUP,
                json.dumps(TOPIC_CONFIGS),
                json.dumps(COMMITS),
            )
        )
        assert len(written["acked"]) == OFFLINE_RECORDS
        cluster.stop()  # every process by pid, then etcd; data directories and etcd data stay
        marker = cluster.base_dir / "broker-1" / RUN_MARKER_FILE
        assert "version" not in json.loads(marker.read_text()), "the old release wrote this data"

        for name in list(cluster.processes):
            to_current(cluster, name)
        cluster.start()

        read = records_by_offset(cluster, topic)
        acked = {(p, o): v for p, o, v in written["acked"]}
        missing = {k: v for k, v in acked.items() if read.get(k) != v}
        assert not missing, f"{len(missing)} acknowledged records not read back at their offsets"
        assert len(read) == OFFLINE_RECORDS, "nothing more, nothing less"
        with Admin(cluster.gateway_address) as admin:
            described = admin.describe_topics(topic)[0]
            committed = admin.list_group_offsets(GROUP)
        assert described.topic_id == written["topic_id"]
        for key, value in TOPIC_CONFIGS.items():
            assert str(described.config[key]).lower() == value.lower(), key
        assert committed == {TopicPartition(topic, p): o for p, o in COMMITS.items()}
        assert json.loads(marker.read_text())["version"] == RUN_MARKER_VERSION, "the current code ran"

        # Rollback: records the current release acknowledged, then the old release again on the
        # same data (its files now carry this release's additions: versioned run markers,
        # partition.metadata, registrations with more fields).
        with Producer(cluster.gateway_address, acks="all") as producer:
            futures = [(i, producer.send(topic, f"n{i}".encode())) for i in range(ROLLBACK_RECORDS)]
            producer.flush()
        for i, future in futures:
            md = future.result(timeout=30)
            acked[(md.partition, md.offset)] = f"n{i}"
        cluster.stop()
        for name in list(cluster.processes):
            cluster.placements[name] = cluster.processes[name].placement = old_placement(old_tree)
        cluster.start()
        read = records_by_offset(cluster, topic)
        missing = {k: v for k, v in acked.items() if read.get(k) != v}
        assert not missing, f"{len(missing)} records not read back by the old release after a rollback"
        seen_by_old = json.loads(run_old(old_tree, OLD_READER, cluster.gateway_address, topic, GROUP))
        assert seen_by_old["topic_id"] == written["topic_id"]
        assert seen_by_old["committed"] == {str(p): o for p, o in COMMITS.items()}
    finally:
        cluster.stop()


def test_rolling_upgrade_under_load_loses_no_acknowledged_record(old_tree: Path, tmp_path: Path) -> None:
    cluster = old_cluster(tmp_path / "cluster", old_tree, controllers=2)
    acked_file, stop_file = tmp_path / "acked.txt", tmp_path / "stop"
    load: subprocess.Popen[bytes] | None = None
    topic = "upgrade-rolling"
    try:
        cluster.start()
        load = subprocess.Popen(
            [sys.executable, "-c", OLD_LOAD, cluster.gateway_address, topic, str(acked_file), str(stop_file)],
            cwd=old_tree,
            env={**os.environ, "PYTHONPATH": str(old_tree)},
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "load.log").open("wb"),
        )
        wait_for(
            lambda: acked_file.exists() and acked_file.stat().st_size > 0,
            timeout_s=30.0,
            what="the old producer's first acknowledgements",
        )
        for broker_id in cluster.broker_ids:
            name = f"broker-{broker_id}"
            if broker_id == cluster.broker_ids[-1]:
                # kill -9: the current code recovers a log the old release left unclean.
                cluster.kill(name)
            else:
                cluster.terminate(name)  # SIGTERM: controlled shutdown, leaders move away first
            to_current(cluster, name)
            cluster.start_process(name)
            wait_for(lambda: isr_full(cluster, topic), timeout_s=ISR_FULL_TIMEOUT_S, what="every ISR full")
        # The standby controller first, then the active one (one failover, to a current controller),
        # then the gateway.
        active = wait_for(lambda: max(active_controller(cluster), 0), timeout_s=10.0, what="a controller")
        standby = 2 if active == 1 else 1
        cluster.terminate(f"controller-{standby}")
        to_current(cluster, f"controller-{standby}")
        cluster.start_process(f"controller-{standby}")
        # An upgraded standby next to an older active controller (which has no StandbyHeartbeat)
        # must leave it be: it answers, so it is alive. Watched for many grace periods.
        watch_until = time.monotonic() + STANDBY_WATCH_S
        while time.monotonic() < watch_until:
            assert active_controller(cluster) == active, "the upgraded standby deposed a live controller"
            time.sleep(0.1)
        for name in (f"controller-{active}", "gateway-1"):
            cluster.terminate(name)
            to_current(cluster, name)
            cluster.start_process(name)
        wait_for(
            lambda: active_controller(cluster) == standby, timeout_s=30.0, what="the upgraded standby to lead"
        )
        before_stop = acked_file.read_text().count("\n")
        wait_for(
            lambda: acked_file.read_text().count("\n") > before_stop,
            timeout_s=30.0,
            what="acknowledgements from the all-current cluster",
        )
        stop_file.touch()
        assert load.wait(timeout=WRITER_TIMEOUT_S) == 0, (tmp_path / "load.log").read_text()[-4000:]

        acked: dict[tuple[int, int], str] = {}
        for line in acked_file.read_text().splitlines():
            p, o, v = line.split()
            acked[(int(p), int(o))] = v
        read = records_by_offset(cluster, topic)
        lost = {k: v for k, v in acked.items() if read.get(k) != v}
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged records lost: {sorted(lost)[:10]}"
        assert len(acked) > 0
        print(f"rolling upgrade: {len(acked)} acknowledged records, 0 lost, {len(read)} read")
    finally:
        stop_file.touch()
        if load is not None and load.poll() is None:
            load.kill()
            load.wait(timeout=10)
        cluster.stop()
