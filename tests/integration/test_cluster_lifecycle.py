"""Starting and stopping a whole local cluster as an operator does (issue 43).

- A clean stop of every process logs no warning: nothing failed (fault d).
- `cluster up --tls --token-port P` gives token clients the same port at every start (fault c).
- Ctrl-C ends `cluster up --demo` with its "stopped" line, not click's "Aborted!" (fault f).
- Ctrl-C in a terminal, which signals the whole foreground process group, reaches `cluster up`
  alone: it stops the services in order, so that stop is as quiet as any other.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import TestCluster
from tests.integration.helpers import create_topic, gateway_stub, produce

pytestmark = pytest.mark.integration

HIGHWATER = shutil.which("highwater", path=str(Path(sys.executable).parent)) or "highwater"
# `cluster up` until its "running" line: etcd, the services and, with --tls, the certificates.
CLUSTER_UP_TIMEOUT_S = 90
# ... and with --demo, the demo's records and a local Spark session's write and read-back.
DEMO_UP_TIMEOUT_S = 300
# SIGINT or SIGTERM -> exit: every process stopped (LocalCluster.stop's bound per kind, and etcd).
CLUSTER_STOP_TIMEOUT_S = 60
RUNNING_LINE = "running; Ctrl-C stops every process"
# A Highwater service's log line at WARNING or above ("2026-11-27 22:31:15,439 WARNING highwater...").
LOUD_LINE = re.compile(r"^\S+ \S+ (WARNING|ERROR|CRITICAL) ")


def service_logs(base_dir: Path) -> list[Path]:
    """The controllers', brokers' and gateways' logs (etcd's has a format and levels of its own)."""
    return sorted(p for p in (base_dir / "logs").glob("*.log") if p.name != "etcd.log")


@pytest.mark.parametrize("controllers", [1, 2])
def test_a_clean_stop_of_the_whole_cluster_logs_no_warning(
    make_cluster: Callable[..., TestCluster], controllers: int
) -> None:
    cluster = make_cluster(brokers=3, controllers=controllers)
    gw = gateway_stub(cluster.gateway_address)
    assert create_topic(gw, "quiet", partitions=6, replication_factor=3).error_code == 0
    for partition in range(6):
        assert produce(gw, "quiet", partition, [b"v"] * 10).error_code == 0
    logs = service_logs(cluster.base_dir)
    before = {log: log.stat().st_size for log in logs}
    cluster.stop()
    for process in cluster.processes.values():
        assert process.proc is not None and process.proc.returncode == 0, f"{process.name}: {process.proc}"
    assert loud_lines_since(before) == []


def loud_lines_since(sizes: dict[Path, int]) -> list[str]:
    """The WARNING and ERROR lines each log gained past the size it had."""
    loud = []
    for log, size in sizes.items():
        with log.open("rb") as f:
            f.seek(size)
            since = f.read().decode(errors="replace")
        loud += [f"{log.name}: {line}" for line in since.splitlines() if LOUD_LINE.match(line)]
    return loud


# ---- `cluster up` as a child process ---------------------------------------------------------


class ClusterUp:
    """`highwater cluster up ...` in a session of its own, with its output in a file. Whatever the
    test did, it is stopped by its pid, and so is every process it printed that is still running
    (each runs in a process group of its own)."""

    def __init__(self, data_dir: Path, out_path: Path, *args: str) -> None:
        self.out_path = out_path
        self.data_dir = str(data_dir)
        with self.out_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [HIGHWATER, "cluster", "up", "--data-dir", str(data_dir), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    @property
    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    def wait_running(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while RUNNING_LINE not in self.out:
            assert self.proc.poll() is None, f"cluster up exited with {self.proc.returncode}:\n{self.out}"
            assert time.monotonic() < deadline, f"no {RUNNING_LINE!r} within {timeout_s} s:\n{self.out}"
            time.sleep(0.2)

    def stop(self, signum: int) -> int:
        self.proc.send_signal(signum)
        return self.proc.wait(timeout=CLUSTER_STOP_TIMEOUT_S)

    def ctrl_c(self) -> int:
        """What Ctrl-C in its terminal does: SIGINT to every process of the foreground group."""
        os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout=CLUSTER_STOP_TIMEOUT_S)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # stops every process it started, in order
            try:
                self.proc.wait(timeout=CLUSTER_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=CLUSTER_STOP_TIMEOUT_S)
        for pid in [int(p) for p in re.findall(r" pid (\d+) ", self.out)]:
            with contextlib.suppress(OSError):  # gone already, or no longer ours
                if self.data_dir in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture
def cluster_up(tmp_path: Path) -> Iterator[Callable[..., ClusterUp]]:
    """Each start runs on the same data directory, as `cluster up` after `cluster up`."""
    started: list[ClusterUp] = []

    def start(*args: str) -> ClusterUp:
        started.append(ClusterUp(tmp_path / "data", tmp_path / f"cluster-up-{len(started)}.out", *args))
        return started[-1]

    try:
        yield start
    finally:
        for c in started:
            c.kill()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_cluster_up_keeps_the_token_port_from_one_start_to_the_next(
    cluster_up: Callable[..., ClusterUp],
) -> None:
    token_port = free_port()
    for _ in range(2):
        up = cluster_up("--tls", "--gateway-port", "0", "--kafka-port", "0", "--token-port", str(token_port))
        up.wait_running(CLUSTER_UP_TIMEOUT_S)
        assert f"bearer-token clients use 127.0.0.1:{token_port} " in up.out
        assert up.stop(signal.SIGTERM) == 0, up.out


@pytest.mark.slow
def test_ctrl_c_ends_the_demo_with_its_stopped_line(cluster_up: Callable[..., ClusterUp]) -> None:
    """With the Spark demo, which leaves PySpark's SIGINT handler (raise KeyboardInterrupt) in place
    of the command's: Ctrl-C printed "stopped", then click's "Aborted!", and exited with 1."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("the Spark demo needs java on PATH")
    up = cluster_up("--demo", "--spark-demo", "--gateway-port", "0", "--kafka-port", "0")
    up.wait_running(DEMO_UP_TIMEOUT_S)
    assert "read back" in up.out or "spark-demo" in up.out, up.out  # the Spark demo ran
    code = up.ctrl_c()
    assert (code, up.out.rstrip().splitlines()[-1]) == (0, "stopped"), up.out
    assert "Aborted!" not in up.out


def test_ctrl_c_in_a_terminal_stops_the_cluster_in_order_and_logs_no_warning(
    cluster_up: Callable[..., ClusterUp], tmp_path: Path
) -> None:
    """The terminal's SIGINT reached etcd and every service with `cluster up`: etcd was gone before
    the brokers' controlled shutdown ("controlled shutdown incomplete"), and no lease was revoked."""
    up = cluster_up("--gateway-port", "0", "--kafka-port", "0")
    up.wait_running(CLUSTER_UP_TIMEOUT_S)
    bootstrap = re.findall(r"bootstrap \(gateway\): (\S+)", up.out)[0]
    create = subprocess.run(
        [HIGHWATER, "--bootstrap", bootstrap, "topic", "create", "t", "--partitions", "3"],
        capture_output=True,
        text=True,
        timeout=CLUSTER_UP_TIMEOUT_S,
    )
    assert create.returncode == 0, create.stderr
    logs = service_logs(tmp_path / "data")
    before = {log: log.stat().st_size for log in logs}
    assert up.ctrl_c() == 0, up.out
    assert up.out.rstrip().splitlines()[-1] == "stopped", up.out
    assert loud_lines_since(before) == []
