"""`python -m services controller|broker|gateway ...`: how LocalCluster starts service processes."""

from __future__ import annotations

import click

from services.cli import SERVICE_COMMANDS


@click.group()
def main() -> None:
    """Run one Highwater service process."""


for command in SERVICE_COMMANDS:
    main.add_command(command)

if __name__ == "__main__":
    main()
