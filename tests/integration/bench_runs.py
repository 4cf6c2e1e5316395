"""Running a bench/ script from a test, as a user does: its own process from the repository root."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The scripts leave through their `with` blocks on SIGTERM (bench/common.py), stopping their clusters.
STOP_TIMEOUT_S = 30.0


def run_bench_script(script: Path, args: list[str], *, timeout_s: float) -> str:
    """Run `script` with `args`; its output (stdout and stderr). Fails the test with that output if
    it exits non-zero, or if it is still running after timeout_s: then it is stopped by pid
    (SIGTERM, then SIGKILL)."""
    name = " ".join([script.name, *args[:2]])
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        pytest.fail(f"{name} did not finish within {timeout_s} s:\n{out}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{out}"
    return out
