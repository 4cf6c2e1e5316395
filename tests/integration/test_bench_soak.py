"""bench/soak.py runs its whole mixed workload to the end and reports every figure it promises.

A soak runs for hours, so a break (a renamed client option, a process it no longer finds) would
otherwise show only when someone starts a long run. Here it runs for about 30 s at tiny rates,
with every part of the workload due at least once and heap dumps of broker-1 (the
HIGHWATER_HEAP_DEBUG_DIR hook of services/common/heap_debug.py), and must print the verdict
table and write a JSON with samples, slopes and counts for every process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.bench_runs import ROOT, run_bench_script

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SOAK = ROOT / "bench" / "soak.py"
# A LocalCluster's start, 30 s of workload, the read-back and a stop; generous for a shared machine.
RUN_TIMEOUT_S = 240.0
SHORT = [
    "--duration", "30s", "--warmup", "6s", "--sample-every", "3s",
    "--rate", "50", "--burst-every", "10s", "--burst-s", "2s", "--burst-rate", "300",
    "--partitions", "2", "--churn-every", "6s", "--restart-every", "9s", "--short-client-every", "3s",
    "--heap-debug", "broker-1",
]  # fmt: skip
PROCESSES = {"etcd", "controller-1", "broker-1", "broker-2", "broker-3", "gateway-1", "workload"}
FIGURES = {"rss_mib", "anon_mib", "file_mib", "fds", "threads", "cpu_s"}


def run_soak(output: Path) -> str:
    """Run soak.py; its output (bench_runs.run_bench_script)."""
    return run_bench_script(SOAK, [*SHORT, "--output", str(output)], timeout_s=RUN_TIMEOUT_S)


def test_soak_completes_and_reports_every_figure(tmp_path: Path) -> None:
    output = tmp_path / "soak.json"
    out = run_soak(output)
    assert "verdict" in out and "0 lost (our group)" in out and "RSS < 10 MiB/h" in out, out

    result = json.loads(output.read_text())
    samples = result["samples"]
    assert len(samples) >= 8, out  # 30 s every 3 s
    for sample in samples:
        assert set(sample["processes"]) == PROCESSES, sample
        for name, figures in sample["processes"].items():
            assert set(figures) >= FIGURES, (name, figures)
        assert sample["etcd"]["db_mib"] > 0, sample["etcd"]
    assert set(result["growth_per_hour"]) >= PROCESSES, result["growth_per_hour"]
    assert "db_mib" in result["growth_per_hour"]["etcd"]

    counts = result["counts"]
    assert counts["acked"] > 0 and counts["lost_our_group"] == 0 and counts["lost_kafka_group"] == 0, counts
    for part in ("commits", "short_clients", "topics_created", "topics_deleted", "member_restarts"):
        assert counts.get(part, 0) > 0, f"{part} never ran: {counts}\n{out}"
    targets = [row["target"] for row in result["verdict"]]
    assert "etcd db size flat (< 1 MiB/h)" in targets and "broker-2 open files flat" in targets, targets

    first, last = (Path(ROOT / p) for p in result["heap_dumps"]["after_warmup"] + result["heap_dumps"]["end"])
    assert first.parent == tmp_path / "soak-heap", first
    assert "tracemalloc started" in first.read_text()
    assert "allocations by line, change since the previous dump" in last.read_text()
