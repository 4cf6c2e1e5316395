"""The Node.js client (clients/node/) against a real cluster: the protos as other languages see them.

The test installs the client's npm packages itself (`npm ci`, once per package-lock.json:
a stamp in node_modules/ says which lock was installed), then runs its contract test,
which loads protos/ at run time with @grpc/proto-loader, produces 10,000 keyed records
with headers through ProduceRecords and consumes them back through ConsumeRecords.
Here we check that every key went to the partition our Python Producer picks for it.
Skipped, with the reason, only when `node` is not installed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from clients.common.partitioner import partition_for_key

pytestmark = pytest.mark.integration

NODE_DIR = Path(__file__).resolve().parents[2] / "clients" / "node"
# npm ci fetches two packages and their few dependencies; a slow registry takes a minute.
NPM_INSTALL_TIMEOUT_S = 300
# 10,000 records produced, read back and checked: ~10 s on a laptop, bounded well above.
CONTRACT_TEST_TIMEOUT_S = 240
RECORDS = 10_000
PARTITIONS = 6  # contract_test.js creates its topic with this many


def _npm_installed() -> None:
    """node_modules/ matching package-lock.json, installed with `npm ci` when it does not."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(
            "node is installed but npm is not; install npm (it ships with Node.js) to run the Node client"
        )
    lock = NODE_DIR / "package-lock.json"
    want = hashlib.sha256(lock.read_bytes()).hexdigest()
    stamp = NODE_DIR / "node_modules" / ".highwater-installed"
    if stamp.exists() and stamp.read_text() == want:
        return
    result = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=NPM_INSTALL_TIMEOUT_S,
    )
    assert result.returncode == 0, f"npm ci failed in {NODE_DIR}:\n{result.stdout}\n{result.stderr}"
    stamp.write_text(want)


@pytest.mark.timeout(NPM_INSTALL_TIMEOUT_S + CONTRACT_TEST_TIMEOUT_S + 120)
def test_the_node_client_produces_and_consumes_10000_keyed_records_partitioned_as_python_does(cluster):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the Node.js client (clients/node/) needs Node.js 18 or later")
    _npm_installed()
    result = subprocess.run(
        [node, "contract_test.js", cluster.gateway_address.split(",")[0], "node-contract", str(RECORDS)],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=CONTRACT_TEST_TIMEOUT_S,
    )
    lines = result.stdout.strip().splitlines()
    assert lines, f"the Node contract test printed nothing (exit {result.returncode}):\n{result.stderr}"
    report = json.loads(lines[-1])
    assert report["ok"], report.get("error")
    assert result.returncode == 0
    assert report["records"] == RECORDS
    key_partitions = report["key_partitions"]
    assert len(key_partitions) == 700
    wrong = {k: p for k, p in key_partitions.items() if p != partition_for_key(k.encode(), PARTITIONS)}
    assert not wrong, f"keys placed differently from the Python Producer: {dict(list(wrong.items())[:5])}"
