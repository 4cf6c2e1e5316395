"""bench/scale.py runs to the end at two small partition counts, so the benchmark cannot break silently.

Each count gets its own cluster with --replicas-max; the run must report every figure (creation,
idle CPU of every broker, produce, both catch-up reads, e2e) and the summary against the first
count. The real counts (10, 1,000, 10,000) take minutes and are bench/RESULTS.md's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.bench_runs import ROOT, run_bench_script

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCALE = ROOT / "bench" / "scale.py"
# Two clusters' start, ~1 s of each workload and the stops; generous for a shared machine.
RUN_TIMEOUT_S = 240.0
COUNTS = [2, 20]


def test_scale_reports_every_figure_at_each_partition_count(tmp_path: Path) -> None:
    output = tmp_path / "scale.json"
    out = run_bench_script(
        SCALE,
        [
            "--partitions",
            *map(str, COUNTS),
            "--idle-s",
            "1",
            "--settle-s",
            "0",
            "--duration-s",
            "1",
            "--warmup-s",
            "0.5",
            "--rate",
            "200",
            "--output",
            str(output),
        ],
        timeout_s=RUN_TIMEOUT_S,
    )
    result = json.loads(output.read_text())
    assert [row["partitions"] for row in result["counts"]] == COUNTS, out
    for row in result["counts"]:
        assert {"broker-1", "broker-2", "broker-3"} <= set(row["idle_cores"]), out
        assert row["produce"]["records_acked"] > 0, out
        assert row["records_written"] >= row["produce"]["records_acked"], out
        for reader in ("catch_up_consumer", "catch_up_kafka"):
            assert row[reader]["records"] == row["records_written"], f"{reader} read all\n{out}"
        assert row["e2e"]["received"] > 0 and row["e2e"]["latency"]["p50_ms"] > 0, out
        stalls = row["e2e"]["loop_stalls"]
        assert {"broker-1", "broker-2", "broker-3", "controller-1", "gateway-1"} <= set(stalls), out
        assert all(set(s) == {">=0.02s", ">=0.05s", ">=0.1s", "sum_s"} for s in stalls.values()), out
    assert set(result["summary"]) == {str(n) for n in COUNTS}, out
    assert result["summary"][str(COUNTS[0])]["produce_vs_first"] == 1.0, out
