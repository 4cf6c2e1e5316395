"""Pure logic imports no grpc, no etcd client, no asyncio and reads no clock (STYLE.md, practice 1).

Walks the imports of each pure module with `ast`, so a sneaked-in import fails here
before it makes the deterministic simulation lie.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE_MODULES = [
    "services/broker/partition.py",
    "services/broker/core.py",
    "services/broker/purgatory.py",
    "services/broker/fetcher_core.py",
    "services/broker/steps.py",
    "services/broker/fetch_state.py",
    "services/broker/log",
    "clients/common/record_batch.py",
    "clients/common/record_validation.py",
    "clients/common/errors.py",
    "services/controller/context.py",
    "services/controller/handlers.py",
    "services/controller/elections.py",
    "services/controller/assignment.py",
    "services/gateway/routing.py",
    "services/gateway/record_level.py",
    "services/broker/producer_state.py",
    "services/controller/state_machines.py",
    "services/controller/sender_rules.py",
    "clients/common/topics.py",
    "services/common/request_checks.py",
    "clients/accumulator.py",
    "clients/idempotence.py",
    "clients/common/partitioner.py",
    "clients/errors.py",
    "clients/types.py",
]
FORBIDDEN_IMPORTS = ("grpc", "etcd3aio", "asyncio", "coordinator", "threading", "socket", "time")
FORBIDDEN_CALLS = ("time.time", "time.monotonic", "datetime.now")


def _files(entry: str) -> list[Path]:
    path = ROOT / entry
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


@pytest.mark.parametrize(
    "path", [p for e in PURE_MODULES for p in _files(e)], ids=lambda p: str(p.relative_to(ROOT))
)
def test_pure_module_has_no_io_imports(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            if name.split(".")[0] in FORBIDDEN_IMPORTS:
                bad.append(f"line {node.lineno}: import {name}")
    source = path.read_text()
    bad += [f"calls {c}" for c in FORBIDDEN_CALLS if c + "(" in source]
    assert not bad, f"{path.relative_to(ROOT)} must stay pure: {bad}"
