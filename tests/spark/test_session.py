"""Setting up a session: what happens without the helper, and that the helper is all it takes.

Each case runs a fresh Python process with a clean environment (no PYSPARK_PYTHON, no
PYTHONPATH), as a user's script would start, so the session under test is its own and the
shared `spark` fixture is not involved.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
# A local session starting and one tiny task, on a shared 2-core machine.
SCRIPT_TIMEOUT_S = 240

SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from pyspark.sql import SparkSession
    from spark_connector import SparkSetupError, check_spark_session, configure
    builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
    if sys.argv[1] == "configured":
        builder = configure(builder)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("OFF")
    try:
        print("WORKERS RUN", check_spark_session(spark))
    except SparkSetupError as exc:
        print("SETUP ERROR", exc)
    try:
        spark.read.format("highwater").option("bootstrap", "127.0.0.1:1").option("subscribe", "t").load()
        print("FOUND highwater")
    except Exception as exc:
        print("LOOKUP", "DATA_SOURCE_NOT_FOUND" if "DATA_SOURCE_NOT_FOUND" in str(exc) else exc)
    spark.stop()
""")


def _run(tmp_path: Path, mode: str) -> str:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT.format(root=str(REPO_ROOT)))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")
    }
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    # The workers' default interpreter ("python3") must be one without highwater, as on a fresh node.
    done = subprocess.run(
        [sys.executable, str(script), mode],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )
    return done.stdout + done.stderr[-3000:]


def test_without_the_helper_the_check_says_exactly_what_to_set(tmp_path: Path) -> None:
    probe = subprocess.run(
        ["python3", "-c", "import pyspark_highwater"],
        cwd=tmp_path,
        capture_output=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        check=False,
    )
    if probe.returncode == 0:
        pytest.skip("the default python3 here has highwater installed: nothing would be missing")
    out = _run(tmp_path, "plain")
    assert "LOOKUP DATA_SOURCE_NOT_FOUND" in out, out  # Spark alone says no more than this
    assert "SETUP ERROR" in out, out
    assert f"spark.pyspark.python={sys.executable}" in out and "PYSPARK_PYTHON" in out, out
    assert "spark_connector.configure(SparkSession.builder)" in out, out


def test_with_the_helper_workers_find_the_data_source(tmp_path: Path) -> None:
    out = _run(tmp_path, "configured")
    assert f"WORKERS RUN {sys.executable}" in out and "FOUND highwater" in out, out
