"""The exactly-once sink (deliveryGuarantee=exactly-once; issue 41; docs/SPARK.md, Guarantees):
a driver SIGKILLed in the middle of a micro-batch and restarted from its checkpoint, a sink commit
Spark did not record (the replay writes nothing again), and a batch job whose tasks commit as one.
Each checks what a read_committed reader sees: every input record exactly once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import TestCluster
from tests.spark.conftest import REPO_ROOT
from tests.spark.helpers import consume_all, create_topic, produce

pytestmark = pytest.mark.integration

QUERY_TIMEOUT_S = 180
BLOCK_WAIT_S = 90
RECORDS = 600


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (read from /proc: the JVM, Spark's Python workers)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                # Field 4 of stat is the parent pid; the command name (field 2) may hold spaces.
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, p in parents.items() if p == parent]
        found.extend(children)
        frontier.extend(children)
    return found


def _kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the driver and everything it started (its JVM and Spark's Python workers)."""
    pids = [process.pid, *_descendants(process.pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)


def _driver(
    bootstrap: str, source: str, sink: str, checkpoint: Path, block: str, blocked: Path, log: Path
) -> Any:
    # As the `spark` fixture's session: this interpreter for Spark's Python workers (their lookup
    # of pyspark_highwater finds the data source), the repository on their path, loopback only.
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.spark.eos_driver",
                bootstrap,
                source,
                sink,
                str(checkpoint),
                block,
                str(blocked),
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _run_to_end(process: subprocess.Popen[bytes], log: Path) -> None:
    try:
        code = process.wait(timeout=QUERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_tree(process)
        raise AssertionError(
            f"the driver did not finish in {QUERY_TIMEOUT_S} s:\n{log.read_text()[-4000:]}"
        ) from None
    assert code == 0, f"the driver failed ({code}):\n{log.read_text()[-4000:]}"


def _uncommitted(bootstrap: str, topic: str) -> set[bytes]:
    """Values in the log that a read_committed reader does not see."""
    committed = {r.value for r in consume_all(bootstrap, topic, "read_committed")}
    return {r.value for r in consume_all(bootstrap, topic)} - committed


def _input(bootstrap: str, topic: str) -> set[bytes]:
    create_topic(bootstrap, topic, 2)
    values = [f"eos-{i:04d}".encode() for i in range(RECORDS)]
    produce(bootstrap, topic, [(i % 2, None, v, []) for i, v in enumerate(values)])
    return set(values)


def test_a_driver_killed_mid_batch_and_restarted_writes_every_record_once(
    cluster: TestCluster, tmp_path: Path
) -> None:
    bootstrap = cluster.gateway_address
    expected = _input(bootstrap, "eos-kill-in")
    create_topic(bootstrap, "eos-kill-out", 3)
    checkpoint, blocked, log = tmp_path / "checkpoint", tmp_path / "blocked", tmp_path / "driver.log"
    # Record 250 is in micro-batch 2 (100 records a batch), late in its partition's task.
    driver = _driver(bootstrap, "eos-kill-in", "eos-kill-out", checkpoint, "eos-0250", blocked, log)
    try:
        # Killed once a task is blocked mid-batch and the batch has records in the log that no
        # commit made visible (its other task's, or the blocked one's first batches).
        deadline = time.monotonic() + BLOCK_WAIT_S
        while not (blocked.exists() and _uncommitted(bootstrap, "eos-kill-out")):
            assert driver.poll() is None, f"the driver ended before blocking:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, (
                f"no batch blocked mid-write in {BLOCK_WAIT_S} s:\n{log.read_text()[-4000:]}"
            )
            time.sleep(0.5)
    finally:
        _kill_tree(driver)

    committed_before = Counter(r.value for r in consume_all(bootstrap, "eos-kill-out", "read_committed"))
    in_log = Counter(r.value for r in consume_all(bootstrap, "eos-kill-out"))
    assert max(committed_before.values(), default=1) == 1
    assert b"eos-0250" not in committed_before, "the blocked batch's transaction never committed"
    assert set(in_log) - set(committed_before), "the killed batch had records in the log, uncommitted"

    driver = _driver(bootstrap, "eos-kill-in", "eos-kill-out", checkpoint, "", blocked, log)
    try:
        _run_to_end(driver, log)
    finally:
        if driver.poll() is None:
            _kill_tree(driver)
    committed = Counter(r.value for r in consume_all(bootstrap, "eos-kill-out", "read_committed"))
    assert [v for v, n in committed.items() if n > 1] == []
    assert set(committed) == expected
    everything = Counter(r.value for r in consume_all(bootstrap, "eos-kill-out"))
    assert sum(everything.values()) > len(expected), "the aborted writes are in the log, not read"


def test_a_sink_commit_spark_did_not_record_is_not_written_again(
    spark: Any, cluster: TestCluster, tmp_path: Path
) -> None:
    """The window between the sink's commit and Spark's commit log: a driver that dies there
    leaves a checkpoint without the batch's commit file. Removing it makes the restarted query
    replay that batch; its tasks find their commit markers and write nothing."""
    bootstrap = cluster.gateway_address
    expected = _input(bootstrap, "eos-replay-in")
    create_topic(bootstrap, "eos-replay-out", 2)
    checkpoint = tmp_path / "checkpoint"

    def run() -> None:
        query = (
            spark.readStream.format("highwater")
            .option("bootstrap", bootstrap)
            .option("subscribe", "eos-replay-in")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "200")
            .load()
            .select("key", "value")
            .writeStream.format("highwater")
            .option("bootstrap", bootstrap)
            .option("topic", "eos-replay-out")
            .option("deliveryGuarantee", "exactly-once")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(QUERY_TIMEOUT_S)
        assert query.exception() is None

    run()
    commits = sorted(
        (checkpoint / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1
    )
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()
    with contextlib.suppress(FileNotFoundError):
        (checkpoint / "commits" / f".{last.name}.crc").unlink()
    run()
    committed = Counter(r.value for r in consume_all(bootstrap, "eos-replay-out", "read_committed"))
    assert [v for v, n in committed.items() if n > 1] == []
    assert set(committed) == expected
    everything = consume_all(bootstrap, "eos-replay-out")
    assert len(everything) == len(expected), "the replayed batch wrote nothing, not even aborted records"


def test_a_batch_write_commits_all_its_tasks_at_once(spark: Any, cluster: TestCluster) -> None:
    bootstrap = cluster.gateway_address
    create_topic(bootstrap, "eos-batch-out", 3)
    df = spark.createDataFrame(
        [(f"k{i}", f"v{i}") for i in range(300)], "key string, value string"
    ).repartition(3)
    (
        df.write.format("highwater")
        .option("bootstrap", bootstrap)
        .option("topic", "eos-batch-out")
        .option("deliveryGuarantee", "exactly-once")
        .mode("append")
        .save()
    )
    committed = Counter(r.value for r in consume_all(bootstrap, "eos-batch-out", "read_committed"))
    assert committed == Counter(f"v{i}".encode() for i in range(300))
