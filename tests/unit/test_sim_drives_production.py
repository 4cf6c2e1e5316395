"""The simulation drives the code that ships: tests/sim holds no copy of a production function.

A copy in the simulation ("re-implements X in the same order as the real code") has to be
changed with the real one and cannot find a bug in it (issue 40). This test reads every
function of tests/sim and of the servers (services/, coordinator/) with `ast` and fails
when one of the simulation's functions shares a run of RUN_STATEMENTS_MIN statements of
the same shape with a production function.

Shape: each statement (for a compound one, its header: the test of an `if`, the target
and iterable of a `for`, a `try`'s handlers' types) with every name, attribute, argument
name and constant erased, `await x` read as `x` and the simulation's `run_sync(x)` (its
await) read as `x`. So renaming variables, swapping `self.store` for `self.client` or
awaiting through `run_sync` does not hide a copy. Class bodies (dataclass field lists)
are not functions and are not compared. A run must hold at least RUN_NODES_MIN AST nodes,
so that six one-line assignments of the same trivial form are not taken for a copy.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.python_source import parse_python

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "tests" / "sim"
PRODUCTION = (ROOT / "services", ROOT / "coordinator")
# Six statements in a row of the same shape is a copy, not a coincidence of style.
RUN_STATEMENTS_MIN = 6
# ... unless they are all tiny (six `x = y.z`): a run must carry this many AST nodes.
RUN_NODES_MIN = 40
# A statement this small (`return`, `try:`, `pass`) proves nothing on its own.
STATEMENT_NODES_MIN = 4
# A copy may add or drop a statement here and there: matched statements may be this far apart.
GAP_STATEMENTS_MAX = 3


@dataclass(frozen=True)
class Statement:
    shape: str
    nodes: int
    where: str


class _Erase(ast.NodeTransformer):
    """Names, attributes, argument names and constants erased; `await x` and `run_sync(x)` read as x."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name(id="_", ctx=ast.Load())

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        return ast.Attribute(value=self.visit(node.value), attr="_", ctx=ast.Load())

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant(value=None)

    def visit_keyword(self, node: ast.keyword) -> ast.AST:
        return ast.keyword(arg="_", value=self.visit(node.value))

    def visit_arg(self, node: ast.arg) -> ast.AST:
        return ast.arg(arg="_")

    def visit_Await(self, node: ast.Await) -> ast.AST:
        erased: ast.AST = self.visit(node.value)
        return erased

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if isinstance(node.func, ast.Name) and node.func.id == "run_sync" and len(node.args) == 1:
            erased: ast.AST = self.visit(node.args[0])
            return erased
        self.generic_visit(node)
        return node

    def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.AST:
        return ast.Constant(value=None)  # log and error messages are not logic


_BODIES = ("body", "orelse", "finalbody", "handlers")


def _header(stmt: ast.stmt) -> ast.AST:
    """The statement without the statements nested in it."""
    head: Any = copy.copy(stmt)
    for name in _BODIES:
        if hasattr(head, name):
            setattr(head, name, [])
    if isinstance(stmt, ast.Try | ast.TryStar):
        head.handlers = [ast.ExceptHandler(type=h.type, name=None, body=[]) for h in stmt.handlers]
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        head.decorator_list = []
    erased: ast.AST = head
    return erased


def _flatten(body: list[ast.stmt], where: str) -> Iterator[Statement]:
    for stmt in body:
        if (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        ):
            continue  # a docstring
        head = _Erase().visit(_header(stmt))
        yield Statement(ast.dump(head), sum(1 for _ in ast.walk(head)), f"{where}:{stmt.lineno}")
        for name in _BODIES:
            nested = getattr(stmt, name, None)
            if name == "handlers" and nested:
                for handler in nested:
                    yield from _flatten(handler.body, where)
            elif nested:
                yield from _flatten(nested, where)


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _functions(path: Path) -> Iterator[tuple[str, list[Statement]]]:
    tree = parse_python(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{_shown(path)}:{node.name}", list(_flatten(node.body, _shown(path)))


def _chain(sim: list[Statement], real: list[Statement]) -> list[Statement]:
    """The longest run of statements of equal shape in both, in the same order, each within
    GAP_STATEMENTS_MAX of the previous one on both sides (a copy that added a `try:` or a
    `return` here and there is still a copy). Statements under STATEMENT_NODES_MIN nodes
    (`return`, `try:`, `pass`) never count."""
    best: dict[tuple[int, int], list[Statement]] = {}
    longest: list[Statement] = []
    for i, s in enumerate(sim):
        if s.nodes < STATEMENT_NODES_MIN:
            continue
        for j, r in enumerate(real):
            if r.shape != s.shape:
                continue
            before = [
                best[(i2, j2)]
                for i2 in range(max(0, i - GAP_STATEMENTS_MAX - 1), i)
                for j2 in range(max(0, j - GAP_STATEMENTS_MAX - 1), j)
                if (i2, j2) in best
            ]
            chain = [*max(before, key=len, default=[]), s]
            best[(i, j)] = chain
            if len(chain) > len(longest):
                longest = chain
    return longest


def shared_runs(sim_files: list[Path], production_files: list[Path]) -> list[str]:
    """Each simulation function sharing a run with a production function: 'sim ~ production'."""
    production = [f for path in production_files for f in _functions(path)]
    by_shape: dict[str, set[int]] = {}
    for k, (_, statements) in enumerate(production):
        for st in statements:
            if st.nodes >= STATEMENT_NODES_MIN:
                by_shape.setdefault(st.shape, set()).add(k)
    found = []
    for path in sim_files:
        for function, statements in _functions(path):
            shared: dict[int, int] = {}
            for shape in {st.shape for st in statements if st.nodes >= STATEMENT_NODES_MIN}:
                for k in by_shape.get(shape, ()):
                    shared[k] = shared.get(k, 0) + 1
            for k, count in sorted(shared.items()):
                if count < RUN_STATEMENTS_MIN:
                    continue
                name, real = production[k]
                chain = _chain(statements, real)
                if len(chain) >= RUN_STATEMENTS_MIN and sum(st.nodes for st in chain) >= RUN_NODES_MIN:
                    found.append(
                        f"{function} (lines {chain[0].where} to {chain[-1].where}) has the shape of {name}"
                    )
                    break
    return sorted(found)


def _py(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in root.rglob("*.py"))


def test_the_simulation_holds_no_copy_of_production_code() -> None:
    copies = shared_runs(_py(SIM), _py(*PRODUCTION))
    assert not copies, (
        f"tests/sim re-implements production code ({RUN_STATEMENTS_MIN}+ statements of the same shape); "
        "drive the real code through its seam instead:\n" + "\n".join(copies)
    )


def test_a_copy_is_seen_through_renames_and_run_sync(tmp_path: Path) -> None:
    """The shape ignores names and awaits: a renamed copy that awaits through run_sync is found."""
    real = tmp_path / "real.py"
    real.write_text(
        "async def elect(self):\n"
        "    keys = self.store.keys\n"
        "    snapshot = await self.store.txn([], [Get(keys.controller), Get(keys.epoch)])\n"
        "    holder, epochs = snapshot.gets\n"
        "    if holder:\n"
        "        return None\n"
        "    epoch = (int(epochs[0].value) if epochs else 0) + 1\n"
        "    result = await self.store.txn([missing(keys.controller)], [Put(keys.controller, b'x')])\n"
        "    return epoch if result.succeeded else None\n"
    )
    sim = tmp_path / "sim.py"
    sim.write_text(
        "def campaign(node):\n"
        "    k = node.etcd.keys\n"
        "    snap = run_sync(node.client.txn([], [Get(k.ctl), Get(k.ep)]))\n"
        "    ctl, eps = snap.gets\n"
        "    if ctl:\n"
        "        return None\n"
        "    new = (int(eps[0].value) if eps else 0) + 1\n"
        "    res = run_sync(node.client.txn([missing(k.ctl)], [Put(k.ctl, b'y')]))\n"
        "    return new if res.succeeded else None\n"
    )
    unrelated = tmp_path / "unrelated.py"
    unrelated.write_text("def f(a):\n    for x in a:\n        print(x)\n    return len(a)\n")
    assert shared_runs([sim], [real]) != []
    assert shared_runs([unrelated], [real]) == []
