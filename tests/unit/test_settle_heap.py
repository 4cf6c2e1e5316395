"""A ready service keeps its start-up heap out of later collections (services/common/server.py).

Each full collection of a broker walked the ~145,000 objects its imports made (50-130 ms on
the 2-core bench machine, the whole p99 of end-to-end latency; bench/RESULTS.md). Run in a
child process: freezing is for the process's whole life, not for the test runner's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_S = 120

CHILD = """
import gc, json
import services.broker.server  # everything a broker imports
from services.common.server import settle_heap
before = len(gc.get_objects())
settle_heap()
print(json.dumps({"before": before, "after": len(gc.get_objects()), "frozen": gc.get_freeze_count()}))
"""


def test_a_ready_service_leaves_its_start_up_objects_out_of_every_later_collection() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=True,
    )
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    assert counts["before"] > 50_000, counts  # what a full collection walked before
    assert counts["frozen"] >= counts["before"] // 2, counts
    assert counts["after"] < counts["before"] // 20, f"the collector still tracks them: {counts}"
