"""A whole local cluster as child processes on 127.0.0.1: `highwater cluster up`.

etcd (from the installed binary), controllers, brokers and gateways, each a
real process with its own log file under one data directory. The tests use
the same class (tests/integration/conftest.py), so what the README's demo
runs is what the suite checks. Every child is started with a parent-death
signal, so a crashed caller never leaves processes behind, and `stop()`
ends each one by its pid: SIGTERM, then SIGKILL after a bounded wait.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from coordinator.etcd_server import EtcdServer, free_port

# How long one process may take to become ready (etcd connect, log recovery, registration).
PROCESS_READY_TIMEOUT_S = 30.0
# SIGTERM -> exit: a broker's controlled shutdown plus the gRPC grace period fit in this.
PROCESS_STOP_TIMEOUT_S = 15.0
LOG_TAIL_BYTES = 4000


def _die_with_parent() -> None:
    """In the child between fork and exec: SIGKILL me when the parent dies (Linux prctl)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG


@dataclass
class ServiceProcess:
    """One service process: how to start it again, and where it is now."""

    name: str
    kind: str
    args: list[str]
    log_path: Path
    ready_path: Path
    proc: subprocess.Popen[bytes] | None = None
    info: dict[str, object] = field(default_factory=dict)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.info['port']}"

    def log_tail(self) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(f.tell() - LOG_TAIL_BYTES, 0))
                return f.read().decode(errors="replace")
        except OSError:
            return ""


class LocalCluster:
    """etcd + controllers + brokers + gateways on loopback, under base_dir."""

    def __init__(self, base_dir: Path, *, brokers: int = 3, controllers: int = 1, gateways: int = 1,
                 lease_ttl_s: int = 6, gateway_port: int = 0, replica_lag_time_max_ms: int | None = None,
                 racks: list[str] | None = None, python: str = sys.executable) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.lease_ttl_s = lease_ttl_s
        self.python = python
        self.etcd = EtcdServer(self.base_dir / "etcd", log_path=self.base_dir / "logs" / "etcd.log")
        self.processes: dict[str, ServiceProcess] = {}
        (self.base_dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.base_dir / "run").mkdir(parents=True, exist_ok=True)
        for i in range(1, controllers + 1):
            self._add(f"controller-{i}", "controller", ["--controller-id", str(i)])
        for i in range(1, brokers + 1):
            extra = ["--broker-id", str(i), "--data-dir", str(self.base_dir / f"broker-{i}")]
            if racks:
                extra += ["--rack", racks[(i - 1) % len(racks)]]
            if replica_lag_time_max_ms is not None:
                extra += ["--replica-lag-time-max-ms", str(replica_lag_time_max_ms)]
            self._add(f"broker-{i}", "broker", extra)
        for i in range(1, gateways + 1):
            port = gateway_port + i - 1 if gateway_port else free_port()
            self._add(f"gateway-{i}", "gateway", ["--gateway-id", str(i), "--port", str(port)])

    def _add(self, name: str, kind: str, args: list[str]) -> None:
        self.processes[name] = ServiceProcess(name, kind, args, self.base_dir / "logs" / f"{name}.log",
                                              self.base_dir / "run" / f"{name}.ready")

    # ---- addresses -----------------------------------------------------------------------

    @property
    def etcd_endpoint(self) -> str:
        return self.etcd.endpoint

    def by_kind(self, kind: str) -> list[ServiceProcess]:
        return [p for p in self.processes.values() if p.kind == kind]

    @property
    def gateway_addresses(self) -> list[str]:
        return [p.address for p in self.by_kind("gateway") if p.info]

    @property
    def gateway_address(self) -> str:
        return ",".join(self.gateway_addresses)

    @property
    def broker_ids(self) -> list[int]:
        return [int(p.name.split("-")[1]) for p in self.by_kind("broker")]

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout_s: float = PROCESS_READY_TIMEOUT_S) -> LocalCluster:
        try:
            self.etcd.start()
            for kind in ("controller", "broker", "gateway"):
                group = self.by_kind(kind)
                for p in group:
                    self._spawn(p)
                for p in group:
                    self._wait_ready(p, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, p: ServiceProcess) -> None:
        p.ready_path.unlink(missing_ok=True)
        cmd = [self.python, "-m", "services", p.kind, *p.args, "--etcd", self.etcd.endpoint,
               "--lease-ttl-s", str(self.lease_ttl_s), "--ready-file", str(p.ready_path)]
        log = p.log_path.open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        p.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  preexec_fn=_die_with_parent, env=env, cwd=self.base_dir)
        log.close()
        p.info = {}

    def _wait_ready(self, p: ServiceProcess, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if p.proc is not None and p.proc.poll() is not None:
                raise RuntimeError(f"{p.name} exited with code {p.proc.returncode} before it was ready; "
                                   f"its log ({p.log_path}) ends with:\n{p.log_tail()}")
            if p.ready_path.exists():
                with contextlib.suppress(ValueError, OSError):
                    p.info = json.loads(p.ready_path.read_text())
                    if p.kind == "gateway":
                        # Keep the gateway's address across restarts: clients know it.
                        self._pin_port(p, int(p.info["port"]))  # type: ignore[call-overload]
                    return
            time.sleep(0.05)
        raise TimeoutError(f"{p.name} was not ready within {timeout_s:.0f} s; its log ({p.log_path}) ends with:\n"
                           f"{p.log_tail()}")

    @staticmethod
    def _pin_port(p: ServiceProcess, port: int) -> None:
        if "--port" in p.args:
            p.args[p.args.index("--port") + 1] = str(port)
        else:
            p.args += ["--port", str(port)]

    def start_process(self, name: str, timeout_s: float = PROCESS_READY_TIMEOUT_S) -> None:
        p = self.processes[name]
        if p.running:
            raise RuntimeError(f"{name} is already running (pid {p.pid})")
        self._spawn(p)
        self._wait_ready(p, timeout_s)

    def kill(self, name: str) -> None:
        """SIGKILL: a crash, no controlled shutdown, the lease expires on its own."""
        p = self.processes[name]
        if p.proc is not None and p.running:
            p.proc.kill()
            p.proc.wait(timeout=PROCESS_STOP_TIMEOUT_S)

    def terminate(self, name: str, timeout_s: float = PROCESS_STOP_TIMEOUT_S) -> int | None:
        """SIGTERM and wait: a clean stop (brokers do a controlled shutdown first)."""
        p = self.processes[name]
        if p.proc is None or not p.running:
            return p.proc.returncode if p.proc is not None else None
        p.proc.send_signal(signal.SIGTERM)
        try:
            return p.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.proc.kill()
            return p.proc.wait(timeout=timeout_s)

    def pause(self, name: str) -> None:
        p = self.processes[name]
        if p.proc is not None:
            p.proc.send_signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        p = self.processes[name]
        if p.proc is not None:
            p.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop every process by its pid (gateways, brokers, controllers, then etcd); never raises."""
        for kind in ("gateway", "broker", "controller"):
            group = [p for p in self.by_kind(kind) if p.proc is not None and p.running]
            for p in group:
                with contextlib.suppress(OSError):
                    p.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
                    p.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            for p in group:
                try:
                    p.proc.wait(timeout=PROCESS_STOP_TIMEOUT_S)  # type: ignore[union-attr]
                except subprocess.TimeoutExpired:
                    p.proc.kill()  # type: ignore[union-attr]
                    p.proc.wait(timeout=PROCESS_STOP_TIMEOUT_S)  # type: ignore[union-attr]
        with contextlib.suppress(Exception):
            self.etcd.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- the `highwater cluster up` command ------------------------------------------------------

@click.command("up")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("data/local-cluster"), show_default=True,
              help="Where etcd's data, the brokers' logs and every process's log file go.")
@click.option("--brokers", type=click.IntRange(1, 16), default=3, show_default=True)
@click.option("--controllers", type=click.IntRange(1, 3), default=1, show_default=True)
@click.option("--gateways", type=click.IntRange(1, 4), default=1, show_default=True)
@click.option("--gateway-port", type=click.IntRange(0, 65535), default=9092, show_default=True,
              help="Port of the first gateway (0: any free port).")
@click.option("--lease-ttl-s", type=click.IntRange(2, 60), default=6, show_default=True)
@click.option("--demo", is_flag=True, help="Create a topic, produce and consume a few records, then keep running.")
@click.option("--exit-after-demo", is_flag=True, help="With --demo: stop the cluster when the demo is done.")
def up_command(data_dir: Path, brokers: int, controllers: int, gateways: int, gateway_port: int, lease_ttl_s: int,
               demo: bool, exit_after_demo: bool) -> None:
    """Start etcd and a whole cluster as child processes on 127.0.0.1.

    Runs until Ctrl-C or SIGTERM, then stops every process cleanly.

    Example: highwater cluster up --brokers 3 --demo
    """
    from rich.console import Console

    console = Console()
    if gateway_port and not _port_free(gateway_port):
        raise click.ClickException(f"port {gateway_port} is in use: stop what listens there or pass "
                                   "--gateway-port 0")
    cluster = LocalCluster(data_dir, brokers=brokers, controllers=controllers, gateways=gateways,
                           lease_ttl_s=lease_ttl_s, gateway_port=gateway_port)
    stop_requested = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with console.status("starting etcd, controller, brokers and gateway..."):
        try:
            cluster.start()
        except (RuntimeError, TimeoutError) as exc:
            raise click.ClickException(str(exc)) from exc
    try:
        console.print("[bold]Highwater local cluster[/bold] (data and logs under "
                      f"{cluster.base_dir})", soft_wrap=True)
        console.print(f"  etcd          pid {cluster.etcd.pid:<7} {cluster.etcd.endpoint}", soft_wrap=True)
        for p in cluster.processes.values():
            console.print(f"  {p.name:<13} pid {p.pid:<7} {p.address:<21} "
                          f"metrics http://127.0.0.1:{p.info.get('metrics_port')}/metrics  log {p.log_path}",
                          soft_wrap=True)
        console.print(f"bootstrap (gateway): [bold]{cluster.gateway_address}[/bold]   "
                      f"try: highwater --bootstrap {cluster.gateway_address} topic list", soft_wrap=True)
        if demo:
            from clients.demo import run_demo
            run_demo(cluster.gateway_address, console)
            if exit_after_demo:
                return
        console.print("running; Ctrl-C stops every process")
        while not stop_requested:
            for p in cluster.processes.values():
                if p.proc is not None and p.proc.poll() is not None and not stop_requested:
                    console.print(f"[red]{p.name} exited with code {p.proc.returncode}; see {p.log_path}[/red]")
                    p.proc = None
            time.sleep(0.2)
    finally:
        with console.status("stopping every process..."):
            cluster.stop()
        console.print("stopped")


def _port_free(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
