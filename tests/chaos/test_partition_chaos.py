"""Network partitions between real brokers, in network namespaces this test makes (root only).

Each test makes a fresh set of namespaces (netns.py: a hub with a bridge,
etcd, the controller and the gateway; one namespace per broker) and runs one
scenario of partition_scenarios.py inside the hub with a bounded timeout: the
cluster's addresses exist only inside those namespaces, and this process
stays on loopback in the root namespace. The scenario prints what it injected,
how the cluster reacted and what the history and replica checkers found, and
ends with a `CHAOS_RESULT {json}` line asserted on here. Whatever happens, the
fixture kills every process left in the namespaces by pid and deletes them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos import netns
from tests.chaos.partition_scenarios import BROKERS, RESULT_PREFIX

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(netns.unavailable_reason() is not None, reason=str(netns.unavailable_reason())),
]

REPO_ROOT = Path(__file__).resolve().parents[2]
# One scenario: start-up, its faults and waits, the checks and the stop take about a minute on
# 2 busy cores; this bounds a hung one well inside pytest's own 300 s timeout.
SCENARIO_TIMEOUT_S = 200.0
# Proxy settings of the machine mean nothing inside the namespaces (and gRPC would honour them).
_PROXY_VARIABLES = {"http_proxy", "https_proxy", "grpc_proxy", "all_proxy"}


@pytest.fixture
def topology() -> Iterator[netns.Topology]:
    reaped = netns.reap_stale()
    if reaped:
        print(f"removed namespaces left by earlier runs: {reaped}")
    net = netns.Topology(netns.Topology.new_prefix(), BROKERS)
    try:
        yield net.create()
    finally:
        killed = net.destroy()
        if killed:
            print(f"killed processes left in the namespaces: {killed}")
        assert net.leftovers() == [], f"namespaces not removed: {net.leftovers()}"


def run_in_hub(net: netns.Topology, scenario: str, tmp_path: Path) -> dict[str, object]:
    """Run one scenario in the hub namespace (bounded); its result line, after printing its output."""
    output = tmp_path / f"{scenario}.out"
    cmd = [
        *net.exec_prefix(net.hub),
        sys.executable,
        "-m",
        "tests.chaos.partition_scenarios",
        scenario,
        "--prefix",
        net.prefix,
        "--base-dir",
        str(tmp_path / "cluster"),
    ]
    env = {k: v for k, v in os.environ.items() if k.lower() not in _PROXY_VARIABLES}
    env["PYTHONUNBUFFERED"] = "1"
    with output.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT, env=env
        )
        try:
            proc.wait(timeout=SCENARIO_TIMEOUT_S)
            timed_out = False
        except subprocess.TimeoutExpired:
            proc.kill()  # its cluster is killed by the topology fixture, by pid
            proc.wait()
            timed_out = True
    text = output.read_text(errors="replace")
    print(f"\n--- {scenario} (in {net.hub}) ---\n{text}")
    assert not timed_out, (
        f"{scenario} did not finish within {SCENARIO_TIMEOUT_S} s; its output:\n{text[-6000:]}"
    )
    lines = [line for line in text.splitlines() if line.startswith(RESULT_PREFIX)]
    assert lines, f"{scenario} exited with {proc.returncode} and no result line; its output:\n{text[-6000:]}"
    result: dict[str, object] = json.loads(lines[-1][len(RESULT_PREFIX) :])
    assert result["error"] is None, f"{scenario}: {result['error']} (logs in {result['logs']})"
    assert result["problems"] == [], result["problems"]
    assert isinstance(result["acked"], int) and result["acked"] > 0
    assert proc.returncode == 0
    return result


def test_a_follower_partitioned_from_the_leaders_leaves_and_rejoins_the_isr(topology, tmp_path):
    result = run_in_hub(topology, "follower_partitioned", tmp_path)
    facts = result["facts"]
    assert isinstance(facts, dict)
    assert facts["acks_per_partition_while_cut"] > 0, "writes went on without the follower"


def test_a_leader_cut_from_its_followers_refuses_acks_all_writes_instead_of_losing_them(topology, tmp_path):
    result = run_in_hub(topology, "leader_cut_from_followers", tmp_path)
    facts = result["facts"]
    assert isinstance(facts, dict)
    assert facts["acks_on_cut_leaders_partitions"] == 0
    outcomes = facts["outcomes_on_cut_leaders_partitions"]
    assert isinstance(outcomes, dict)
    assert outcomes.get("NOT_ENOUGH_REPLICAS", 0) > 0, outcomes


def test_an_isolated_leader_is_replaced_and_rejoins_with_its_divergent_tail_truncated(topology, tmp_path):
    result = run_in_hub(topology, "leader_isolated", tmp_path)
    facts = result["facts"]
    assert isinstance(facts, dict)
    assert facts["divergent_tail_records"] > 0
    assert facts["divergent_records_kept"] == 0


def test_a_leader_cut_from_etcd_only_is_replaced_and_acknowledges_nothing_as_a_zombie(topology, tmp_path):
    result = run_in_hub(topology, "leader_cut_from_etcd", tmp_path)
    facts = result["facts"]
    assert isinstance(facts, dict)
    answers = facts["zombie_answers"]
    assert isinstance(answers, dict) and answers and "NONE" not in answers.values(), answers
    assert facts["divergent_records_kept"] == 0
