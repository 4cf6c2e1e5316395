"""Run a script in a fresh interpreter with Numba's bounds checking on, for the kernels' fuzz tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_with_numba_boundscheck(script: str, cache_dir: Path) -> tuple[int, int]:
    """Run SCRIPT with NUMBA_BOUNDSCHECK=1 and its own (empty) cache dir, so the checked build is what
    runs; it must exit 0 and print two counts, which are returned."""
    env = {
        **os.environ,
        "NUMBA_BOUNDSCHECK": "1",
        "NUMBA_CACHE_DIR": str(cache_dir),
        "PYTHONPATH": str(REPO_ROOT),
    }
    run = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO_ROOT,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    first, second = map(int, run.stdout.split())
    return first, second
