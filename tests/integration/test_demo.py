"""The README's run command: `highwater cluster up --demo` starts a cluster,
runs the demo and stops it all.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

DEMO_TIMEOUT_S = 120
# How long the launcher may take to stop its children once told to.
STOP_TIMEOUT_S = 60


def test_cluster_up_demo_produces_and_consumes_then_stops_every_process(tmp_path: Path):
    highwater = shutil.which("highwater", path=str(Path(sys.executable).parent)) or "highwater"
    proc = subprocess.Popen(
        [
            highwater,
            "cluster",
            "up",
            "--demo",
            "--exit-after-demo",
            "--no-spark-demo",
            "--gateway-port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=DEMO_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            # Each child runs in a process group of its own (a terminal's Ctrl-C reaches only the
            # launcher): SIGTERM makes the launcher stop them in order; past that, the launcher is
            # killed and every child it printed is killed by its pid.
            proc.terminate()
            try:
                out, _ = proc.communicate(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, _ = proc.communicate(timeout=STOP_TIMEOUT_S)
            for pid in _printed_pids(out):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    for name in ("etcd", "controller-1", "broker-1", "broker-2", "broker-3", "gateway-1"):
        assert name in out
    assert "produced 9 records" in out
    assert "consumed 9 records" in out
    assert out.rstrip().endswith("stopped")
    # Every child is gone: their pids, printed by the command, no longer exist.
    pids = _printed_pids(out)
    assert len(pids) == 6
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _printed_pids(out: str) -> list[int]:
    """The children's pids as `cluster up` prints them ("... pid 1234 ...")."""
    return [int(line.split("pid")[1].split()[0]) for line in out.splitlines() if " pid " in line]
