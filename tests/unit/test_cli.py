"""The `highwater` CLI without a server: help texts, usage errors (exit 2), operating errors
(exit 1, one red line and a hint, never a traceback)."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from clients.common import errors
from clients.errors import GatewayUnavailable
from clients.tools.cli import hint_for
from services.launcher.cli import cli  # the `highwater` entry point: every command

UNREACHABLE = "127.0.0.1:1"  # nothing listens on port 1: connection refused at once


def all_commands(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for name, command in group.commands.items():
        path = (*prefix, name)
        found.append(path)
        if isinstance(command, click.Group):
            found.extend(all_commands(command, path))
    return found


OUR_COMMANDS = [
    path
    for path in all_commands()
    if path[0] not in ("broker", "controller", "gateway") and path != ("cluster", "up")
]


def run(*args: str, input: str | None = None) -> click.testing.Result:
    return CliRunner().invoke(cli, list(args), input=input)


def test_the_root_help_lists_the_commands() -> None:
    result = run("--help")
    assert result.exit_code == 0
    for name in ("topic", "produce", "consume", "cluster", "reassign", "elect-leaders", "groups"):
        assert name in result.output


@pytest.mark.parametrize("path", OUR_COMMANDS, ids=" ".join)
def test_every_command_has_help_with_an_example(path: tuple[str, ...]) -> None:
    result = run(*path, "--help")
    assert result.exit_code == 0, result.output
    assert "Example" in result.output, f"`highwater {' '.join(path)} --help` shows no example"


def test_cluster_up_and_service_commands_are_wired_in() -> None:
    names = {" ".join(path) for path in all_commands()}
    assert {"cluster up", "cluster status", "tls init", "broker", "controller", "gateway"} <= names


def test_service_commands_run_the_service_entry_point() -> None:
    """`highwater broker --help` is `python -m services broker --help` (the tools do not
    import the services): run as a real process, it prints the broker's own flags."""
    result = subprocess.run(
        [sys.executable, "-m", "services.launcher.cli", "broker", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--broker-id" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("topic", "create", "t", "--partitions", "0"),
        ("topic", "create", "t", "--partitions", "many"),
        ("topic", "create", "t", "--config", "no-equals-sign"),
        ("topic", "create"),
        ("topic", "add-partitions", "t"),
        ("consume", "t", "--offset", "5"),
        ("consume", "t", "--partition", "-1"),
        ("produce", "t", "--acks", "2"),
        ("produce", "t", "--count", "0"),
        ("produce", "t", "--count", "3", "--key-separator", ":"),
        ("elect-leaders",),
        ("elect-leaders", "t:0", "--all"),
        ("elect-leaders", "t-without-partition", "--type", "preferred"),
        ("reassign", "start", "t:0"),
        ("reassign", "start", "t:0=a,b"),
        ("--output", "yaml", "topic", "list"),
        ("--request-timeout-ms", "0", "topic", "list"),
        ("no-such-command",),
    ],
)
def test_usage_errors_exit_2_without_contacting_the_cluster(args: tuple[str, ...]) -> None:
    result = run("--bootstrap", UNREACHABLE, *args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        ("topic", "list"),
        ("topic", "describe", "orders"),
        ("cluster", "describe"),
        ("groups", "describe", "billing"),
        ("consume", "orders", "--max-records", "1"),
        ("produce", "orders", "--value", "x"),
    ],
)
def test_an_unreachable_gateway_is_one_red_line_and_a_hint(args: tuple[str, ...]) -> None:
    result = run("--bootstrap", UNREACHABLE, "--request-timeout-ms", "500", *args)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    errors_ = [line for line in lines if line.startswith("error:")]
    assert len(errors_) == 1, result.output
    assert errors_[0].startswith("error: GATEWAY_UNAVAILABLE: ") and UNREACHABLE in errors_[0]
    assert any(line.startswith("hint:") for line in lines)


def test_bad_values_the_client_checks_are_operating_errors_naming_the_value() -> None:
    result = run("--bootstrap", "nohost", "topic", "list")
    assert result.exit_code == 1
    assert "error: INVALID_ARGUMENT: gateway address 'nohost' is not host:port" in result.output
    result = run("--bootstrap", UNREACHABLE, "topic", "create", "bad name!")
    assert result.exit_code == 1
    assert "error: INVALID_ARGUMENT: topic name 'bad name!'" in result.output


def test_the_bootstrap_comes_from_the_environment() -> None:
    result = CliRunner(env={"HIGHWATER_BOOTSTRAP": "127.0.0.1:2"}).invoke(
        cli, ["--request-timeout-ms", "300", "topic", "list"]
    )
    assert result.exit_code == 1 and "127.0.0.1:2" in result.output


def test_hints_fit_the_error() -> None:
    assert "cluster up" in hint_for(GatewayUnavailable("x"))
    assert "topic list" in hint_for(errors.UnknownTopicOrPartition("x"))
    assert "retry" in hint_for(errors.NotController("x"))
    assert hint_for(errors.StorageError("x"))  # every error gets some hint
