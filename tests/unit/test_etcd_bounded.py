"""etcd stays bounded (issue 43): the etcd we start compacts its history, offset commits
cost etcd one revision per group commit and nothing when unchanged, and a NOSPACE refusal
is a named error that says how to clear it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import grpc
import pytest
from grpc.aio import AioRpcError, Metadata

from coordinator import consumer_offsets
from coordinator.etcd_server import EtcdServer
from coordinator.limits import ETCD_AUTO_COMPACTION_RETENTION, ETCD_QUOTA_BACKEND_BYTES, ETCD_SNAPSHOT_COUNT
from coordinator.memory_store import MemoryStore
from coordinator.store import EtcdSpaceExceeded, EtcdStore
from services.controller.event_loop import ControllerEventLoop

GROUP = "billing"


def _flag(argv: list[str], name: str) -> str:
    if name not in argv:
        raise AssertionError(f"{name} missing from the etcd command line: {argv}")
    return argv[argv.index(name) + 1]


def test_etcd_command_line_compacts_history_and_sets_quota(tmp_path: Path) -> None:
    argv = EtcdServer(tmp_path / "data", client_port=2379, peer_port=2380, binary="etcd").command()
    assert _flag(argv, "--auto-compaction-mode") == "periodic"
    assert _flag(argv, "--auto-compaction-retention") == ETCD_AUTO_COMPACTION_RETENTION
    assert _flag(argv, "--quota-backend-bytes") == str(ETCD_QUOTA_BACKEND_BYTES)
    # etcd 3.4 keeps 100,000 writes of raft log in memory by default: ~20 MiB an hour of growth
    # under steady offset commits, for hours (the 2-hour soak, issue 43).
    assert _flag(argv, "--snapshot-count") == str(ETCD_SNAPSHOT_COUNT) == "10000"


def test_etcd_command_line_takes_a_short_retention_and_tiny_quota(tmp_path: Path) -> None:
    server = EtcdServer(
        tmp_path / "data",
        client_port=2379,
        peer_port=2380,
        binary="etcd",
        auto_compaction_retention="1s",
        quota_backend_bytes=1 << 20,
    )
    argv = server.command()
    assert _flag(argv, "--auto-compaction-retention") == "1s"
    assert _flag(argv, "--quota-backend-bytes") == str(1 << 20)


def _commits(partitions: int, offset: int) -> list[tuple[str, int, int, str, int]]:
    return [("orders", p, offset, "", 3) for p in range(partitions)]


@pytest.mark.asyncio
async def test_group_commit_of_many_partitions_is_one_revision() -> None:
    store = MemoryStore()
    before = store.revision
    assert await consumer_offsets.commit_if_state_unchanged(store, GROUP, 0, _commits(100, 7), 1_000)
    assert store.revision == before + 1
    stored = await consumer_offsets.committed_offsets(store, GROUP)
    assert {tp: v["offset"] for tp, v in stored.items()} == {("orders", p): 7 for p in range(100)}


@pytest.mark.asyncio
async def test_commit_of_unchanged_offsets_writes_nothing() -> None:
    store = MemoryStore()
    assert await consumer_offsets.commit_if_state_unchanged(store, GROUP, 0, _commits(10, 7), 1_000)
    revision = store.revision
    for commit_time_ms in (2_000, 3_000, 4_000):
        assert await consumer_offsets.commit_if_state_unchanged(
            store, GROUP, 0, _commits(10, 7), commit_time_ms
        )
    assert store.revision == revision
    stored = await consumer_offsets.committed_offsets(store, GROUP)
    assert stored[("orders", 0)]["commit_time_ms"] == 1_000  # the time it last changed


@pytest.mark.asyncio
async def test_commit_writes_only_the_changed_offsets() -> None:
    store = MemoryStore()
    assert await consumer_offsets.commit_if_state_unchanged(store, GROUP, 0, _commits(10, 7), 1_000)
    revision = store.revision
    changed = _commits(10, 7)
    changed[4] = ("orders", 4, 8, "", 3)  # a new offset
    changed[5] = ("orders", 5, 7, "note", 3)  # new metadata
    changed[6] = ("orders", 6, 7, "", 4)  # a new leader epoch
    assert await consumer_offsets.commit_if_state_unchanged(store, GROUP, 0, changed, 2_000)
    assert store.revision == revision + 1
    stored = await consumer_offsets.committed_offsets(store, GROUP)
    rewritten = {tp for tp, v in stored.items() if v["commit_time_ms"] == 2_000}
    assert rewritten == {("orders", 4), ("orders", 5), ("orders", 6)}


@pytest.mark.asyncio
async def test_commit_is_still_refused_when_the_group_state_moved() -> None:
    store = MemoryStore()
    await store.put(store.keys.consumer_group_state(GROUP), b"{}")
    assert not await consumer_offsets.commit_if_state_unchanged(store, GROUP, 0, _commits(3, 7), 1_000)
    assert await consumer_offsets.committed_offsets(store, GROUP) == {}


def test_nospace_refusal_is_a_named_error_saying_how_to_clear_it() -> None:
    store = EtcdStore.__new__(EtcdStore)
    store.endpoints = ["127.0.0.1:2379"]
    exc = AioRpcError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        Metadata(),
        Metadata(),
        "etcdserver: mvcc: database space exceeded",
    )
    error = store._rpc_error("txn", exc)
    assert isinstance(error, EtcdSpaceExceeded)
    assert not error.retriable
    assert "NOSPACE" in str(error)
    assert "etcdctl alarm disarm" in str(error)
    assert "defrag" in str(error)


@pytest.mark.asyncio
async def test_admin_watch_reads_admin_again_after_history_was_compacted() -> None:
    """The controller's watch on /admin resumes from a revision; with etcd compacting its
    history that revision may be gone. The request written meanwhile must still be seen."""
    store = MemoryStore(history_revisions_max=3)
    await store.put(store.keys.reassign_partitions, b'{"partitions": []}')
    for i in range(10):  # history moves on past what the watch would resume from
        await store.put(store.keys.prefix + f"/brokers/ids/{i}", b"{}")
    loop = ControllerEventLoop.__new__(ControllerEventLoop)
    loop.store, loop.keys, loop.delete_topic_enable = store, store.keys, True  # type: ignore[assignment]
    queued: list[str] = []
    loop.enqueue = lambda name, handler: queued.append(name)  # type: ignore[method-assign]
    task = asyncio.create_task(loop._watch_admin(1))
    try:
        deadline = time.monotonic() + 2.0
        while "AdminRequest" not in queued:
            assert time.monotonic() < deadline, f"the admin request was never queued (queued: {queued})"
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
