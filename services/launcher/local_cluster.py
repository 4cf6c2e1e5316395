"""A whole local cluster as child processes on 127.0.0.1: `highwater cluster up`.

etcd (from the installed binary), controllers, brokers and gateways, each a
real process with its own log file under one data directory. The tests use
the same class (tests/integration/conftest.py), so what the README's demo
runs is what the suite checks. `stop()` ends each child by its pid: SIGTERM,
then SIGKILL after a bounded wait; it also runs at interpreter exit, so a
caller that fails without stopping leaves nothing behind. (No preexec_fn:
forking with a pre-exec hook while gRPC threads run crashed children.)

Tests that need more than loopback (the chaos tests' network partitions) give
`host` (etcd's and every service's listen and advertised address) and
`placements` (per process: its own address and a command prefix such as
`ip netns exec NAME`, which runs it in a network namespace the test made).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import click

from coordinator.etcd_server import EtcdServer, EtcdServerTls

if TYPE_CHECKING:
    from rich.console import Console

    from coordinator.store import EtcdTls

# How long one process may take to become ready (etcd connect, log recovery, registration).
PROCESS_READY_TIMEOUT_S = 30.0
# SIGTERM -> exit: a broker's controlled shutdown plus the gRPC grace period fit in this.
PROCESS_STOP_TIMEOUT_S = 15.0
# How often a process's ready file is looked for while it starts.
READY_POLL_INTERVAL_S = 0.05
# How often `cluster up` checks that its processes are still running.
WATCH_INTERVAL_S = 0.2
# How much of a failed process's log is shown.
LOG_TAIL_BYTES = 4000
# The client certificate `cluster up --tls` makes for the operator (and lists as a super user).
ADMIN_TLS_NAME = "admin"
# `cluster up --tls`: the first gateway's token listener (--client-port). Fixed, so bearer-token
# clients keep their bootstrap across restarts; beside the gateways' 9092 and the brokers' Kafka
# 19092, and clear of gateway i's port (9092 + i - 1) for every --gateways allowed.
DEFAULT_TOKEN_PORT = 29092


@dataclass(frozen=True)
class Placement:
    """Where one process runs: the address it listens on and advertises, and what its
    command line starts with (e.g. ("ip", "netns", "exec", NAME): run it in that namespace)."""

    host: str = "127.0.0.1"
    command_prefix: tuple[str, ...] = ()


class ReadyInfo(TypedDict, total=False):
    """What a service writes to its --ready-file (services/common/server.py, mark_ready);
    TLS services add more keys, such as the gateway's client_port."""

    pid: int
    host: str
    port: int
    metrics_port: int
    client_port: int
    kafka_port: int


@dataclass
class ServiceProcess:
    """One service process: how to start it again, and where it is now."""

    name: str
    kind: str
    args: list[str]
    log_path: Path
    ready_path: Path
    proc: subprocess.Popen[bytes] | None = None
    info: ReadyInfo = field(default_factory=lambda: ReadyInfo())
    placement: Placement = field(default_factory=Placement)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def address(self) -> str:
        return f"{self.placement.host}:{self.info['port']}"

    def log_tail(self) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(f.tell() - LOG_TAIL_BYTES, 0))
                return f.read().decode(errors="replace")
        except OSError:
            return ""


def _quotas_on(service_args: list[str]) -> bool:
    """True when the services run with byte-rate quotas (a broker then refuses --kafka-port)."""
    return any(a.split("=")[0] in ("--producer-byte-rate", "--consumer-byte-rate") for a in service_args)


class LocalCluster:
    """etcd + controllers + brokers + gateways on loopback, under base_dir."""

    def __init__(
        self,
        base_dir: Path,
        *,
        brokers: int = 3,
        controllers: int = 1,
        gateways: int = 1,
        lease_ttl_s: int = 6,
        gateway_port: int = 0,
        replica_lag_time_max_ms: int | None = None,
        racks: list[str] | None = None,
        python: str = sys.executable,
        tls: bool = False,
        service_args: list[str] | None = None,
        broker_args: list[str] | None = None,
        host: str = "127.0.0.1",
        placements: dict[str, Placement] | None = None,
        kafka_port: int | None = 0,
        token_port: int = 0,
        own_process_groups: bool = False,
    ) -> None:
        """tls: make a local CA and certificates under base_dir/tls and run etcd and every service
        with TLS (mutual TLS between them; each service also gets a --client-port for token
        clients). service_args: extra flags for every service (e.g. --authorizer acl); broker_args:
        extra flags for every broker (e.g. --replicas-max 40000).
        host: the address etcd and every service without a placement listen on and advertise.
        placements: process name ("broker-2") -> where that process runs instead.
        kafka_port: every broker's Kafka protocol listener (docs/KAFKA.md): broker i on kafka_port + i - 1,
        any free port with 0, none with None. With tls it is mutual TLS (and checks ACLs with
        --authorizer acl); none with byte-rate quotas, which the Kafka listener does not charge.
        token_port: with tls, gateway i's token listener (--client-port) on token_port + i - 1, any
        free port with 0.
        own_process_groups: run etcd and every service in a process group of its own. A terminal's
        Ctrl-C goes to its whole foreground group: without this, etcd and every service stop at once
        with the launcher, brokers cannot shut down in a controlled way and no lease is revoked.
        With it only the launcher gets the signal and stop() stops them in order; a kill of the
        launcher's process group no longer reaches them (stop them by pid)."""
        self.own_process_groups = own_process_groups
        self.base_dir = Path(base_dir).resolve()
        self.lease_ttl_s = lease_ttl_s
        self.python = python
        self.service_args = list(service_args or [])
        self.default_placement = Placement(host)
        self.placements = dict(placements or {})
        self.tls_dir: Path | None = self.base_dir / "tls" if tls else None
        etcd_tls = None
        if self.tls_dir is not None:
            from services.security.certs import ensure_local_pki
            from services.security.tls import ETCD_CLIENT_CA_FILE, etcd_client_cert_path, etcd_client_key_path

            services = [
                *(f"controller-{i}" for i in range(1, controllers + 1)),
                *(f"broker-{i}" for i in range(1, brokers + 1)),
                *(f"gateway-{i}" for i in range(1, gateways + 1)),
            ]
            # etcd takes client certificates of its own CA only: the services', its own health
            # probe's and the admin's (for tests and debugging that read etcd itself; `highwater
            # acl|token` go through the controller's RPCs and need none). Client certificates of the
            # cluster CA (issue_client_certificate) cannot reach it. The CAs' keys go to
            # tls/ca-private, apart from the files the services read; a tls/ of the previous layout,
            # keys beside the certificates, has them moved there (same CAs, same certificates).
            ensure_local_pki(
                self.tls_dir,
                ["etcd", ADMIN_TLS_NAME, *services],
                etcd_clients=["etcd", ADMIN_TLS_NAME, *services],
            )
            etcd_tls = EtcdServerTls(
                self.tls_dir / ETCD_CLIENT_CA_FILE,
                self.tls_dir / "etcd.pem",
                self.tls_dir / "etcd-key.pem",
                probe_ca_file=self.tls_dir / "ca.pem",
                probe_cert_file=etcd_client_cert_path(self.tls_dir, "etcd"),
                probe_key_file=etcd_client_key_path(self.tls_dir, "etcd"),
            )
        self.etcd = EtcdServer(
            self.base_dir / "etcd",
            log_path=self.base_dir / "logs" / "etcd.log",
            tls=etcd_tls,
            host=host,
            own_process_group=own_process_groups,
        )
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
            if kafka_port is not None and not _quotas_on(self.service_args):
                extra += ["--kafka-port", str(kafka_port + i - 1 if kafka_port else 0)]
            extra += list(broker_args or [])
            self._add(f"broker-{i}", "broker", extra)
        for i in range(1, gateways + 1):
            # Port 0 lets the gateway bind any free port itself (a port picked here could be taken before the
            # gateway binds it); _wait_ready pins the bound port so restarts keep the address clients know.
            port = gateway_port + i - 1 if gateway_port else 0
            self._add(f"gateway-{i}", "gateway", ["--gateway-id", str(i), "--port", str(port)])
            if self.tls_dir is not None and token_port:
                # Token clients bootstrap with this port: fixed, a new `cluster up` keeps it.
                self._pin_port(self.processes[f"gateway-{i}"], token_port + i - 1, "--client-port")

    def _placement(self, name: str) -> Placement:
        return self.placements.get(name, self.default_placement)

    def _add(self, name: str, kind: str, args: list[str]) -> None:
        if self.tls_dir is not None:
            args = [*args, "--tls-dir", str(self.tls_dir), "--client-port", "0"]
        placement = self._placement(name)
        if placement.host != "127.0.0.1":  # the services' default: loopback command lines stay as they were
            args = [*args, "--host", placement.host]
        self.processes[name] = ServiceProcess(
            name,
            kind,
            args,
            self.base_dir / "logs" / f"{name}.log",
            self.base_dir / "run" / f"{name}.ready",
            placement=placement,
        )

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
    def gateway_client_address(self) -> str:
        """With tls: the gateways' listeners without client certificates (bearer-token clients)."""
        return ",".join(
            f"{p.placement.host}:{p.info['client_port']}"
            for p in self.by_kind("gateway")
            if p.info.get("client_port")
        )

    def client_settings(self, name: str | None = ADMIN_TLS_NAME) -> dict[str, str]:
        """Producer/Consumer/Admin settings for this cluster: {} without tls, else the CA and,
        when name is given, that client certificate (the admin one by default)."""
        if self.tls_dir is None:
            return {}
        from clients.tls import tls_dir_settings

        return tls_dir_settings(self.tls_dir, name)

    def issue_client_certificate(self, name: str) -> dict[str, str]:
        """A new client certificate (CN = name, principal User:<name>) from the cluster's CA; its settings."""
        if self.tls_dir is None:
            raise RuntimeError("this cluster runs without TLS")
        from services.security.certs import issue_certificate

        issue_certificate(self.tls_dir, name)
        return self.client_settings(name)

    def etcd_tls(self, name: str = ADMIN_TLS_NAME) -> EtcdTls | None:
        """coordinator.store.EtcdTls for tools that talk to this cluster's etcd (None without tls)."""
        if self.tls_dir is None:
            return None
        from services.security.tls import TlsMaterial

        return TlsMaterial.load(self.tls_dir, name).etcd_tls()

    def kafka_bootstrap(self) -> str:
        """Every broker's Kafka listener, comma-separated (Kafka's bootstrap.servers); "" without."""
        return ",".join(
            f"{p.placement.host}:{p.info['kafka_port']}"
            for p in self.by_kind("broker")
            if p.info.get("kafka_port")
        )

    @property
    def broker_ids(self) -> list[int]:
        return [int(p.name.split("-")[1]) for p in self.by_kind("broker")]

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout_s: float = PROCESS_READY_TIMEOUT_S) -> LocalCluster:
        atexit.register(self.stop)
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
        cmd = [
            *p.placement.command_prefix,
            self.python,
            "-m",
            "services",
            p.kind,
            *p.args,
            "--etcd",
            self.etcd.endpoint,
            "--lease-ttl-s",
            str(self.lease_ttl_s),
            "--ready-file",
            str(p.ready_path),
            *self.service_args,
        ]
        log = p.log_path.open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        p.proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self.base_dir,
            process_group=0 if self.own_process_groups else None,
        )
        log.close()
        p.info = {}

    def _wait_ready(self, p: ServiceProcess, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if p.proc is not None and p.proc.poll() is not None:
                raise RuntimeError(
                    f"{p.name} exited with code {p.proc.returncode} before it was ready; "
                    f"its log ({p.log_path}) ends with:\n{p.log_tail()}"
                )
            if p.ready_path.exists():
                with contextlib.suppress(ValueError, OSError):
                    p.info = json.loads(p.ready_path.read_text())
                    if p.kind == "gateway":
                        # Keep the gateway's address across restarts: clients know it.
                        self._pin_port(p, int(p.info["port"]))
                        if p.info.get("client_port"):
                            self._pin_port(p, int(p.info["client_port"]), "--client-port")
                    if p.kind == "broker" and p.info.get("kafka_port"):
                        # Kafka clients keep the addresses Metadata gave them: a restart keeps it.
                        self._pin_port(p, int(p.info["kafka_port"]), "--kafka-port")
                    return
            time.sleep(READY_POLL_INTERVAL_S)
        raise TimeoutError(
            f"{p.name} was not ready within {timeout_s:.0f} s; its log ({p.log_path}) ends with:\n"
            f"{p.log_tail()}"
        )

    @staticmethod
    def _pin_port(p: ServiceProcess, port: int, flag: str = "--port") -> None:
        if flag in p.args:
            p.args[p.args.index(flag) + 1] = str(port)
        else:
            p.args += [flag, str(port)]

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
            group = [p.proc for p in self.by_kind(kind) if p.proc is not None and p.running]
            for proc in group:
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGCONT)
                    proc.send_signal(signal.SIGTERM)
            for proc in group:
                try:
                    proc.wait(timeout=PROCESS_STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=PROCESS_STOP_TIMEOUT_S)
        with contextlib.suppress(Exception):
            self.etcd.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- the `highwater cluster up` command ------------------------------------------------------


@click.command("up")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=Path("data/local-cluster"),
    show_default=True,
    help="Where etcd's data, the brokers' logs and every process's log file go.",
)
@click.option("--brokers", type=click.IntRange(1, 16), default=3, show_default=True)
@click.option("--controllers", type=click.IntRange(1, 3), default=1, show_default=True)
@click.option("--gateways", type=click.IntRange(1, 4), default=1, show_default=True)
@click.option(
    "--gateway-port",
    type=click.IntRange(0, 65535),
    default=9092,
    show_default=True,
    help="Port of the first gateway (0: any free port).",
)
@click.option(
    "--kafka-port",
    type=click.IntRange(0, 65535),
    default=19092,
    show_default=True,
    help="Kafka protocol port of broker 1 (broker i: this + i - 1; 0: any free). Mutual TLS with --tls.",
)
@click.option(
    "--token-port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_TOKEN_PORT,
    show_default=True,
    help="With --tls: the first gateway's port for bearer-token clients (gateway i: this + i - 1; "
    "0: any free, a new one at every start).",
)
@click.option("--lease-ttl-s", type=click.IntRange(2, 60), default=6, show_default=True)
@click.option(
    "--tls",
    is_flag=True,
    help="Make a local CA and certificates (DATA_DIR/tls) and run etcd and every service with TLS.",
)
@click.option(
    "--authorizer",
    type=click.Choice(["none", "acl"]),
    default="none",
    show_default=True,
    help="With --tls: enforce ACLs (`highwater acl`); User:admin is a super user.",
)
@click.option(
    "--demo", is_flag=True, help="Create a topic, produce and consume a few records, then keep running."
)
@click.option("--exit-after-demo", is_flag=True, help="With --demo: stop the cluster when the demo is done.")
@click.option(
    "--spark-demo/--no-spark-demo",
    default=True,
    show_default=True,
    help="With --demo: also write and read the topic with a local PySpark job (needs pyspark, Java 17).",
)
def up_command(
    data_dir: Path,
    brokers: int,
    controllers: int,
    gateways: int,
    gateway_port: int,
    kafka_port: int,
    token_port: int,
    lease_ttl_s: int,
    tls: bool,
    authorizer: str,
    demo: bool,
    exit_after_demo: bool,
    spark_demo: bool,
) -> None:
    """Start etcd and a whole cluster as child processes on 127.0.0.1.

    Runs until Ctrl-C or SIGTERM, then stops every process cleanly.

    Example: highwater cluster up --brokers 3 --demo
    """
    from rich.console import Console

    console = Console()
    _check_ports_free(gateway_port, kafka_port, token_port if tls else 0, brokers=brokers, gateways=gateways)
    if authorizer == "acl" and not tls:
        raise click.UsageError("--authorizer acl needs --tls (ACLs name authenticated principals)")
    service_args = (
        ["--authorizer", "acl", "--super-users", f"User:{ADMIN_TLS_NAME}"] if authorizer == "acl" else []
    )
    cluster = LocalCluster(
        data_dir,
        brokers=brokers,
        controllers=controllers,
        gateways=gateways,
        lease_ttl_s=lease_ttl_s,
        gateway_port=gateway_port,
        tls=tls,
        service_args=service_args,
        kafka_port=kafka_port,
        token_port=token_port,
        # Ctrl-C in the terminal reaches this command alone, which stops every process in order.
        own_process_groups=True,
    )
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
        _print_addresses(cluster, console)
        if demo:
            from services.launcher.demo import run_demo

            run_demo(cluster.gateway_address, console, cluster.client_settings())
            if spark_demo and not tls and not stop_requested:
                _spark_demo(cluster.gateway_address, console)
                # PySpark's SparkContext put its own SIGINT handler in place of ours (cancel the
                # jobs, raise KeyboardInterrupt): Ctrl-C must stop the cluster as before the demo.
                signal.signal(signal.SIGINT, on_signal)
            if exit_after_demo:
                return
        console.print("running; Ctrl-C stops every process")
        while not stop_requested:
            for p in cluster.processes.values():
                if p.proc is not None and p.proc.poll() is not None and not stop_requested:
                    console.print(
                        f"[red]{p.name} exited with code {p.proc.returncode}; see {p.log_path}[/red]"
                    )
                    p.proc = None
            time.sleep(WATCH_INTERVAL_S)
    except KeyboardInterrupt:
        # Ctrl-C while the Spark demo held SIGINT: a stop like any other, not click's "Aborted!".
        pass
    finally:
        with console.status("stopping every process..."):
            cluster.stop()
        console.print("stopped")


def _check_ports_free(
    gateway_port: int, kafka_port: int, token_port: int, *, brokers: int, gateways: int
) -> None:
    """Refuse to start when a fixed port is taken (0: any free port, nothing to check): the
    first gateway's port, the brokers' Kafka ports and the gateways' token ports from there."""
    if gateway_port and not _port_free(gateway_port):
        raise click.ClickException(
            f"port {gateway_port} is in use: stop what listens there or pass --gateway-port 0"
        )
    if kafka_port:
        taken = [port for port in range(kafka_port, kafka_port + brokers) if not _port_free(port)]
        if taken:
            raise click.ClickException(
                f"Kafka port(s) {taken} in use: stop what listens there or pass --kafka-port 0"
            )
    if token_port:
        taken = [port for port in range(token_port, token_port + gateways) if not _port_free(port)]
        if taken:
            raise click.ClickException(
                f"token port(s) {taken} in use: stop what listens there or pass --token-port 0"
            )


def _print_addresses(cluster: LocalCluster, console: Console) -> None:
    """What `cluster up` started and how to reach it: pids, addresses, logs, and commands to try."""
    console.print(
        f"[bold]Highwater local cluster[/bold] (data and logs under {cluster.base_dir})", soft_wrap=True
    )
    console.print(f"  etcd          pid {cluster.etcd.pid:<7} {cluster.etcd.endpoint}", soft_wrap=True)
    for p in cluster.processes.values():
        console.print(
            f"  {p.name:<13} pid {p.pid:<7} {p.address:<21} "
            f"metrics http://127.0.0.1:{p.info.get('metrics_port')}/metrics  log {p.log_path}",
            soft_wrap=True,
        )
    kafka_bootstrap = cluster.kafka_bootstrap()
    if kafka_bootstrap:
        first = kafka_bootstrap.split(",")[0]
        kcat_tls = (
            f" -X security.protocol=SSL -X ssl.ca.location={cluster.tls_dir}/ca.pem"
            f" -X ssl.certificate.location={cluster.tls_dir}/{ADMIN_TLS_NAME}.pem"
            f" -X ssl.key.location={cluster.tls_dir}/{ADMIN_TLS_NAME}-key.pem"
            if cluster.tls_dir is not None
            else ""
        )
        console.print(
            f"Kafka protocol (brokers): [bold]{kafka_bootstrap}[/bold]   try: kcat -b {first}{kcat_tls} -L",
            soft_wrap=True,
        )
    tls_flags = f" --tls-dir {cluster.tls_dir} --tls-name {ADMIN_TLS_NAME}" if cluster.tls_dir else ""
    console.print(
        f"bootstrap (gateway): [bold]{cluster.gateway_address}[/bold]   "
        f"try: highwater --bootstrap {cluster.gateway_address}{tls_flags} topic list",
        soft_wrap=True,
    )
    if cluster.tls_dir is not None:
        console.print(
            f"TLS: certificates in {cluster.tls_dir} (the CAs' keys in {cluster.tls_dir}/ca-private, "
            f"which no service reads); etcd at https://{cluster.etcd.endpoint}; "
            f"bearer-token clients use {cluster.gateway_client_address} "
            f"(highwater --bootstrap {cluster.gateway_address}{tls_flags} token create "
            "--principal User:NAME)",
            soft_wrap=True,
        )


def _spark_demo(bootstrap: str, console: Console) -> None:
    """The PySpark part of the demo: skipped with a note when pyspark or Java is missing."""
    import shutil

    try:
        from spark_connector.demo import run_spark_demo
    except ImportError as exc:
        console.print(f"[yellow]skipping the Spark demo: {exc} (pip install '.[spark]')[/yellow]")
        return
    if shutil.which("java") is None:
        console.print("[yellow]skipping the Spark demo: no java on PATH (install Java 17)[/yellow]")
        return
    console.print('[bold]Spark:[/bold] format("highwater") write and read-back on local[2] ...')
    run_spark_demo(bootstrap)


def _port_free(port: int) -> bool:
    """Whether a service could listen on 127.0.0.1:port now.

    The bind sets SO_REUSEADDR, as the services' listeners do (gRPC and asyncio servers):
    then only a socket bound to the port, a listener above all, makes it fail. Connections
    of the last run left in TIME_WAIT after a clean stop (up to a minute) do not stop a
    listener, and refused a bind without the option (issue 43).
    """
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
