"""Shared fixtures: a real etcd server for the session, an isolated EtcdStore per test.

- `etcd_server` (session): one local etcd (coordinator.etcd_server.EtcdServer) in a
  temporary directory, started on first use and stopped by pid at the end of the
  session, also when tests failed. Tests must not stop or pause it; a test that
  needs to restart etcd starts its own EtcdServer.
- `etcd_store` (function, async): an EtcdStore on that server whose key prefix is
  unique to the test ("/hwtest-<hex>"), so tests never see each other's keys; its
  keys are deleted and the store closed afterwards.
- `--sim-seeds N` (default 50): how many seeds tests/sim runs; read it through the
  `sim_seeds` fixture or `request.config.getoption("sim_seeds")`.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from coordinator.etcd_server import EtcdServer
from coordinator.store import CoordinatorError, EtcdStore

SIM_SEEDS_DEFAULT = 50


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--sim-seeds",
        action="store",
        type=int,
        default=SIM_SEEDS_DEFAULT,
        dest="sim_seeds",
        help=f"number of seeds the deterministic simulation runs (default {SIM_SEEDS_DEFAULT})",
    )


@pytest.fixture(scope="session")
def sim_seeds(request: pytest.FixtureRequest) -> int:
    seeds: int = request.config.getoption("sim_seeds")
    return seeds


def running_etcd(base: Path, name: str) -> Iterator[EtcdServer]:
    """For a fixture to `yield from`: an EtcdServer with its data and log under base, started, and
    stopped when the fixture is torn down."""
    server = EtcdServer(base / "data", log_path=base / "etcd.log", name=name)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    yield from running_etcd(tmp_path_factory.mktemp("etcd"), "highwater-test-etcd")


@pytest_asyncio.fixture
async def etcd_store(etcd_server: EtcdServer) -> AsyncIterator[EtcdStore]:
    store = await EtcdStore.connect(etcd_server.endpoint, prefix=f"/hwtest-{secrets.token_hex(6)}")
    try:
        yield store
    finally:
        try:
            await store.delete(store.keys.prefix + "/", prefix=True)
        except CoordinatorError:
            pass  # etcd gone: the session's data dir is thrown away anyway
        await store.close()
