#!/usr/bin/env python3
"""Build the Highwater image on a machine that reaches no image registry.

    python deploy/build_image.py            # tools, dockerd, base image, highwater:dev
    python deploy/build_image.py --help

Steps, each skipped when its result is already there:

1. Install Debian's docker.io, docker-compose and debootstrap with apt-get
   (root only) when a command is missing.
2. Start dockerd when no daemon answers: `--bridge=none --iptables=false`, as
   this kind of machine allows, log in /var/log/highwater-dockerd.log. The
   images it holds stay in /var/lib/docker, so the next run finds them.
3. Base image `highwater-base:bookworm`: `debootstrap --variant=minbase
   bookworm` from the mirror apt's own sources name, imported with
   `docker import`. Cached: made once, reused until removed.
4. `docker build` of deploy/Dockerfile on that base with `--network host`:
   apt (python3, venv, etcd) and pip (the project's dependencies) reach their
   registries during the build only; the containers need no network outside
   the host.

The build context is staged in a temporary directory holding only what
`pip install` needs, because the classic builder (the one Debian's
docker-compose drives) reads no per-Dockerfile ignore file and the repository
root holds .venv and data directories. The host's CA bundle is staged with it
(deploy/build-ca/README.md says why).

The test tests/integration/test_compose.py imports this module by path and
uses the same functions; run as a command, a dockerd it started is left
running for docker-compose and its pid printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

BASE_IMAGE = "highwater-base:bookworm"
IMAGE = "highwater:dev"
DEBIAN_SUITE = "bookworm"

# Debian's client first: it speaks the API of Debian's daemon, and a newer
# static client earlier on PATH would try BuildKit, which this daemon may lack.
DOCKER_CANDIDATES = ("/usr/bin/docker", "docker")
COMPOSE_CANDIDATES = ("/usr/bin/docker-compose", "docker-compose")
DOCKERD_LOG = Path("/var/log/highwater-dockerd.log")
DOCKERD_ARGS = ("--bridge=none", "--iptables=false", "--ip6tables=false")

# A package list refresh plus three packages took ~20 s here; leave room for a slow mirror.
APT_TIMEOUT_S = 600.0
# dockerd answered `docker info` within ~3 s here; containerd starts with it.
DOCKERD_START_TIMEOUT_S = 60.0
DOCKERD_STOP_TIMEOUT_S = 30.0
DOCKER_INFO_TIMEOUT_S = 10.0
# debootstrap minbase took ~26 s and 206 MB here.
DEBOOTSTRAP_TIMEOUT_S = 900.0
IMPORT_TIMEOUT_S = 300.0
# Cold: apt in the image plus pip of every dependency, ~2-3 min here; warm: seconds.
BUILD_TIMEOUT_S = 1200.0

# Commands this module needs and the Debian package that brings each.
REQUIRED_COMMANDS = {"dockerd": "docker.io", "docker-compose": "docker-compose", "debootstrap": "debootstrap"}


class ToolsUnavailable(RuntimeError):
    """docker or debootstrap is missing and cannot be installed on this machine."""


def log(msg: str) -> None:
    print(f"[build_image {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _which(candidates: Sequence[str]) -> str | None:
    for c in candidates:
        found = shutil.which(c)
        if found:
            return found
    return None


def docker_bin() -> str:
    found = _which(DOCKER_CANDIDATES)
    if found is None:
        raise ToolsUnavailable("no docker client: install Debian's docker.io")
    return found


def compose_bin() -> str:
    found = _which(COMPOSE_CANDIDATES)
    if found is None:
        raise ToolsUnavailable("no docker-compose: install Debian's docker-compose")
    return found


# ---- 1. tools ---------------------------------------------------------------------------------


def missing_packages() -> list[str]:
    """Debian packages whose command is not on this machine."""
    return sorted({pkg for cmd, pkg in REQUIRED_COMMANDS.items() if shutil.which(cmd) is None})


def install_tools() -> None:
    """apt-get install whatever of docker.io, docker-compose, debootstrap is missing.

    Raises ToolsUnavailable when something is missing and this machine cannot
    install it (no apt-get, not root, or apt failed): the caller decides
    whether that is a skip or an error.
    """
    missing = missing_packages()
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise ToolsUnavailable(f"{', '.join(missing)} missing and there is no apt-get to install them")
    if os.geteuid() != 0:
        raise ToolsUnavailable(f"{', '.join(missing)} missing and installing them needs root")
    log(f"installing {' '.join(missing)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    deadline = time.monotonic() + APT_TIMEOUT_S
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *missing]):
        left_s = max(deadline - time.monotonic(), 1.0)
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=left_s, check=False)
        if res.returncode != 0:
            raise ToolsUnavailable(
                f"`{' '.join(cmd)}` failed ({res.returncode}): {res.stderr.strip()[-500:]}"
            )
    still = missing_packages()
    if still:
        raise ToolsUnavailable(f"apt-get ran but {', '.join(still)} is still missing")


# ---- 2. the daemon ----------------------------------------------------------------------------


def daemon_answers() -> bool:
    try:
        res = subprocess.run(
            [docker_bin(), "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=DOCKER_INFO_TIMEOUT_S,
            check=False,
        )
    except (subprocess.TimeoutExpired, ToolsUnavailable):
        return False
    return res.returncode == 0


def start_daemon(log_path: Path = DOCKERD_LOG, timeout_s: float = DOCKERD_START_TIMEOUT_S) -> int | None:
    """Start dockerd unless a daemon already answers; return its pid, or None when it was running.

    The daemon gets its own session so it outlives this process when run as a
    command; a caller that wants it gone passes the pid to stop_daemon.
    """
    if daemon_answers():
        return None
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise ToolsUnavailable("no dockerd: install Debian's docker.io")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            [dockerd, *DOCKERD_ARGS],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"dockerd exited with code {proc.returncode}; see {log_path}:\n{_tail(log_path)}"
            )
        if daemon_answers():
            log(f"dockerd started (pid {proc.pid}, log {log_path})")
            return proc.pid
        time.sleep(0.5)
    stop_daemon(proc.pid)
    raise TimeoutError(f"dockerd did not answer within {timeout_s:.0f} s; see {log_path}:\n{_tail(log_path)}")


def stop_daemon(pid: int, timeout_s: float = DOCKERD_STOP_TIMEOUT_S) -> None:
    """SIGTERM the dockerd we started (it stops its containerd), SIGKILL after timeout_s."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _tail(path: Path, size_bytes: int = 3000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-size_bytes:].decode(errors="replace")


# ---- 3. the base image ------------------------------------------------------------------------


def image_exists(name: str) -> bool:
    res = subprocess.run(
        [docker_bin(), "image", "inspect", name],
        capture_output=True,
        timeout=DOCKER_INFO_TIMEOUT_S,
        check=False,
    )
    return res.returncode == 0


def apt_mirror() -> str:
    """The Debian mirror apt's own sources name (deb822 .sources files or sources.list)."""
    uris: list[str] = []
    sources_dir = Path("/etc/apt/sources.list.d")
    for path in sorted(sources_dir.glob("*.sources")) if sources_dir.is_dir() else []:
        text = path.read_text(errors="replace")
        for stanza in re.split(r"\n\s*\n", text):
            fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.+)$", stanza, flags=re.M))
            if DEBIAN_SUITE in fields.get("Suites", "").split() and "deb" in fields.get("Types", "").split():
                uris += fields.get("URIs", "").split()
    sources_list = Path("/etc/apt/sources.list")
    if sources_list.exists():
        for line in sources_list.read_text(errors="replace").splitlines():
            m = re.match(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+" + DEBIAN_SUITE + r"\s", line)
            if m:
                uris.append(m.group(1))
    for uri in uris:
        if "security" not in uri:
            return uri
    return "http://deb.debian.org/debian"


def ensure_base_image(name: str = BASE_IMAGE, *, rebuild: bool = False) -> None:
    """debootstrap a minimal bookworm and import it as `name`, unless it exists."""
    if image_exists(name) and not rebuild:
        log(f"base image {name} exists; reusing it")
        return
    mirror = apt_mirror()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="highwater-rootfs-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        log(f"debootstrap --variant=minbase {DEBIAN_SUITE} from {mirror} (about half a minute)")
        res = subprocess.run(
            ["debootstrap", "--variant=minbase", DEBIAN_SUITE, str(rootfs), mirror],
            capture_output=True,
            text=True,
            timeout=DEBOOTSTRAP_TIMEOUT_S,
            check=False,
        )
        if res.returncode != 0:
            raise RuntimeError(
                f"debootstrap failed ({res.returncode}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}"
            )
        # Downloaded .debs are not needed in the image.
        for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            res = subprocess.run(
                [docker_bin(), "import", "--change", 'CMD ["/bin/bash"]', "-", name],
                stdin=tar.stdout,
                capture_output=True,
                text=True,
                timeout=IMPORT_TIMEOUT_S,
                check=False,
            )
        finally:
            if tar.stdout is not None:
                tar.stdout.close()
            tar.wait(timeout=IMPORT_TIMEOUT_S)
        if res.returncode != 0 or tar.returncode != 0:
            raise RuntimeError(f"docker import failed ({res.returncode}, tar {tar.returncode}): {res.stderr}")
    log(f"base image {name} made in {time.monotonic() - started:.0f} s")


# ---- 4. the Highwater image -------------------------------------------------------------------


def stage_context(dest: Path, repo: Path = REPO_ROOT) -> None:
    """Copy what `pip install` needs into dest: pyproject, README, packages, the deploy scripts.

    The packages are those pyproject.toml's [tool.setuptools.packages.find]
    includes, so a new top-level package is picked up without editing this.
    """
    pyproject = tomllib.loads((repo / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    top_levels = sorted({p.split(".")[0].rstrip("*") for p in patterns})
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(repo / name, dest / name)
    for pkg in top_levels:
        if (repo / pkg).is_dir():
            shutil.copytree(repo / pkg, dest / pkg, ignore=ignore)
    (dest / "deploy").mkdir()
    for name in ("Dockerfile", "entrypoint.sh", "healthcheck.py"):
        shutil.copy2(repo / "deploy" / name, dest / "deploy" / name)
    shutil.copytree(repo / "deploy" / "build-ca", dest / "deploy" / "build-ca")
    bundle = host_ca_bundle()
    if bundle is not None:
        shutil.copyfile(bundle, dest / "deploy" / "build-ca" / "ca-certificates.crt")


def host_ca_bundle() -> Path | None:
    """The CA bundle this machine's pip trusts: the image build trusts the same.

    Where PyPI is reached through a TLS-intercepting proxy, only the host's
    bundle holds the proxy's CA; the Dockerfile uses it in its wheels stage only.
    """
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(var)
        if value and Path(value).is_file():
            return Path(value)
    default = Path("/etc/ssl/certs/ca-certificates.crt")
    return default if default.is_file() else None


def build_image(tag: str = IMAGE, base: str = BASE_IMAGE, repo: Path = REPO_ROOT) -> None:
    """docker build deploy/Dockerfile on `base`; layers are cached, so a rebuild after code edits is quick."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="highwater-context-") as tmp:
        context = Path(tmp)
        stage_context(context, repo)
        # --force-rm: a failed step leaves no stopped container behind.
        cmd = [
            docker_bin(),
            "build",
            "--force-rm",
            "--network",
            "host",
            "--build-arg",
            f"BASE_IMAGE={base}",
            "-f",
            str(context / "deploy" / "Dockerfile"),
            "-t",
            tag,
            str(context),
        ]
        log(f"docker build -t {tag} (base {base})")
        # The classic builder honours --network host for RUN steps; see the module docstring.
        env = {**os.environ, "DOCKER_BUILDKIT": "0"}
        res = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
        )
        if res.returncode != 0:
            raise RuntimeError(
                f"docker build failed ({res.returncode}):\n{res.stdout[-4000:]}\n{res.stderr[-3000:]}"
            )
    log(f"image {tag} built in {time.monotonic() - started:.0f} s")


def ensure_image(tag: str = IMAGE, base: str = BASE_IMAGE, *, rebuild_base: bool = False) -> None:
    """Tools, base image, image: everything after the daemon runs."""
    ensure_base_image(base, rebuild=rebuild_base)
    build_image(tag, base)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tag", default=IMAGE, help=f"image to build (default {IMAGE})")
    parser.add_argument("--base", default=BASE_IMAGE, help=f"debootstrap base image (default {BASE_IMAGE})")
    parser.add_argument(
        "--rebuild-base", action="store_true", help="debootstrap again even if the base exists"
    )
    args = parser.parse_args(argv)
    try:
        install_tools()
        pid = start_daemon()
        ensure_image(args.tag, args.base, rebuild_base=args.rebuild_base)
    except (ToolsUnavailable, RuntimeError, TimeoutError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if pid is not None:
        log(f"dockerd keeps running for docker-compose (pid {pid}); stop it with: kill {pid}")
    print(args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
