"""Import rules that keep the layers honest, followed through every import (STYLE.md, practice 1).

- Pure logic imports no grpc, no etcd client, no asyncio, no threads or sockets, reads no
  clock and touches no file, and neither does anything it imports, however indirectly: a
  sneaked-in import or a file write two modules away would make the deterministic
  simulation lie. The one seam for files is `services/broker/log/storage.py`'s `Storage`
  protocol; `FileStorage` (fsync, os.replace) lives in `file_storage.py`, which only the
  broker's drivers import.
- The client library (clients/, its operator tools in clients/tools/ included) and the Spark
  connector import nothing from services/ or coordinator/, however indirectly: a user who
  installs the client gets no server with it, and a server refactor cannot break a client.
  What needs both (the `highwater` entry point, `cluster up`, `tls init`) lives in the
  composition root services/launcher/, which nothing else imports (issue 40).
- The servers (services/, coordinator/) take from the client library only clients/common:
  its pure modules (errors, the record format, limits, the failover and leader-map rules) and
  clients/common/transport (channels, TLS, stream calls, local reads, the host's identity; I/O,
  so outside the pure rule), however indirectly: a client refactor cannot reach into a broker
  through a module it happens to share.
- The Spark connector takes the same, and nothing else of the client library (its demo, a user
  of the public API, aside): its transport is the transport package, not a copy of the asyncio
  clients' connection code beside it (issue 40).

Imports are read with `ast` (also those inside functions), so nothing is executed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from tests.python_source import parse_python

ROOT = Path(__file__).resolve().parents[2]
OUR_PACKAGES = ("clients", "services", "coordinator", "spark_connector", "protos")

PURE_MODULES = [
    "services/broker/partition.py",
    "services/broker/core.py",
    "services/broker/purgatory.py",
    "services/broker/fetcher_core.py",
    "services/broker/steps.py",
    "coordinator/controller_life.py",
    "coordinator/broker_life.py",
    "services/broker/fetch_state.py",
    "services/broker/producer_state.py",
    "services/broker/log/log.py",
    "services/broker/log/segment.py",
    "services/broker/log/index.py",
    "services/broker/log/epoch_cache.py",
    "services/broker/log/checkpoints.py",
    "services/broker/log/config.py",
    "services/broker/log/storage.py",
    "services/broker/log/cleaner.py",
    "services/controller/context.py",
    "services/controller/handlers.py",
    "services/controller/results.py",
    "services/controller/deletion.py",
    "services/controller/reassignment.py",
    "services/controller/elections.py",
    "services/controller/assignment.py",
    "services/controller/state_machines.py",
    "services/controller/sender_rules.py",
    "services/controller/control_requests.py",
    "services/controller/proto_cache.py",
    "services/controller/liveness.py",
    "services/gateway/routing.py",
    "services/gateway/record_level.py",
    "services/common/request_checks.py",
    "services/kafka/protocol.py",
    "services/kafka/handler.py",
    "services/kafka/handler_common.py",
    "services/kafka/data_calls.py",
    "services/kafka/fetch_calls.py",
    "services/kafka/admin_calls.py",
    "services/kafka/group_calls.py",
    "services/kafka/acl_rules.py",
    "services/kafka/fetch_sessions.py",
    "services/kafka/classic_groups.py",
    "services/groups",
    "services/transactions",
    "clients/common",
    "clients/accumulator.py",
    "clients/idempotence.py",
    "clients/errors.py",
    "clients/types.py",
]
FORBIDDEN_IMPORTS = (
    "grpc",
    "etcd3aio",
    "asyncio",
    "coordinator",
    "threading",
    "socket",
    "time",
    "subprocess",
    "shutil",
    "mmap",
)
# The pure modules of coordinator/ itself (no etcd client, no asyncio): a pure module inside
# coordinator/ may import them; the services' pure cores may not import coordinator/ at all.
PURE_COORDINATOR_MODULES = ("coordinator.limits", "coordinator.controller_life", "coordinator.broker_life")
# Calls that read a clock or touch a file, by their dotted name in the source.
FORBIDDEN_CALLS = frozenset(
    {
        "time.time",
        "time.monotonic",
        "datetime.now",
        "datetime.datetime.now",
        "open",
        "io.open",
        "os.open",
        "os.fsync",
        "os.fdatasync",
        "os.replace",
        "os.rename",
        "os.remove",
        "os.unlink",
        "os.makedirs",
        "os.mkdir",
        "os.listdir",
        "os.scandir",
        "os.truncate",
        "os.ftruncate",
        "os.pwrite",
        "os.pread",
        "os.write",
        "os.read",
    }
)
# Methods of pathlib.Path that read or write a file. (Not mkdir, unlink and the like: the log's
# Storage seam has methods of those names, and a Path can only do them through os or open,
# which are caught above when called directly.)
FORBIDDEN_METHODS = frozenset({"write_bytes", "write_text", "read_bytes", "read_text"})
CLIENT_LIBRARY = ["clients", "spark_connector"]
# clients/node/ is the Node.js client: no Python of ours (only what its node_modules may hold).
CLIENT_LIBRARY_EXCEPT = ("clients/node/",)
SERVER_PACKAGES = ("services", "coordinator")
# The composition root above the client library and the services (the `highwater` entry point,
# the local cluster launcher): it may import both; no server module may import it.
COMPOSITION_ROOT = "services/launcher/"
# What of the client library a server may import (and what that imports in turn).
SHARED_WITH_SERVERS = ("clients/common/", "clients/__init__.py")
# The parts of pure packages that do I/O (clients/common's sockets and /proc file; the
# transaction coordinator's asyncio driver over etcd and its hosting): no pure module may reach them.
NOT_PURE = (
    "clients/common/transport/",
    "services/transactions/driver.py",
    "services/transactions/hosting.py",
    "services/transactions/marker_writer.py",
    "services/transactions/produce_verifier.py",
    "services/transactions/state.py",
)


def _files(entry: str) -> list[Path]:
    path = ROOT / entry
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def _module_name(path: Path) -> str:
    if not path.is_relative_to(ROOT):
        return path.stem  # a file outside the tree (the walker's own test)
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _path_of(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def _tree(path: Path) -> ast.Module:
    return parse_python(path.read_text(), filename=str(path))


def _run_time_nodes(path: Path) -> Iterator[ast.AST]:
    """Every node of the file except those never run by importing a module of the package:
    under `if TYPE_CHECKING:`, and a package's PEP 562 `__getattr__` (it runs only when a
    caller asks the package itself for a name it lacks, as `from clients import Producer`;
    `from clients.common import errors` does not)."""
    tree = _tree(path)
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and _dotted(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            todo.extend(node.orelse)
            continue
        if node is tree and path.name == "__init__.py":
            todo.extend(n for n in ast.iter_child_nodes(node) if not _is_lazy_getattr(n))
            continue
        todo.extend(ast.iter_child_nodes(node))


def _is_lazy_getattr(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and node.name == "__getattr__"


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, including `from x import y`
    as both x and x.y (y may be a submodule)."""
    package = _module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else _module_name(path)
    for node in _run_time_nodes(path):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, node.module] if node.module else anchor)
            else:
                base = node.module or ""
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def _ours(module: str) -> Path | None:
    return _path_of(module) if module.split(".")[0] in OUR_PACKAGES else None


def _reached(start: Path) -> dict[Path, list[str]]:
    """Every file of ours that `start` imports, directly or not, with the chain that reaches it."""
    chains: dict[Path, list[str]] = {start: [_shown(start)]}
    todo = [start]
    while todo:
        path = todo.pop()
        for _, module in _imports(path):
            target = _ours(module)
            # A package's __init__ runs whenever one of its modules is imported.
            parents = [_ours(".".join(module.split(".")[:i])) for i in range(1, module.count(".") + 1)]
            for found in (target, *parents):
                if found is not None and found not in chains:
                    chains[found] = [*chains[path], _shown(found)]
                    todo.append(found)
    return chains


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _io_in(path: Path) -> list[str]:
    """What in this one file is I/O: forbidden imports and calls that read a clock or touch files."""
    bad = []
    inside_coordinator = _shown(path).startswith("coordinator/")
    for line, module in _imports(path):
        # `from coordinator.limits import X` is read as coordinator.limits and coordinator.limits.X.
        if inside_coordinator and (
            module == "coordinator"
            or module in PURE_COORDINATOR_MODULES
            or module.rsplit(".", 1)[0] in PURE_COORDINATOR_MODULES
        ):
            continue
        if module.split(".")[0] in FORBIDDEN_IMPORTS:
            bad.append(f"line {line}: import {module}")
    for node in _run_time_nodes(path):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name in FORBIDDEN_CALLS:
                bad.append(f"line {node.lineno}: calls {name}()")
            elif isinstance(node.func, ast.Attribute) and node.func.attr in FORBIDDEN_METHODS:
                bad.append(f"line {node.lineno}: calls .{node.func.attr}()")
    return sorted(set(bad))


PURE_FILES = [p for e in PURE_MODULES for p in _files(e) if not _shown(p).startswith(NOT_PURE)]


@pytest.mark.parametrize("path", PURE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_reaches_no_io(path: Path) -> None:
    problems = []
    for reached, chain in _reached(path).items():
        if reached.match("protos/highwater/v1/*_pb2.py"):
            continue  # generated message classes: protobuf only
        for bad in _io_in(reached):
            problems.append(f"{' -> '.join(chain)}: {bad}")
    assert not problems, f"{path.relative_to(ROOT)} must stay pure:\n" + "\n".join(problems)


CLIENT_FILES = [
    p
    for e in CLIENT_LIBRARY
    for p in _files(e)
    if not str(p.relative_to(ROOT)).startswith(CLIENT_LIBRARY_EXCEPT)
]


@pytest.mark.parametrize("path", CLIENT_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_client_library_reaches_no_server_code(path: Path) -> None:
    server = [
        " -> ".join(chain)
        for reached, chain in _reached(path).items()
        if str(reached.relative_to(ROOT)).split("/")[0] in SERVER_PACKAGES
    ]
    assert not server, f"{path.relative_to(ROOT)} imports server code:\n" + "\n".join(server)


SERVER_FILES = [p for e in SERVER_PACKAGES for p in _files(e) if not _shown(p).startswith(COMPOSITION_ROOT)]


@pytest.mark.parametrize("path", SERVER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_servers_share_only_clients_common_with_the_client_library(path: Path) -> None:
    client = [
        " -> ".join(chain)
        for reached, chain in _reached(path).items()
        if _shown(reached).startswith(COMPOSITION_ROOT)
        or (_shown(reached).startswith("clients/") and not _shown(reached).startswith(SHARED_WITH_SERVERS))
    ]
    assert not client, (
        f"{path.relative_to(ROOT)} imports the client library beyond clients/common, or the launcher:\n"
        + "\n".join(client)
    )


# The connector's demo writes and reads as a user would, through the public client API.
SPARK_USES_THE_LIBRARY = ("spark_connector/demo.py",)
SPARK_FILES = [p for p in _files("spark_connector") if _shown(p) not in SPARK_USES_THE_LIBRARY]


@pytest.mark.parametrize("path", SPARK_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_spark_connector_shares_only_clients_common_with_the_client_library(path: Path) -> None:
    client = [
        " -> ".join(chain)
        for reached, chain in _reached(path).items()
        if _shown(reached).startswith("clients/") and not _shown(reached).startswith(SHARED_WITH_SERVERS)
    ]
    assert not client, (
        f"{path.relative_to(ROOT)} imports the client library beyond clients/common:\n" + "\n".join(client)
    )


def test_the_checks_see_what_they_must_refuse(tmp_path: Path) -> None:
    """The walker is not blind: a file write, a clock read, a lazy import inside a function
    and a hop into server code two modules away are all seen."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os\n"
        "from clients.common import limits\n\n\n"
        "def f() -> None:\n"
        "    import time\n\n"
        "    os.fsync(3)\n"
        "    time.monotonic()\n"
        "    limits.GRPC_MAX_MESSAGE_BYTES\n"
    )
    assert _io_in(probe) == [
        "line 6: import time",
        "line 8: calls os.fsync()",
        "line 9: calls time.monotonic()",
    ]
    reached = _reached(probe)
    assert ROOT / "clients" / "common" / "limits.py" in reached
    assert ROOT / "clients" / "common" / "__init__.py" in reached
    # services/broker/server.py reaches coordinator/ only through other modules.
    chains = _reached(ROOT / "services" / "broker" / "server.py")
    assert any(p.is_relative_to(ROOT / "coordinator") and len(c) > 2 for p, c in chains.items())
    # A server module reaching the client library beyond what it may share is seen, two hops away.
    server_probe = tmp_path / "server_probe.py"
    server_probe.write_text("from clients.common.transport import host\nfrom clients import local_reads\n")
    reached_from_server = {_shown(p) for p in _reached(server_probe)}
    assert "clients/local_reads.py" in reached_from_server
    assert "clients/common/transport/host.py" in reached_from_server
