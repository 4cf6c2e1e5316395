"""Network namespaces for the chaos tests' network partitions (needs root and iproute2).

The layout, made entirely inside namespaces this module creates (the root
namespace gets no address, link or route, so the rest of the suite and the
machine keep using loopback only):

    <prefix>-hub    bridge `hwbr` with 10.77.0.1/24 (the controllers and the gateway) and
                    10.77.0.2/24 (etcd, on an address of its own so brokers can lose etcd
                    alone), and lo; the scenario driver (partition_scenarios.py) runs here
    <prefix>-b<N>   eth0 10.77.0.<10+N>/24, a veth whose other end is port `b<N>` of the hub's
                    bridge: broker N runs here and advertises that address

The same subnet is used by every run: each run's bridge lives in its own hub
namespace, so runs never see each other. Names carry a per-run prefix
(`hwc<pid>x<4 hex>`), so parallel runs and leftovers of a killed run do not
collide; `reap_stale()` removes namespaces whose creating process is gone.

Faults:
- `cut_off(a, others)`: blackhole routes in a's namespace towards each of
  others, then in theirs towards a. Each side drops what it sends to the
  other; a new connection fails at once (EINVAL), an established one stalls
  until its RPC deadline. All keep reaching the hub (etcd, controller,
  gateway).
- `cut_from_etcd(b)`: a blackhole route to etcd's address in b's namespace:
  broker b loses etcd (its lease runs out) but still reaches the
  controller, the gateway and the other brokers.
- `isolate(b)`: the hub's end of b's veth goes down, so every packet to or
  from broker b is dropped silently (etcd too: its lease runs out).
- `heal()`: every blackhole route removed and every link up again.

Teardown (`destroy()`) kills every process still inside the namespaces by pid
(`ip netns pids`), waits (bounded) until they are gone, then deletes the
namespaces, which deletes their veths and the bridge with them.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import time

HUB_ADDRESS = "10.77.0.1"
ETCD_ADDRESS = "10.77.0.2"
PREFIX_LENGTH = 24
BRIDGE = "hwbr"
# Each ip(8) call is local and quick; a hung one means something is badly wrong.
IP_COMMAND_TIMEOUT_S = 10.0
# After SIGKILL, processes in a namespace are gone within milliseconds; this bounds the wait.
PROCESS_EXIT_TIMEOUT_S = 10.0
PROCESS_EXIT_POLL_S = 0.05
_NAME_PATTERN = re.compile(r"^hwc(\d+)x[0-9a-f]{4}-")


def broker_address(broker_id: int) -> str:
    return f"10.77.0.{10 + broker_id}"


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "no ip(8) from iproute2 on PATH"
    return None


def _ip(*args: str, check: bool = True) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_COMMAND_TIMEOUT_S)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _namespaces() -> list[str]:
    # `ip netns list` prints "name" or "name (id: N)" per line.
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _pids_in(namespace: str) -> list[int]:
    return [int(p) for p in _ip("netns", "pids", namespace, check=False).split() if p.isdigit()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_and_delete(namespace: str) -> list[int]:
    """SIGKILL every process in namespace, wait until they are gone (bounded), delete it; the pids killed."""
    killed: list[int] = []
    deadline = time.monotonic() + PROCESS_EXIT_TIMEOUT_S
    while time.monotonic() < deadline:
        pids = _pids_in(namespace)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                if pid not in killed:
                    killed.append(pid)
        time.sleep(PROCESS_EXIT_POLL_S)
    _ip("netns", "delete", namespace, check=False)
    return killed


def reap_stale() -> list[str]:
    """Delete the namespaces of earlier runs whose creating process no longer exists; their names."""
    reaped = []
    for name in _namespaces():
        m = _NAME_PATTERN.match(name)
        if m and not _pid_alive(int(m.group(1))):
            kill_and_delete(name)
            reaped.append(name)
    return reaped


class Topology:
    """One hub namespace with a bridge and one namespace per broker, named from prefix."""

    def __init__(self, prefix: str, brokers: int) -> None:
        self.prefix = prefix
        self.brokers = brokers

    @staticmethod
    def new_prefix() -> str:
        """A prefix no other run uses: this process's pid (for reap_stale) and a random tag."""
        return f"hwc{os.getpid()}x{secrets.token_hex(2)}"

    @property
    def hub(self) -> str:
        return f"{self.prefix}-hub"

    def broker_namespace(self, broker_id: int) -> str:
        return f"{self.prefix}-b{broker_id}"

    @property
    def namespaces(self) -> list[str]:
        return [self.hub, *(self.broker_namespace(b) for b in range(1, self.brokers + 1))]

    def exec_prefix(self, namespace: str) -> tuple[str, ...]:
        """A command prefix that runs the rest of the command inside namespace (ip execs it: same pid)."""
        return ("ip", "netns", "exec", namespace)

    # ---- lifecycle -------------------------------------------------------------------------------

    def create(self) -> Topology:
        """Make every namespace, the bridge and the veths; on any failure undo what was made and raise."""
        try:
            _ip("netns", "add", self.hub)
            _ip("-n", self.hub, "link", "set", "lo", "up")
            _ip("-n", self.hub, "link", "add", BRIDGE, "type", "bridge")
            _ip("-n", self.hub, "addr", "add", f"{HUB_ADDRESS}/{PREFIX_LENGTH}", "dev", BRIDGE)
            _ip("-n", self.hub, "addr", "add", f"{ETCD_ADDRESS}/{PREFIX_LENGTH}", "dev", BRIDGE)
            _ip("-n", self.hub, "link", "set", BRIDGE, "up")
            for b in range(1, self.brokers + 1):
                ns = self.broker_namespace(b)
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                # Made inside the hub with its peer placed straight into the broker's namespace:
                # no interface ever exists in the root namespace, even for a moment.
                _ip(
                    "-n",
                    self.hub,
                    "link",
                    "add",
                    f"b{b}",
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    ns,
                )
                _ip("-n", self.hub, "link", "set", f"b{b}", "master", BRIDGE)
                _ip("-n", self.hub, "link", "set", f"b{b}", "up")
                _ip("-n", ns, "addr", "add", f"{broker_address(b)}/{PREFIX_LENGTH}", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def destroy(self) -> dict[str, list[int]]:
        """Kill what still runs in the namespaces, then delete them (never raises);
        namespace -> pids killed.
        """
        killed: dict[str, list[int]] = {}
        existing = set()
        with contextlib.suppress(Exception):
            existing = set(_namespaces())
        # Brokers first, the hub (with the driver that started them) last.
        for ns in reversed(self.namespaces):
            if ns in existing:
                with contextlib.suppress(Exception):
                    pids = kill_and_delete(ns)
                    if pids:
                        killed[ns] = pids
        return killed

    def leftovers(self) -> list[str]:
        """Namespaces of this topology that still exist (empty after destroy())."""
        return [ns for ns in _namespaces() if ns in self.namespaces]

    # ---- faults ----------------------------------------------------------------------------------

    def cut_off(self, broker_id: int, others: list[int]) -> float:
        """broker_id and each of others can no longer reach each other; all still reach the hub.

        Returns time.monotonic() once broker_id's routes are all in place: from then on nothing
        it sends reaches the others, so nothing it appends later can be replicated to them.
        """
        for o in others:
            _ip(
                "-n", self.broker_namespace(broker_id), "route", "add", "blackhole", f"{broker_address(o)}/32"
            )
        in_place_s = time.monotonic()
        for o in others:
            _ip(
                "-n", self.broker_namespace(o), "route", "add", "blackhole", f"{broker_address(broker_id)}/32"
            )
        return in_place_s

    def cut_from_etcd(self, broker_id: int) -> None:
        """Broker broker_id can no longer reach etcd; it still reaches everyone else."""
        _ip("-n", self.broker_namespace(broker_id), "route", "add", "blackhole", f"{ETCD_ADDRESS}/32")

    def isolate(self, broker_id: int) -> None:
        """Broker broker_id reaches nobody (no etcd, controller, gateway or broker) and nobody reaches it."""
        _ip("-n", self.hub, "link", "set", f"b{broker_id}", "down")

    def heal(self) -> None:
        """Undo every cut and isolation."""
        for b in range(1, self.brokers + 1):
            ns = self.broker_namespace(b)
            for line in _ip("-n", ns, "route", "show", "type", "blackhole").splitlines():
                if line.strip():
                    # Lines read "blackhole 10.77.0.12"; the route is deleted by the same words.
                    _ip("-n", ns, "route", "del", *line.split())
            _ip("-n", self.hub, "link", "set", f"b{b}", "up")
