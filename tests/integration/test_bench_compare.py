"""bench/peers/compare.py runs every workload to the end, so the benchmark cannot break silently.

compare.py catches a system's failure and goes on to the next one (one system must not lose the
others' figures), so a bench broken by a change elsewhere (issue 38: `--hops` added to
bench/e2e_latency.py left compare's e2e without an attribute) still exits 0 and prints a ratio
table without Highwater in it. Here each workload runs for Highwater only (--no-peers: NATS and
Redis need their servers installed), Kafka listener path included, for about a second, and its
result file must hold a figure for every path and no error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.bench_runs import ROOT, run_bench_script

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COMPARE = ROOT / "bench" / "peers" / "compare.py"
# One workload: a LocalCluster's start, a few runs of ~1.5 s and a stop; generous for a shared machine.
RUN_TIMEOUT_S = 120.0
SHORT = ["--rounds", "1", "--duration-s", "1", "--warmup-s", "0.5", "--quiet-wait-s", "0", "--no-peers"]
# What each workload must report for Highwater: the systems named, and the figure each must have.
EXPECTED = {
    "produce-100b": (["highwater client", "highwater direct", "highwater kafka"], "records_per_s", []),
    "produce-10kb": (["highwater client", "highwater kafka"], "records_per_s", ["--our-paths", "client"]),
    "consume": (
        ["highwater consumer", "highwater fetch", "highwater kafka", "highwater kafka defaults"],
        "records_per_s",
        ["--records", "20000"],
    ),
    "e2e": (
        ["highwater", "highwater kafka linger 5", "highwater kafka linger 0"],
        "received",
        ["--rates", "500"],
    ),
}


def run_compare(workload: str, extra: list[str], output: Path) -> str:
    """Run compare.py for `workload`; its output (bench_runs.run_bench_script)."""
    return run_bench_script(
        COMPARE, ["--workload", workload, *SHORT, *extra, "--output", str(output)], timeout_s=RUN_TIMEOUT_S
    )


@pytest.mark.parametrize("workload", list(EXPECTED))
def test_compare_runs_the_workload_for_highwater(workload: str, tmp_path: Path) -> None:
    systems, figure, extra = EXPECTED[workload]
    output = tmp_path / f"compare-{workload}.json"
    out = run_compare(workload, extra, output)
    (round_,) = json.loads(output.read_text())["rounds"]
    rows = round_["results"]
    failed = [row for row in rows if "error" in row]
    assert not failed, f"{workload}: {failed}\n{out}"
    assert [row["system"] for row in rows] == systems, out
    for row in rows:
        assert float(row[figure]) > 0, f"{workload}: {row['system']} reports {figure}={row[figure]}\n{out}"
