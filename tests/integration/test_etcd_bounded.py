"""etcd stays bounded (issue 43), against a real etcd: the etcd we start compacts its own
history, offset commits cost one revision per group commit and none when unchanged, and a
full etcd (NOSPACE) is refused with a named error.

Each test that needs its own etcd flags starts its own EtcdServer and stops it by pid.
Every wait is bounded by a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from clients.tools.cli import cli
from coordinator import consumer_offsets
from coordinator.etcd_server import EtcdServer
from coordinator.etcd_status import read_status
from coordinator.limits import ETCD_QUOTA_BACKEND_BYTES
from coordinator.store import EtcdSpaceExceeded, EtcdStore, WatchCompacted
from tests.integration.conftest import TestCluster
from tests.integration.test_metrics import scrape

pytestmark = pytest.mark.integration

# Periodic compaction with a one-second retention compacts about every second.
SHORT_RETENTION = "1s"
COMPACTION_SEEN_TIMEOUT_S = 20.0
# A quota etcd reaches within a few dozen writes of FILL_VALUE_BYTES.
TINY_QUOTA_BYTES = 4 * 1024 * 1024
FILL_VALUE_BYTES = 512 * 1024
FILL_WRITES_MAX = 200
# The controller reads etcd's status when it starts, then every 15 s.
DESCRIBE_TIMEOUT_S = 30.0


@contextlib.contextmanager
def own_etcd(tmp_path: Path, name: str, **flags: str | int) -> Iterator[EtcdServer]:
    server = EtcdServer(tmp_path / "data", log_path=tmp_path / "etcd.log", name=name, **flags)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def _compact_revision(store: EtcdStore) -> int:
    """etcd's compact revision: a watch from revision 1 is refused with it (0: none yet)."""
    try:
        async with contextlib.aclosing(
            store.watch_prefix(store.keys.prefix + "/", start_revision=1)
        ) as events:
            async with asyncio.timeout(1.0):
                async for _ in events:
                    return 0
    except WatchCompacted as exc:
        return exc.compact_revision
    except TimeoutError:
        return 0
    return 0


@pytest.mark.asyncio
async def test_etcd_compacts_its_history_by_itself(tmp_path: Path) -> None:
    with own_etcd(tmp_path, "highwater-compaction", auto_compaction_retention=SHORT_RETENTION) as server:
        store = await EtcdStore.connect(server.endpoint, prefix="/hwtest-compaction")
        try:
            key = store.keys.prefix + "/offset"
            first = await store.put(key, b"0")
            deadline = time.monotonic() + COMPACTION_SEEN_TIMEOUT_S
            written = 0
            while True:
                for _ in range(50):
                    written += 1
                    await store.put(key, str(written).encode())
                compacted = await _compact_revision(store)
                if compacted > first:
                    break
                assert time.monotonic() < deadline, (
                    f"etcd compacted nothing within {COMPACTION_SEEN_TIMEOUT_S} s of {written} writes "
                    f"(retention {SHORT_RETENTION}); log:\n{server.log_tail()}"
                )
                await asyncio.sleep(0.2)
            # The store's reads are unaffected: they read the current revision.
            kv = await store.get(key)
            assert kv is not None and kv.value == str(written).encode()
        finally:
            await store.close()


@pytest.mark.asyncio
async def test_group_commit_is_one_revision_and_unchanged_commit_none(etcd_store: EtcdStore) -> None:
    commits = [("orders", p, 41, "", 2) for p in range(100)]
    revision = (await etcd_store.get_prefix(etcd_store.keys.prefix + "/"))[1]
    assert await consumer_offsets.commit_if_state_unchanged(etcd_store, "billing", 0, commits, 1_000)
    after_commit = (await etcd_store.get_prefix(etcd_store.keys.prefix + "/"))[1]
    assert after_commit == revision + 1
    for commit_time_ms in (2_000, 3_000):
        assert await consumer_offsets.commit_if_state_unchanged(
            etcd_store, "billing", 0, commits, commit_time_ms
        )
    assert (await etcd_store.get_prefix(etcd_store.keys.prefix + "/"))[1] == after_commit


@pytest.mark.asyncio
async def test_full_etcd_is_refused_with_a_named_error(tmp_path: Path) -> None:
    with own_etcd(tmp_path, "highwater-nospace", quota_backend_bytes=TINY_QUOTA_BYTES) as server:
        store = await EtcdStore.connect(server.endpoint, prefix="/hwtest-nospace")
        try:
            value = b"x" * FILL_VALUE_BYTES
            with pytest.raises(EtcdSpaceExceeded) as refused:
                for i in range(FILL_WRITES_MAX):
                    await store.put(f"{store.keys.prefix}/fill/{i}", value)
            message = str(refused.value)
            assert "database space exceeded" in message
            assert "etcdctl alarm disarm" in message
            # Every later write is refused the same way, a commit included.
            with pytest.raises(EtcdSpaceExceeded):
                await consumer_offsets.commit_if_state_unchanged(
                    store, "billing", 0, [("orders", 0, 1, "", 0)], 1_000
                )
            status = await read_status(store)
            assert status is not None and status.nospace_alarm
            assert status.db_size_bytes > 0
        finally:
            await store.close()


@pytest.mark.asyncio
async def test_status_reports_size_and_no_alarm(etcd_store: EtcdStore) -> None:
    status = await read_status(etcd_store)
    assert status is not None
    assert not status.nospace_alarm
    assert 0 < status.db_size_in_use_bytes <= status.db_size_bytes < status.quota_bytes


def test_cluster_describe_and_metrics_show_etcd_space(cluster: TestCluster) -> None:
    deadline = time.monotonic() + DESCRIBE_TIMEOUT_S
    runner = CliRunner()
    while True:
        result = runner.invoke(
            cli, ["--bootstrap", cluster.gateway_address, "-o", "json", "cluster", "describe"]
        )
        assert result.exit_code == 0, result.output
        etcd = json.loads(result.output)["etcd"]
        if etcd is not None:
            break
        assert time.monotonic() < deadline, f"cluster describe never showed etcd's space: {result.output}"
        time.sleep(0.2)
    assert etcd["quota_bytes"] == ETCD_QUOTA_BACKEND_BYTES
    assert 0 < etcd["db_size_bytes"] < etcd["quota_bytes"] and not etcd["nospace_alarm"]
    text = runner.invoke(cli, ["--bootstrap", cluster.gateway_address, "cluster", "describe"]).output
    assert "MiB quota" in text
    controller = scrape(cluster, "controller-1")
    assert controller["highwater_etcd_db_size_bytes"] > 0
    assert controller["highwater_etcd_quota_bytes"] == ETCD_QUOTA_BACKEND_BYTES
    assert controller["highwater_etcd_nospace_alarm"] == 0
