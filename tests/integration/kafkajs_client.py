"""kafkajs, a Kafka client nobody here wrote, driven from the integration tests.

`run_kafkajs(brokers, body)` runs `body` as the body of an async JavaScript function with
`kafka` (a `Kafka` of kafkajs configured for `brokers`, retries kept short) and `kafkajs`
(the module: `kafkajs.AssignerProtocol`, error classes...) in scope, and returns what it
returns, as JSON. A script that throws fails the test with the error's name, message and
stack, and kafkajs' own log lines. kafkajs is installed with `npm ci` from
tests/integration/kafkajs/package-lock.json, once per lock file (as test_node_client.py
installs the Node.js example's packages).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

KAFKAJS_DIR = Path(__file__).resolve().parent / "kafkajs"
# npm ci fetches one package (kafkajs has no dependencies); a slow registry takes a minute.
NPM_INSTALL_TIMEOUT_S = 300
# A script's own bound; each of its calls is bounded by kafkajs' request timeout below.
SCRIPT_TIMEOUT_S = 120
RESULT_MARK = "@@highwater-result@@"

_WRAPPER = """
const kafkajs = require('kafkajs');
const brokers = JSON.parse(process.env.HIGHWATER_KAFKAJS_BROKERS);
const kafka = new kafkajs.Kafka({
  clientId: 'highwater-tests', brokers, logLevel: kafkajs.logLevel.WARN,
  requestTimeout: 10000, connectionTimeout: 3000,
  retry: { retries: 5, initialRetryTime: 100, maxRetryTime: 1000 },
});
(async () => {
%s
})().then(
  (result) => { console.log('%s' + JSON.stringify(result === undefined ? null : result)); process.exit(0); },
  (error) => {
    console.error(`${error.name}: ${error.message}\\n${error.stack}`);
    process.exit(3);
  });
"""


def kafkajs_installed() -> str:
    """The node binary, with kafkajs installed beside the tests (npm ci when the lock changed)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail(
            "the kafkajs tests need Node.js and npm on PATH (./dev test installs Node.js's nodejs and npm)"
        )
    lock = KAFKAJS_DIR / "package-lock.json"
    want = hashlib.sha256(lock.read_bytes()).hexdigest()
    stamp = KAFKAJS_DIR / "node_modules" / ".highwater-installed"
    if not (stamp.exists() and stamp.read_text() == want):
        result = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"],
            cwd=KAFKAJS_DIR,
            capture_output=True,
            text=True,
            timeout=NPM_INSTALL_TIMEOUT_S,
        )
        assert result.returncode == 0, f"npm ci failed in {KAFKAJS_DIR}:\n{result.stdout}\n{result.stderr}"
        stamp.write_text(want)
    return node


def run_kafkajs(brokers: Sequence[str], body: str, *, timeout_s: float = SCRIPT_TIMEOUT_S) -> Any:
    """Run `body` with kafkajs against `brokers` ("host:port" of Kafka listeners); its result."""
    node = kafkajs_installed()
    env = {**os.environ, "HIGHWATER_KAFKAJS_BROKERS": json.dumps(list(brokers))}
    result = subprocess.run(
        [node, "-"],
        input=_WRAPPER % (body, RESULT_MARK),
        cwd=KAFKAJS_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert result.returncode == 0, (
        f"kafkajs script failed ({result.returncode}):\n{result.stderr}\n{result.stdout}"
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith(RESULT_MARK)]
    assert lines, f"kafkajs script printed no result:\n{result.stdout}\n{result.stderr}"
    return json.loads(lines[-1][len(RESULT_MARK) :])
