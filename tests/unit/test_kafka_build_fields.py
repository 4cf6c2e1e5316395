"""Every field the Kafka listener names in protocol.build() exists in some version of its message.

build() refuses an unknown name when it runs (test_transition_tables.py); this reads the source
of services/kafka/ so that a misspelt field on a path no test drives (an error answer, an old
version) is caught too. A class is followed from `protocol.response_class(protocol.API, ...)` or
`request_class(...)` and `nested(cls, "Name")` assignments in the same function; a build() whose
class is chosen at run time (one function serving two APIs) is left to the run-time check.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Any

from services.kafka import protocol
from tests.python_source import parse_python

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The builds followed today are 75 (of 77); far fewer means the reading below lost track of them.
BUILDS_CHECKED_MIN = 60


def _api_key(node: ast.expr) -> int | None:
    """protocol.PRODUCE / PRODUCE -> its number; None when chosen at run time."""
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    value = getattr(protocol, name, None) if name is not None else None
    return value if isinstance(value, int) and value in protocol.SUPPORTED_VERSIONS else None


def _call_name(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def _class_of(value: ast.expr, known: dict[str, Any]) -> Any:
    """The kio class (newest served version) an expression names, or None."""
    if not isinstance(value, ast.Call) or not value.args:
        return None
    name = _call_name(value)
    if name in ("response_class", "request_class"):
        api = _api_key(value.args[0])
        if api is None:
            return None
        newest = protocol.SUPPORTED_VERSIONS[api][1]
        return getattr(protocol, name)(api, newest)
    if name == "nested" and len(value.args) == 2 and isinstance(value.args[1], ast.Constant):
        outer = known.get(value.args[0].id) if isinstance(value.args[0], ast.Name) else None
        return protocol.nested(outer, str(value.args[1].value)) if outer is not None else None
    return None


def _unknown_fields(path: pathlib.Path) -> tuple[list[str], int]:
    problems: list[str] = []
    checked = 0
    for function in ast.walk(parse_python(path.read_text())):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        known: dict[str, Any] = {}
        for node in ast.walk(function):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                cls = _class_of(node.value, known)
                if cls is not None:
                    known[node.targets[0].id] = cls
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and _call_name(node) == "build" and node.args):
                continue
            first = node.args[0]
            cls = known.get(first.id) if isinstance(first, ast.Name) else None
            if cls is None:
                continue
            checked += 1
            every = protocol._field_names_of_every_version(cls)
            for kw in node.keywords:
                if kw.arg is not None and kw.arg not in every:
                    problems.append(f"{path.name}:{kw.value.lineno}: {cls.__name__} has no field {kw.arg!r}")
    return problems, checked


def test_every_field_named_in_a_build_exists_in_some_version_of_its_message() -> None:
    problems: list[str] = []
    checked = 0
    for path in sorted((ROOT / "services" / "kafka").glob("*.py")):
        found, n = _unknown_fields(path)
        problems += found
        checked += n
    assert problems == []
    assert checked >= BUILDS_CHECKED_MIN, checked
