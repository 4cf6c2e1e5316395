"""Fixtures for the Spark connector tests: one local[2] SparkSession and one cluster per session.

- `spark` (session): local[2] (the machine has 2 shared cores), UI off, 2 shuffle
  partitions, Python filter pushdown on. Workers run this interpreter
  (PYSPARK_PYTHON=sys.executable), and the repository root is put on the workers'
  PYTHONPATH so Spark's lookup of `pyspark_*` modules finds pyspark_highwater the way
  it would in a regular install: the tests use format("highwater") without
  registering it (setuptools' editable install is invisible to that lookup; see
  docs/SPARK.md).
- `cluster` (session): a real etcd, controller, 3 brokers and a gateway as processes
  (tests/integration/conftest.py's TestCluster). Shared by every test here; each test
  uses its own topic names and none stops a process.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import TEST_LEASE_TTL_S, TestCluster

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(tmp_path_factory.mktemp("spark-cluster"), brokers=3, lease_ttl_s=TEST_LEASE_TTL_S)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pyspark_sql = pytest.importorskip(
        "pyspark.sql", reason="the Spark tests need pyspark (pip install -e '.[dev]')"
    )
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("the Spark tests need Java 17 (e.g. apt-get install openjdk-17-jre-headless)")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Spark binds to the host's first non-loopback address unless told: keep it on 127.0.0.1.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    session = (
        pyspark_sql.SparkSession.builder.master("local[2]")
        .appName("highwater-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()
