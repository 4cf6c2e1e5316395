"""`highwater`: the one entry point (pyproject.toml's [project.scripts]), a composition root.

It puts together what two layers own without making either import the other: the client
commands (clients/tools/cli.py: topics, produce, consume, groups, acl, token, cluster
describe|status), which reach a cluster only through its RPCs, and the commands that start
processes, which need the services' code: `cluster up` (local_cluster.py), `tls init`
(tls_cli.py) and `controller|broker|gateway`. The client group is copied, not changed, so
`clients.tools.cli.cli` stays the client commands alone, whoever imports this module.
"""

from __future__ import annotations

import copy
import os
import sys
from typing import NoReturn

import click

from clients.tools.cli import cli as client_cli
from clients.tools.cli import cluster as client_cluster
from services.launcher.local_cluster import up_command
from services.launcher.tls_cli import tls_group

SERVICE_KINDS = ("controller", "broker", "gateway")


def _service_command(kind: str) -> click.Command:
    """`highwater <kind> ...`: runs `python -m services <kind> ...` in this process's place.

    An exec rather than the service command itself: `highwater --help` and the client
    commands then load none of the services (grpc servers, numba kernels), and the service
    prints its own help and errors exactly as `python -m services <kind>` (services/__main__.py),
    how the launcher and the container image start it.
    """

    @click.command(
        kind,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
        help=f"Run one {kind} process (`python -m services {kind}`); `--help` lists its flags.",
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> None:
        os.execv(sys.executable, [sys.executable, "-m", "services", kind, *args])

    return command


def _with_commands(group: click.Group, extra: dict[str, click.Command]) -> click.Group:
    """A shallow copy of `group` with `extra` among its commands; `group` itself is untouched."""
    whole = copy.copy(group)
    whole.commands = {**group.commands, **extra}
    return whole


cluster = _with_commands(client_cluster, {"up": up_command})
cli = _with_commands(
    client_cli,
    {
        "cluster": cluster,
        "tls": tls_group,
        **{kind: _service_command(kind) for kind in SERVICE_KINDS},
    },
)


def main(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point (`highwater`)."""
    cli.main(args=argv, prog_name="highwater")
    sys.exit(0)  # pragma: no cover - click exits itself


if __name__ == "__main__":
    main()
