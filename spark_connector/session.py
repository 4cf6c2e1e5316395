"""Setting up a SparkSession whose Python workers can run the connector.

Spark runs the connector in its Python workers, with the interpreter named by
spark.pyspark.python (or the PYSPARK_PYTHON environment variable), "python3" when
neither is set. If that interpreter cannot import `pyspark_highwater`, Spark's lookup
of Python data sources finds nothing and a query fails with only
"[DATA_SOURCE_NOT_FOUND] Failed to find the data source: highwater". So:

- `spark_settings()` returns the builder settings that make the workers run this
  interpreter (the one that imported highwater), and find the package when it is a
  checkout rather than an install;
- `configure(builder)` applies them;
- `check_spark_session(spark)` asks a worker what it runs and fails, before any query,
  with the exact settings to change.

This module imports no Spark: it is usable before a session exists.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

# The module Spark's data source lookup imports (it scans top-level `pyspark_*` modules).
LOOKUP_MODULE = "pyspark_highwater"
# Spark's settings for the workers' and the driver's interpreter (they win over PYSPARK_PYTHON),
# and for an environment variable of every executor's Python workers.
WORKER_PYTHON_SETTING = "spark.pyspark.python"
DRIVER_PYTHON_SETTING = "spark.pyspark.driver.python"
WORKER_PYTHONPATH_SETTING = "spark.executorEnv.PYTHONPATH"


class SparkSetupError(RuntimeError):
    """The session's Python workers cannot run the connector; the message says what to set."""


def _module_directory() -> Path | None:
    spec = importlib.util.find_spec(LOOKUP_MODULE)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).resolve().parent


def _installed(directory: Path) -> bool:
    """True when `directory` is on every interpreter's default path (site-packages), not a checkout."""
    site = {
        Path(p).resolve()
        for p in (sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib"))
        if p
    }
    return directory in site


def spark_settings(python: str | None = None) -> dict[str, str]:
    """The SparkSession builder settings that let Python workers run the connector.

    `python`: the interpreter the workers should run (default: this one, which has
    highwater). On a cluster it must exist at that path on every node: install
    `highwater[spark]` there, or ship an environment with --archives and name its
    interpreter (docs/SPARK.md). From a checkout, the checkout goes on the workers'
    PYTHONPATH, because Spark's lookup cannot see setuptools' editable installs.
    """
    executable = python or sys.executable
    settings = {WORKER_PYTHON_SETTING: executable, DRIVER_PYTHON_SETTING: executable}
    directory = _module_directory()
    if directory is not None and not _installed(directory):
        paths = [str(directory), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        settings[WORKER_PYTHONPATH_SETTING] = os.pathsep.join(dict.fromkeys(paths))
    return settings


def configure(builder: Any, python: str | None = None) -> Any:
    """`builder` (SparkSession.builder) with spark_settings() applied; returns it for chaining.

    Call it before the session starts. It also sets PYSPARK_PYTHON / PYSPARK_DRIVER_PYTHON
    (and, for a checkout, PYTHONPATH) in this process's environment: PySpark takes the
    workers' interpreter from PYSPARK_PYTHON when it creates a local session's context, not
    from spark.pyspark.python, and Spark's data source lookup worker, which does not get
    spark.executorEnv.*, inherits the environment of the JVM the session starts.
    """
    settings = spark_settings(python)
    for key, value in settings.items():
        builder = builder.config(key, value)
    os.environ["PYSPARK_PYTHON"] = settings[WORKER_PYTHON_SETTING]
    os.environ["PYSPARK_DRIVER_PYTHON"] = settings[DRIVER_PYTHON_SETTING]
    if WORKER_PYTHONPATH_SETTING in settings:
        os.environ["PYTHONPATH"] = settings[WORKER_PYTHONPATH_SETTING]
    return builder


def check_spark_session(spark: Any) -> str:
    """Fail with what to set if `spark`'s Python workers cannot run the connector; else their interpreter.

    Runs one tiny task (it needs nothing from highwater on the worker), so it works
    exactly where format("highwater") would fail with DATA_SOURCE_NOT_FOUND.
    """
    module = LOOKUP_MODULE

    def report(_: object) -> tuple[str, str, str]:
        # Runs in a Python worker, pickled by value: it needs nothing but the standard library.
        # It imports the connector as Spark's lookup would, so a missing dependency shows too.
        import importlib
        import sys as worker_sys

        try:
            importlib.import_module(module)
            problem = ""
        except ImportError as exc:
            problem = f"{type(exc).__name__}: {exc}"
        return worker_sys.executable, problem, os.pathsep.join(worker_sys.path)

    context = spark.sparkContext
    try:
        executable, problem, path = context.parallelize([0], 1).map(report).collect()[0]
    except Exception as exc:  # the worker could not even start, e.g. a bad spark.pyspark.python
        configured = (
            context.getConf().get(WORKER_PYTHON_SETTING) or os.environ.get("PYSPARK_PYTHON") or "python3"
        )
        raise SparkSetupError(
            f"Spark's Python workers (interpreter {configured!r}) could not run a task "
            f"({type(exc).__name__}); "
            f"set {WORKER_PYTHON_SETTING} to an interpreter with highwater[spark] installed, e.g. "
            f"{_suggestion()}"
        ) from exc
    if problem:
        raise SparkSetupError(
            f"Spark's Python workers run {executable}, which cannot import {LOOKUP_MODULE} ({problem}), so "
            f'format("highwater") fails with DATA_SOURCE_NOT_FOUND. Set {_suggestion()} before the session '
            f"starts (spark_connector.configure(SparkSession.builder) does it; or export PYSPARK_PYTHON), or "
            f"install highwater[spark] into {executable} on every node. Worker sys.path: {path}"
        )
    return str(executable)


def _suggestion() -> str:
    return ", ".join(f"{k}={v}" for k, v in spark_settings().items())
