"""Small operational faults an operator met running a cluster for months (issue 43).

Each test names the fault it pins: (a) the controller's unread control-RPC failures,
(b) the port check of `cluster up` after a clean stop, (c) a stable token port,
(e) every benchmark script started by its path.
"""

from __future__ import annotations

import ast
import asyncio
import errno
import gc
import logging
import os
import socket
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from coordinator.keys import Keys
from coordinator.store import EtcdStore
from protos.highwater.v1 import broker_pb2
from services.common.peers import PeerChannels
from services.controller import sender_rules
from services.controller.context import BrokerInfo
from services.controller.event_loop import ControllerEventLoop
from services.controller.results import ControllerResult
from services.launcher import local_cluster
from tests.python_source import parse_python

REPO = Path(__file__).resolve().parents[2]
# A bound on every wait below: the retries are made 1 ms apart, a test takes milliseconds.
WAIT_S = 10.0
BENCH_HELP_TIMEOUT_S = 60.0


# ---- (a) control RPCs that fail are reported once, by the sender's warning -------------------


class ScriptedPeers(PeerChannels):
    """PeerChannels whose calls answer as `answer` says, without a channel (answer raises or returns)."""

    def __init__(self, answer: Callable[[], Any]) -> None:
        super().__init__()
        self.answer = answer

    def serialized(self, address: str, method: str, response_type: Any) -> Any:
        async def call(payload: bytes, timeout: float) -> Any:
            return self.answer()

        return call


def unavailable() -> Any:
    raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, details="connection refused")


def controller_with_one_broker(peers: PeerChannels) -> ControllerEventLoop:
    store = cast(EtcdStore, types.SimpleNamespace(keys=Keys()))
    loop = ControllerEventLoop(store=store, controller_id=1, epoch=3, peers=peers)
    # The context as a replayed BrokerChange would leave it: broker 1 registered at epoch 5.
    loop.ctx.live_brokers = {1: BrokerInfo(1, "127.0.0.1", 1, "", 0, broker_epoch=5)}
    loop._sync_senders()
    return loop


def update_metadata_result() -> ControllerResult:
    result = ControllerResult()
    result.rpcs.deleted_topics = {"gone"}  # an UpdateMetadata to every live broker and gateway
    return result


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sender_rules, "CONTROL_RPC_RETRY_BACKOFF_MS", 1)


@pytest.mark.asyncio
async def test_a_failed_control_rpc_to_a_dead_broker_reaches_no_exception_handler(
    fast_retries: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The controller logged the sender's "giving up" warning and then, when the dead broker's
    sender was dropped, asyncio's "Future exception was never retrieved" with a traceback at ERROR."""
    unhandled: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: unhandled.append(context))
    loop = controller_with_one_broker(ScriptedPeers(unavailable))
    caplog.set_level(logging.INFO, logger="highwater.controller")
    # Two requests: the sender takes the second once it gave up on the first, and the first's
    # future, dropped by whoever queued it, is freed then (the second stays in a reference cycle
    # with its exception's traceback until the cycle collector runs).
    loop._send(update_metadata_result())
    loop._send(update_metadata_result())
    deadline = time.monotonic() + WAIT_S
    while caplog.text.count("giving up") < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert caplog.text.count("UpdateMetadata to 127.0.0.1:1 failed 5 times (UNAVAILABLE); giving up") == 2
    await loop.stop()  # what the broker's lease expiring does to its sender
    gc.collect()
    await asyncio.sleep(0)  # Future.__del__ reports through the loop
    assert [c.get("message") for c in unhandled] == []


@pytest.mark.asyncio
async def test_an_admin_call_waits_on_the_control_rpcs_its_result_caused(fast_retries: None) -> None:
    """ControllerServicer._run waits (ADMIN_PROPAGATION_WAIT_S) on result.rpc_futures: the loop
    must fill them, failed or answered."""
    loop = controller_with_one_broker(ScriptedPeers(broker_pb2.UpdateMetadataResponse))
    result = update_metadata_result()
    loop._send(result)
    assert len(result.rpc_futures) == 1
    done, _ = await asyncio.wait(result.rpc_futures, timeout=WAIT_S)
    assert [f.result() for f in done] == [broker_pb2.UpdateMetadataResponse()]
    await loop.stop()

    loop = controller_with_one_broker(ScriptedPeers(unavailable))
    result = update_metadata_result()
    loop._send(result)
    done, _ = await asyncio.wait(result.rpc_futures, timeout=WAIT_S)
    (failed,) = done
    exc = failed.exception()
    assert isinstance(exc, grpc.aio.AioRpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE
    await loop.stop()


# ---- (b) a port left in TIME_WAIT by a clean stop is free to listen on -----------------------


@pytest.fixture
def time_wait_port() -> Iterator[int]:
    """A loopback port whose server side closed a connection first, as a stopped gateway does:
    that end sits in TIME_WAIT for a minute with the port as its local port, and no listener.
    The listener sets SO_REUSEADDR as gRPC's does; its connections inherit it."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port: int = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    served, _ = listener.accept()
    listener.close()
    served.close()  # the server side closes first: its end goes to TIME_WAIT
    client.recv(1)  # the FIN arrived
    client.close()
    # The situation the operator met: a plain bind is refused, with nothing listening.
    deadline = time.monotonic() + WAIT_S
    while not plain_bind_refused(port):
        assert time.monotonic() < deadline, f"port {port} did not enter TIME_WAIT"
        time.sleep(0.01)
    yield port


def plain_bind_refused(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            return True
    return False


def test_b_a_port_in_time_wait_is_free_for_cluster_up(time_wait_port: int) -> None:
    assert local_cluster._port_free(time_wait_port)
    # ... as it is to a listener with SO_REUSEADDR, which the services' servers set.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", time_wait_port))
        server.listen()


def test_b_a_port_with_a_listener_is_in_use() -> None:
    for reuse in (0, 1):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, reuse)
            server.bind(("127.0.0.1", 0))
            server.listen()
            assert not local_cluster._port_free(server.getsockname()[1])


# ---- (c) the token port of `cluster up --tls` stays the same from one start to the next ------


def test_c_cluster_up_has_a_fixed_token_port_clear_of_the_other_defaults() -> None:
    params: dict[str | None, Any] = {p.name: p for p in local_cluster.up_command.params}
    token_port = params["token_port"].default
    assert token_port == local_cluster.DEFAULT_TOKEN_PORT != 0
    gateways_max, brokers_max = params["gateways"].type.max, params["brokers"].type.max
    gateway_port, kafka_port = params["gateway_port"].default, params["kafka_port"].default
    taken = set(range(gateway_port, gateway_port + gateways_max)) | set(
        range(kafka_port, kafka_port + brokers_max)
    )
    assert not taken & set(range(token_port, token_port + gateways_max))


def test_c_the_token_port_is_pinned_on_every_gateway(tmp_path: Path) -> None:
    cluster = local_cluster.LocalCluster(tmp_path, brokers=1, gateways=2, tls=True, token_port=29100)
    args = [cluster.processes[f"gateway-{i}"].args for i in (1, 2)]
    assert [a[a.index("--client-port") + 1] for a in args] == ["29100", "29101"]
    assert all(a.count("--client-port") == 1 for a in args)
    broker_args = cluster.processes["broker-1"].args
    assert broker_args[broker_args.index("--client-port") + 1] == "0"


# ---- (e) every benchmark script runs by its path, as bench/README.md shows -------------------

# Run as `python bench/X.py` on a Python that has the dependencies but not this checkout on its
# path (the editable install of the dev environment adds it, hiding a script that forgot to):
# sys.path[0] is the script's directory. Then the script's own imports of bench.* are resolved,
# those inside functions too (spark_read.py's ran only once the benchmark started).
RUN_BY_PATH = """
import importlib, os, runpy, sys
repo, script, *modules = sys.argv[1:]
sys.path[:] = [os.path.dirname(script)] + [p for p in sys.path[1:] if os.path.realpath(p or ".") != repo]
sys.argv = [script, "--help"]
code = 0
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as exc:
    code = exc.code
for module in modules:
    importlib.import_module(module)
sys.exit(code)
"""


def bench_scripts() -> list[Path]:
    return sorted(p for p in (REPO / "bench").rglob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def bench_imports(script: Path) -> list[str]:
    """The bench.* modules the script imports anywhere in it."""
    names = set()
    for node in ast.walk(parse_python(script.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "bench":
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == "bench")
    return sorted(names)


def test_e_the_bench_scripts_are_found() -> None:
    names = {p.name for p in bench_scripts()}
    assert {"spark_read.py", "produce.py", "compare.py"} <= names


@pytest.mark.parametrize("script", bench_scripts(), ids=lambda p: str(p.relative_to(REPO)))
def test_e_every_bench_script_answers_help_when_run_by_its_path(script: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [sys.executable, "-c", RUN_BY_PATH, str(REPO), str(script.relative_to(REPO)), *bench_imports(script)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=BENCH_HELP_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage:" in run.stdout
