"""Real clusters for integration tests: etcd and every service as processes on 127.0.0.1.

- `cluster` (module scope): one LocalCluster (etcd, a controller, 3 brokers, a
  gateway) shared by the tests of a module that do not break it. Tests use
  their own topic names.
- `make_cluster` (function scope): a factory for tests that kill, pause or
  restart processes; every cluster it made is stopped by pid afterwards, also
  when the test failed.

Lease TTLs are short (3 s) so failover tests finish quickly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.launcher.local_cluster import LocalCluster

TEST_LEASE_TTL_S = 3


class TestCluster(LocalCluster):
    """LocalCluster plus the names tests use (kill_broker(2), start_gateway(), ...)."""

    __test__ = False  # not a test class

    def kill_broker(self, broker_id: int) -> None:
        self.kill(f"broker-{broker_id}")

    def start_broker(self, broker_id: int) -> None:
        self.start_process(f"broker-{broker_id}")

    def kill_gateway(self, index: int = 1) -> None:
        self.kill(f"gateway-{index}")

    def start_gateway(self, index: int = 1) -> None:
        self.start_process(f"gateway-{index}")

    def broker_pid(self, broker_id: int) -> int | None:
        return self.processes[f"broker-{broker_id}"].pid


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(tmp_path_factory.mktemp("cluster"), brokers=3, lease_ttl_s=TEST_LEASE_TTL_S)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., TestCluster]]:
    made: list[TestCluster] = []

    def make(**kwargs: object) -> TestCluster:
        kwargs.setdefault("lease_ttl_s", TEST_LEASE_TTL_S)
        c = TestCluster(tmp_path / f"cluster-{len(made)}", **kwargs)  # type: ignore[arg-type]
        made.append(c)
        return c.start()

    try:
        yield make
    finally:
        for c in made:
            c.stop()
