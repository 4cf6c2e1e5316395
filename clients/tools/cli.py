"""`highwater`: the command line, modelled on Kafka's tools (kafka-topics, kafka-console-producer,
kafka-console-consumer, kafka-reassign-partitions, kafka-leader-election, kafka-consumer-groups).

Every command talks to a gateway (--bootstrap, env HIGHWATER_BOOTSTRAP) through
the sync clients. Output is a table for people or JSON for scripts (--output).

Errors: an operating error (HighwaterError) prints one red line
"error: CODE: message" and a hint, and exits 1; usage errors exit 2 as click
does. A Python traceback means a bug, never a cluster condition.

These are the client commands; the `highwater` entry point is services/launcher/cli.py, which
adds to them the commands that start processes (`cluster up`, `tls init`, `broker` ...).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import sys
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from clients.admin import Admin, LogDescription
from clients.common import errors as wire_errors
from clients.common.topics import topic_config_note
from clients.config import (
    BATCH_SIZE_BYTES_DEFAULT,
    DELIVERY_TIMEOUT_MS_DEFAULT,
    LINGER_MS_DEFAULT,
    MAX_REQUEST_BYTES_DEFAULT,
    REQUEST_TIMEOUT_MS_DEFAULT,
)
from clients.consumer import Consumer
from clients.errors import GatewayUnavailable, HighwaterError, InvalidArgument
from clients.producer import Producer
from clients.tools.acl_cli import SECURITY_COMMANDS
from clients.tools.status import bootstrap_option, output_option, status_command
from clients.types import TopicDescription, TopicPartition

# Produce runs at least this long get a progress bar (when stderr is a terminal).
PROGRESS_MIN_RECORDS = 10_000
# Generated records go to Producer.send_batch this many at a time.
GENERATED_CHUNK_RECORDS = 10_000
# Produce runs up to this many records print each record's partition and offset.
ECHO_OFFSETS_MAX_RECORDS = 10
# How long to look for a gateway before GATEWAY_UNAVAILABLE, at most.
CLI_CONNECT_TIMEOUT_MS_MAX = 5_000
# The range --request-timeout-ms accepts: from too short for any real RPC to ten minutes.
CLI_REQUEST_TIMEOUT_MS_MIN = 100
CLI_REQUEST_TIMEOUT_MS_MAX = 600_000
# `consume` polls this long at a time, so --timeout-ms and Ctrl-C are noticed promptly.
CONSUME_POLL_MS = 500

HINTS: list[tuple[type[HighwaterError], str]] = [
    (
        GatewayUnavailable,
        "is a gateway running there? start one with `highwater cluster up`, or pass "
        "--bootstrap HOST:PORT (env HIGHWATER_BOOTSTRAP)",
    ),
    (InvalidArgument, "see `highwater COMMAND --help`"),
    (wire_errors.UnknownTopicOrPartition, "list topics with `highwater topic list`"),
    (wire_errors.TopicAlreadyExists, "see it with `highwater topic describe NAME`"),
    (
        wire_errors.InvalidReplicationFactor,
        "the replication factor cannot exceed the live brokers (`highwater cluster describe`)",
    ),
    (wire_errors.InvalidPartitions, "a topic's partition count can only grow"),
    (
        wire_errors.NotEnoughReplicas,
        "fewer in-sync replicas than min.insync.replicas: see `highwater topic describe NAME`",
    ),
    (
        wire_errors.RequestTimedOut,
        "raise --request-timeout-ms, or check the cluster with `highwater cluster describe`",
    ),
    (wire_errors.NotController, "a controller election is in progress: retry in a few seconds"),
    (wire_errors.LeaderNotAvailable, "a leader election is in progress: retry in a few seconds"),
    (wire_errors.MessageTooLarge, "records and batches are limited by max.message.bytes (1 MiB by default)"),
    (
        wire_errors.ClusterAuthorizationFailed,
        "your principal lacks an ACL for this: `highwater acl` and `highwater "
        "token` need Alter on the cluster (listing: Describe), granted by a "
        "super user with `highwater acl add --principal User:NAME --operation "
        "Alter --cluster`; see docs/SECURITY.md",
    ),
]


def hint_for(error: HighwaterError) -> str:
    for cls, hint in HINTS:
        if isinstance(error, cls):
            return hint
    if error.retriable:
        return "the condition may be temporary: retry in a few seconds"
    return "see `highwater cluster describe` and `highwater topic describe` for the cluster's state"


class OperatingError(click.ClickException):
    """A HighwaterError on its way out of the CLI: one red line and a hint, exit code 1."""

    exit_code = 1

    def __init__(self, error: HighwaterError) -> None:
        super().__init__(str(error))
        self.error = error

    def show(self, file: Any = None) -> None:
        console = Console(stderr=True, highlight=False, soft_wrap=True)
        one_line = " ".join(str(self.error).split())
        console.print(f"[bold red]error:[/bold red] [red]{escape(one_line)}[/red]")
        console.print(f"[dim]hint: {escape(hint_for(self.error))}[/dim]")


class HighwaterGroup(click.Group):
    """The root group: turns operating errors from any command into OperatingError."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HighwaterError as error:
            raise OperatingError(error) from None


@dataclass
class CliContext:
    bootstrap: str
    output: str
    timeout_ms: int
    # TLS (docs/SECURITY.md): a directory with ca.pem (and <tls_name>.pem/-key.pem), a token.
    tls_dir: str | None = None
    tls_name: str | None = None
    token: str | None = None

    @property
    def json(self) -> bool:
        return self.output == "json"

    def client_settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {
            "request_timeout_ms": self.timeout_ms,
            "connect_timeout_ms": min(self.timeout_ms, CLI_CONNECT_TIMEOUT_MS_MAX),
        }
        if self.tls_dir:
            from clients.tls import tls_dir_settings

            settings.update(tls_dir_settings(self.tls_dir, self.tls_name))
        if self.token:
            settings["auth_token"] = self.token
        return settings

    def admin(self) -> Admin:
        return Admin(self.bootstrap, **self.client_settings())


def out() -> Console:
    return Console(highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


def make_table(
    columns: Sequence[str],
    rows: Iterable[Sequence[str]],
    title: str | None = None,
    right: Collection[str] = (),
) -> Table:
    """A table with a left-aligned title (rich markup: escape what is not) whose `right` columns are
    right-justified (numbers)."""
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left")
    for row in rows:
        table.add_row(*row)
    return table


def parse_key_values(pairs: tuple[str, ...], what: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint=what)
        result[key] = value
    return result


def parse_topic_partition(text: str, what: str = "TOPIC:PARTITION") -> TopicPartition:
    topic, sep, partition = text.rpartition(":")
    if not sep or not topic or not partition.isdigit():
        raise click.BadParameter(f"{text!r} is not TOPIC:PARTITION (e.g. orders:0)", param_hint=what)
    return TopicPartition(topic, int(partition))


def parse_replicas(text: str, what: str) -> list[int]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise click.BadParameter(f"{text!r} is not a list of broker ids like 1,2,3", param_hint=what)
    return [int(p) for p in parts]


def ids(values: Any) -> str:
    return ",".join(str(v) for v in values)


def text_of(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="backslashreplace")


# --- the root -----------------------------------------------------------------------


@click.group(cls=HighwaterGroup, context_settings={"help_option_names": ["-h", "--help"]})
@bootstrap_option("Gateway addresses (env HIGHWATER_BOOTSTRAP); failover in order.")
@output_option("Tables for people, JSON for scripts.")
@click.option(
    "--request-timeout-ms",
    "timeout_ms",
    type=click.IntRange(CLI_REQUEST_TIMEOUT_MS_MIN, CLI_REQUEST_TIMEOUT_MS_MAX),
    default=REQUEST_TIMEOUT_MS_DEFAULT,
    show_default=True,
    help="Timeout of each request to the cluster.",
)
@click.option(
    "--tls-dir",
    envvar="HIGHWATER_TLS_DIR",
    default=None,
    metavar="DIR",
    help="Use TLS: DIR/ca.pem verifies the gateways (env HIGHWATER_TLS_DIR).",
)
@click.option(
    "--tls-name",
    envvar="HIGHWATER_TLS_NAME",
    default=None,
    metavar="NAME",
    help="Present the client certificate DIR/NAME.pem (principal User:NAME; env HIGHWATER_TLS_NAME).",
)
@click.option(
    "--token",
    envvar="HIGHWATER_TOKEN",
    default=None,
    metavar="TOKEN",
    help="Authenticate with a bearer token from `highwater token create` (env HIGHWATER_TOKEN).",
)
@click.version_option(package_name="highwater", prog_name="highwater")
@click.pass_context
def cli(
    ctx: click.Context,
    bootstrap: str,
    output: str,
    timeout_ms: int,
    tls_dir: str | None,
    tls_name: str | None,
    token: str | None,
) -> None:
    """Highwater: a replicated, partitioned commit log with Kafka's design.

    \b
    Examples:
      highwater cluster up                      # etcd + controller + 3 brokers + gateway
      highwater topic create orders -p 6 -r 3
      seq 10 | highwater produce orders
      highwater consume orders --from-beginning --max-records 10
    """
    ctx.obj = CliContext(
        bootstrap=bootstrap,
        output=output,
        timeout_ms=timeout_ms,
        tls_dir=tls_dir,
        tls_name=tls_name,
        token=token,
    )


pass_cli = click.make_pass_decorator(CliContext)


# --- topic --------------------------------------------------------------------------------


@cli.group()
def topic() -> None:
    """Create, list, describe, grow and delete topics.

    \b
    Example:
      highwater topic create orders --partitions 6 --replication-factor 3
    """


@topic.command("create")
@click.argument("name")
@click.option(
    "--partitions",
    "-p",
    type=click.IntRange(min=1),
    default=None,
    help="Number of partitions [default: the cluster's].",
)
@click.option(
    "--replication-factor",
    "-r",
    type=click.IntRange(min=1),
    default=None,
    help="Replicas per partition [default: the cluster's].",
)
@click.option(
    "--config",
    "-c",
    "configs",
    multiple=True,
    metavar="KEY=VALUE",
    help="A topic config, e.g. min.insync.replicas=2 (repeatable).",
)
@click.option("--if-not-exists", is_flag=True, help="Succeed quietly when the topic exists.")
@pass_cli
def topic_create(
    obj: CliContext,
    name: str,
    partitions: int | None,
    replication_factor: int | None,
    configs: tuple[str, ...],
    if_not_exists: bool,
) -> None:
    """Create topic NAME.

    \b
    Example:
      highwater topic create orders -p 6 -r 3 -c min.insync.replicas=2
    """
    config = parse_key_values(configs, "--config")
    with obj.admin() as admin:
        try:
            created = admin.create_topics(name, partitions or -1, replication_factor or -1, config)
        except wire_errors.TopicAlreadyExists:
            if not if_not_exists:
                raise
            created = []
    if obj.json:
        print_json(
            [
                {
                    "name": c.name,
                    "topic_id": c.topic_id,
                    "partitions": c.num_partitions,
                    "replication_factor": c.replication_factor,
                }
                for c in created
            ]
        )
        return
    for c in created:
        out().print(
            f"created topic [bold]{escape(c.name)}[/bold]: {c.num_partitions} partitions, "
            f"replication factor {c.replication_factor} (id {c.topic_id})"
        )
    if not created:
        out().print(f"topic {escape(name)} already exists")


@topic.command("list")
@pass_cli
def topic_list(obj: CliContext) -> None:
    """List every topic's name.

    \b
    Example:
      highwater topic list
    """
    with obj.admin() as admin:
        names = admin.list_topics()
    if obj.json:
        print_json(names)
        return
    for name in names:
        click.echo(name)


@topic.command("describe")
@click.argument("names", nargs=-1)
@pass_cli
def topic_describe(obj: CliContext, names: tuple[str, ...]) -> None:
    """Show each partition's leader, leader epoch, replicas and ISR (default: every topic), the
    topic's configs and each partition's log on its leader: size, offsets (log start, end, high
    watermark and last stable offset, where read_committed consumers stop while a transaction is
    open) and, for a compacted topic (cleanup.policy=compact), the cleaner's dirty ratio, lag and
    whether it is uncleanable.

    \b
    Example:
      highwater topic describe orders
    """
    with obj.admin() as admin:
        descriptions = admin.describe_topics(list(names) if names else None)
        logs, logs_error = describe_logs(admin, descriptions)
    if obj.json:
        print_json(
            [
                {
                    "name": d.name,
                    "topic_id": d.topic_id,
                    "cleanup_policy": d.config.get("cleanup.policy", ""),
                    "config": d.config,
                    "config_sources": d.config_sources,
                    "partitions": [
                        {
                            "partition": p.partition,
                            "leader": p.leader,
                            "leader_epoch": p.leader_epoch,
                            "replicas": list(p.replicas),
                            "isr": list(p.isr),
                            "offline_replicas": list(p.offline_replicas),
                            "log": log_json(logs.get(TopicPartition(d.name, p.partition)), logs_error),
                        }
                        for p in d.partitions
                    ],
                }
                for d in descriptions
            ]
        )
        return
    console = out()
    for d in descriptions:
        under = sum(1 for p in d.partitions if len(p.isr) < len(p.replicas))
        policy = d.config.get("cleanup.policy", "")
        title = f"{d.name}  ({len(d.partitions)} partitions, id {d.topic_id}, cleanup.policy {policy})"
        rows = [
            (
                str(p.partition),
                "[red]none[/red]" if p.leader < 0 else str(p.leader),
                str(p.leader_epoch),
                ids(p.replicas),
                ids(p.isr) if len(p.isr) >= len(p.replicas) else f"[yellow]{ids(p.isr)}[/yellow]",
                ids(p.offline_replicas),
            )
            for p in d.partitions
        ]
        columns = ("partition", "leader", "leader epoch", "replicas", "ISR", "offline")
        console.print(make_table(columns, rows, escape(title), right=("partition", "leader", "leader epoch")))
        if logs_error:
            console.print(f"[yellow]logs not described: {escape(logs_error)}[/yellow]")
        else:
            compacted = "compact" in str(policy).split(",")
            log_columns, log_rows, notes = log_table(d, logs, compacted)
            title = f"{d.name} logs (on each partition's leader)"
            console.print(make_table(log_columns, log_rows, escape(title), right=LOG_NUMBER_COLUMNS))
            for note in notes:
                console.print(f"[red]{escape(note)}[/red]")
        config_rows = [
            (
                name,
                escape(str(value).lower() if isinstance(value, bool) else str(value)),
                "topic" if d.config_sources.get(name) == "TOPIC_CONFIG" else "[dim]default[/dim]",
                # Accepted for Kafka clients, not acted on (docs/KAFKA.md's topic config table).
                escape(topic_config_note(name)),
            )
            for name, value in d.config.items()
        ]
        if config_rows:
            console.print(
                make_table(("config", "value", "source", "note"), config_rows, escape(f"{d.name} configs"))
            )
        if under:
            console.print(f"[yellow]{under} partition(s) under-replicated[/yellow]")


# Short headers: a compacted topic's log table fits an 80-column terminal (-o json has every field).
LOG_NUMBER_COLUMNS = ("partition", "leader", "size", "start", "end", "HW", "dirty", "lag", "clean to")


def describe_logs(
    admin: Admin, descriptions: Sequence[TopicDescription]
) -> tuple[dict[TopicPartition, LogDescription], str]:
    """Every described partition's log from its leader, or ({}, why not): the topics are still
    shown when their logs cannot be (a gateway older than DescribeLogDirs, a timeout)."""
    wanted = [TopicPartition(d.name, p.partition) for d in descriptions for p in d.partitions]
    try:
        return admin.describe_log_dirs(wanted), ""
    except HighwaterError as error:
        return {}, str(error)


def log_table(
    d: TopicDescription, logs: dict[TopicPartition, LogDescription], compacted: bool
) -> tuple[tuple[str, ...], list[tuple[str, ...]], list[str]]:
    """The columns and rows of a topic's log table (the cleaner's columns only when compacted:
    dirty ratio, cleaner lag, the first dirty offset, the cleaner's state), and a line for each
    uncleanable partition saying why."""
    columns: tuple[str, ...] = ("partition", "leader", "size", "start", "end", "HW", "LSO")
    if compacted:
        columns = ("partition", "size", "start", "end", "dirty", "lag", "clean to", "cleaner")
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    for p in d.partitions:
        log = logs.get(TopicPartition(d.name, p.partition))
        if log is None or log.error:
            why = "not described" if log is None else log.error
            rows.append((str(p.partition), f"[yellow]{escape(why)}[/yellow]", *[""] * (len(columns) - 2)))
            continue
        if not compacted:
            rows.append(
                (
                    str(p.partition),
                    str(log.broker_id),
                    human_bytes(log.size_bytes),
                    str(log.log_start_offset),
                    str(log.log_end_offset),
                    str(log.high_watermark),
                    str(log.last_stable_offset),
                )
            )
            continue
        rows.append(
            (
                str(p.partition),
                human_bytes(log.size_bytes),
                str(log.log_start_offset),
                str(log.log_end_offset),
                "" if log.dirty_ratio is None else f"{log.dirty_ratio:.2f}",
                "-" if log.cleaner_lag_ms is None else f"{log.cleaner_lag_ms / 1000:.1f} s",
                "" if log.first_dirty_offset is None else str(log.first_dirty_offset),
                "[red]failing[/red]" if log.uncleanable else "ok",
            )
        )
        if log.uncleanable:
            notes.append(
                f"{d.name}-{p.partition} is uncleanable on broker {log.broker_id}: {log.uncleanable_reason} "
                "(its records are all kept; the cleaner tries again later, its log says more)"
            )
    return columns, rows, notes


def log_json(log: LogDescription | None, logs_error: str) -> dict[str, Any]:
    """A partition's log for -o json: the cleaner's fields only for a compacted log."""
    if log is None or log.error:
        return {"error": logs_error or ("not described" if log is None else log.error)}
    data: dict[str, Any] = {
        "broker_id": log.broker_id,
        "log_dir": log.log_dir,
        "size_bytes": log.size_bytes,
        "log_start_offset": log.log_start_offset,
        "log_end_offset": log.log_end_offset,
        "high_watermark": log.high_watermark,
        "last_stable_offset": log.last_stable_offset,
        "cleanup_policy": log.cleanup_policy,
    }
    if log.compacted:
        data.update(
            dirty_ratio=log.dirty_ratio,
            cleaner_lag_ms=log.cleaner_lag_ms,
            first_dirty_offset=log.first_dirty_offset,
            uncleanable=log.uncleanable,
            uncleanable_reason=log.uncleanable_reason,
            last_cleaned_ms=log.last_cleaned_ms,
        )
    return data


def human_bytes(size: int) -> str:
    """1536 -> '1.5 KiB': a log size at a glance (-o json has the exact bytes)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


@topic.command("delete")
@click.argument("names", nargs=-1, required=True)
@pass_cli
def topic_delete(obj: CliContext, names: tuple[str, ...]) -> None:
    """Delete topics and their data on every replica.

    \b
    Example:
      highwater topic delete orders
    """
    with obj.admin() as admin:
        deleted = admin.delete_topics(list(names))
    if obj.json:
        print_json(deleted)
        return
    for name in deleted:
        out().print(f"deleted topic [bold]{escape(name)}[/bold]")


@topic.command("delete-records")
@click.argument("name", metavar="TOPIC")
@click.option(
    "--partition",
    "-p",
    "partitions",
    type=click.IntRange(min=0),
    multiple=True,
    help="A partition to delete from (repeatable; default: every partition of TOPIC).",
)
@click.option(
    "--before-offset",
    type=click.IntRange(min=-1),
    required=True,
    help="Delete every record below this offset; -1: below the high watermark (everything committed).",
)
@pass_cli
def topic_delete_records(obj: CliContext, name: str, partitions: tuple[int, ...], before_offset: int) -> None:
    """Delete the records of TOPIC below --before-offset (Kafka's kafka-delete-records).

    The partitions' log start offsets move there: older records become unreadable at once and
    whole segments below leave the disk. Prints each partition's low watermark (the new log
    start offset, once every in-sync replica has it).

    \b
    Example:
      highwater topic delete-records orders --partition 0 --before-offset 1000
    """
    with obj.admin() as admin:
        if not partitions:
            (description,) = admin.describe_topics([name])
            partitions = tuple(p.partition for p in description.partitions)
        low = admin.delete_records({TopicPartition(name, p): before_offset for p in partitions})
    if obj.json:
        print_json(
            [
                {"topic": tp.topic, "partition": tp.partition, "low_watermark": w}
                for tp, w in sorted(low.items())
            ]
        )
        return
    rows = [(escape(tp.topic), str(tp.partition), str(w)) for tp, w in sorted(low.items())]
    columns = ("topic", "partition", "low watermark")
    out().print(make_table(columns, rows, "records deleted", right=("partition", "low watermark")))


@topic.command("add-partitions")
@click.argument("name")
@click.option(
    "--partitions",
    "-p",
    "total",
    type=click.IntRange(min=1),
    required=True,
    help="The new total number of partitions (it can only grow).",
)
@pass_cli
def topic_add_partitions(obj: CliContext, name: str, total: int) -> None:
    """Grow topic NAME to --partitions partitions. Keys may map to other partitions afterwards.

    \b
    Example:
      highwater topic add-partitions orders --partitions 12
    """
    with obj.admin() as admin:
        admin.create_partitions(name, total)
    if obj.json:
        print_json({"name": name, "partitions": total})
    else:
        out().print(f"topic [bold]{escape(name)}[/bold] now has {total} partitions")


@topic.command("alter-config")
@click.argument("name")
@click.option(
    "--set",
    "-s",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a topic config, e.g. retention.ms=86400000 (repeatable).",
)
@click.option(
    "--delete",
    "-d",
    "deletes",
    multiple=True,
    metavar="KEY",
    help="Return a topic config to its default (repeatable).",
)
@click.option("--validate-only", is_flag=True, help="Check the change and change nothing.")
@pass_cli
def topic_alter_config(
    obj: CliContext, name: str, sets: tuple[str, ...], deletes: tuple[str, ...], validate_only: bool
) -> None:
    """Change topic NAME's configs; the others are kept. Every replica takes the new values from
    its next append (a lower max.message.bytes refuses larger batches, a new min.insync.replicas
    applies to the next acks=all produce, retention to the next cleanup pass).

    \b
    Example:
      highwater topic alter-config orders --set retention.ms=86400000 --delete max.message.bytes
    """
    if not sets and not deletes:
        raise click.UsageError("give --set KEY=VALUE or --delete KEY (each repeatable)")
    with obj.admin() as admin:
        admin.alter_topic_configs(
            name, parse_key_values(sets, "--set"), list(deletes), validate_only=validate_only
        )
    if obj.json:
        print_json(
            {
                "name": name,
                "validate_only": validate_only,
                "set": parse_key_values(sets, "--set"),
                "delete": list(deletes),
            }
        )
        return
    verb = "would change" if validate_only else "changed"
    parts = [*sets, *(f"{k} (default)" for k in deletes)]
    out().print(f"{verb} topic [bold]{escape(name)}[/bold]: {escape(', '.join(parts))}")


# --- produce / consume -------------------------------------------------------------------------


def _generated_values(value: str | None, size: int, count: int) -> Iterator[bytes]:
    if value is not None:
        fixed = value.encode()
        for _ in range(count):
            yield fixed
        return
    for i in range(count):
        prefix = f"record-{i:010d} ".encode()
        yield (prefix + b"x" * max(0, size - len(prefix)))[: max(size, 1)]


def _stdin_records(
    fixed_key: bytes | None, key_separator: str | None
) -> Iterator[tuple[bytes | None, bytes]]:
    """One record per stdin line: KEY<separator>VALUE with --key-separator, else the line is the value."""
    for line in sys.stdin:
        line = line.rstrip("\r\n")
        if key_separator is not None:
            key_text, found, value_text = line.partition(key_separator)
            if not found:
                raise InvalidArgument(f"stdin line {line!r} has no key separator {key_separator!r}")
            yield key_text.encode(), value_text.encode()
        else:
            yield fixed_key, line.encode()


@contextmanager
def _progress(console: Console, total: int | None) -> Iterator[Callable[[int, float], None]]:
    """A progress bar with the rate on `console` (no-op when total is None)."""
    if total is None:
        yield lambda done, rate: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(
        TextColumn("producing"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        console=console,
    )
    with progress:
        task = progress.add_task("produce", total=total, rate="")
        yield lambda done, rate: progress.update(task, completed=done, rate=f"{rate:,.0f} records/s")


@cli.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option("--value", default=None, help="Produce this value (--count times) instead of reading stdin.")
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Produce this many generated records (of --size bytes) instead of reading stdin.",
)
@click.option(
    "--size", type=click.IntRange(min=1), default=100, show_default=True, help="Bytes per generated value."
)
@click.option("--key", default=None, help="Key of every record (records with one key keep their order).")
@click.option(
    "--key-separator",
    default=None,
    metavar="SEP",
    help="Read 'KEY<SEP>VALUE' lines from stdin, e.g. --key-separator ':'.",
)
@click.option("--header", "headers", multiple=True, metavar="KEY=VALUE", help="A record header (repeatable).")
@click.option(
    "--partition", type=click.IntRange(min=0), default=None, help="Send every record to this partition."
)
@click.option("--acks", type=click.Choice(["all", "1", "0"]), default="all", show_default=True)
@click.option(
    "--compression",
    type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]),
    default="none",
    show_default=True,
)
@click.option("--linger-ms", type=click.IntRange(min=0), default=LINGER_MS_DEFAULT, show_default=True)
@click.option(
    "--batch-size-bytes",
    type=click.IntRange(min=1, max=MAX_REQUEST_BYTES_DEFAULT),
    default=BATCH_SIZE_BYTES_DEFAULT,
    show_default=True,
)
@pass_cli
def produce(
    obj: CliContext,
    topic_name: str,
    value: str | None,
    count: int | None,
    size: int,
    key: str | None,
    key_separator: str | None,
    headers: tuple[str, ...],
    partition: int | None,
    acks: str,
    compression: str,
    linger_ms: int,
    batch_size_bytes: int,
) -> None:
    """Produce records to TOPIC: one per stdin line, or --count generated ones.

    \b
    Examples:
      echo hello | highwater produce orders
      printf 'k1:v1\\nk2:v2\\n' | highwater produce orders --key-separator :
      highwater produce orders --count 1000000 --size 100     # with a progress bar
    """
    header_list = [(k, v.encode()) for k, v in parse_key_values(headers, "--header").items()] or None
    fixed_key = key.encode() if key is not None else None
    generated = value is not None or count is not None
    total = (count or 1) if generated else None
    if generated and key_separator is not None:
        raise click.UsageError("--key-separator reads stdin; it cannot go with --value or --count")

    def records() -> Iterator[tuple[bytes | None, bytes]]:
        if total is not None:
            return ((fixed_key, v) for v in _generated_values(value, size, total))
        return _stdin_records(fixed_key, key_separator)

    failures: list[HighwaterError] = []
    echoed: list[Any] = []

    def on_delivery(metadata: Any, error: HighwaterError | None) -> None:
        if error is not None:
            failures.append(error)

    producer_acks = "all" if acks == "all" else int(acks)
    settings: dict[str, Any] = dict(
        obj.client_settings(),
        acks=producer_acks,
        compression=compression,
        linger_ms=linger_ms,
        batch_size_bytes=batch_size_bytes,
        enable_idempotence=acks == "all",
    )
    settings["delivery_timeout_ms"] = max(DELIVERY_TIMEOUT_MS_DEFAULT, linger_ms + obj.timeout_ms)
    err_console = Console(stderr=True, highlight=False)
    show_progress = total is not None and total >= PROGRESS_MIN_RECORDS and err_console.is_terminal
    echo = total is not None and total <= ECHO_OFFSETS_MAX_RECORDS
    sent = 0
    started = time.monotonic()
    with obj.admin() as admin:
        admin.describe_topics(topic_name)  # fail fast on a missing topic (a producer would wait for it)
    with Producer(obj.bootstrap, **settings) as producer:
        if total is not None and not echo:
            # Generated records: the bulk path, a chunk at a time (a progress bar per chunk).
            bulk: list[Any] = []
            chunks = _generated_values(value, size, total)
            with _progress(err_console, total if show_progress else None) as advance:
                while chunk := list(islice(chunks, GENERATED_CHUNK_RECORDS)):
                    bulk.append(
                        producer.send_batch(
                            topic_name, chunk, key=fixed_key, partition=partition, headers=header_list
                        )
                    )
                    sent += len(chunk)
                    advance(sent, sent / max(time.monotonic() - started, 1e-9))
                producer.flush()
            for future in bulk:
                if future.exception() is not None:
                    failures.append(future.exception())
        else:
            for k, v in records():
                if echo:
                    echoed.append(producer.send(topic_name, v, k, headers=header_list, partition=partition))
                else:
                    producer.produce(
                        topic_name, v, k, headers=header_list, partition=partition, callback=on_delivery
                    )
                sent += 1
            producer.flush()
    elapsed = max(time.monotonic() - started, 1e-9)
    results = []
    for future in echoed:
        try:
            results.append(future.result())
        except HighwaterError as error:
            failures.append(error)
    if failures:
        first = failures[0]
        raise type(first)(f"{len(failures)} of {sent} record(s) failed; first: {first.message}")
    summary = {
        "topic": topic_name,
        "records": sent,
        "seconds": round(elapsed, 3),
        "records_per_s": round(sent / elapsed),
        "failed": 0,
    }
    if obj.json:
        summary["offsets"] = [{"partition": m.partition, "offset": m.offset} for m in results]
        print_json(summary)
        return
    console = out()
    for m in results:
        console.print(f"partition {m.partition} offset {m.offset}")
    rate = f" ({sent / elapsed:,.0f} records/s)" if sent >= 1000 else ""
    Console(stderr=True, highlight=False).print(
        f"[dim]produced {sent:,} record(s) to {escape(topic_name)} in {elapsed:.2f} s{rate}[/dim]"
    )


@cli.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option(
    "--from-beginning", is_flag=True, help="Start at the oldest record (when no offset is committed)."
)
@click.option("--max-records", type=click.IntRange(min=1), default=None, help="Stop after this many records.")
@click.option(
    "--partition",
    "partitions",
    type=click.IntRange(min=0),
    multiple=True,
    help="Read only this partition (repeatable) [default: all].",
)
@click.option(
    "--offset", type=click.IntRange(min=0), default=None, help="Start at this offset in each --partition."
)
@click.option("--group", default=None, help="Consumer group: start from its committed offsets and commit.")
@click.option(
    "--timeout-ms",
    "idle_timeout_ms",
    type=click.IntRange(min=0),
    default=None,
    help="Stop when no record arrived for this long [default: run until Ctrl-C].",
)
@pass_cli
def consume(
    obj: CliContext,
    topic_name: str,
    from_beginning: bool,
    max_records: int | None,
    partitions: tuple[int, ...],
    offset: int | None,
    group: str | None,
    idle_timeout_ms: int | None,
) -> None:
    """Print records of TOPIC: partition, offset, key and value (JSON lines with -o json).

    \b
    Examples:
      highwater consume orders --from-beginning --max-records 10
      highwater consume orders --partition 0 --offset 42 --timeout-ms 2000
      highwater consume orders --group billing            # commits its position
    """
    if offset is not None and not partitions:
        raise click.UsageError("--offset needs --partition")
    settings: dict[str, Any] = dict(
        obj.client_settings(), auto_offset_reset="earliest" if from_beginning else "latest"
    )
    if group is not None:
        settings["group_id"] = group
    consumed = 0
    console = out()
    consumer = Consumer(bootstrap=obj.bootstrap, **settings)
    try:
        existing = consumer.partitions_for_topic(topic_name)
        wanted = [TopicPartition(topic_name, p) for p in (partitions or existing)]
        missing = [tp.partition for tp in wanted if tp.partition not in existing]
        if missing:
            raise wire_errors.UnknownTopicOrPartition(
                f"topic {topic_name!r} has partitions 0-{len(existing) - 1}; there is no {ids(missing)}"
            )
        if group is not None and not partitions:
            consumer.subscribe([topic_name], group)
        else:
            consumer.assign(wanted)
        if offset is not None:
            for tp in wanted:
                consumer.seek(tp, offset)
        last_record_at = time.monotonic()
        while max_records is None or consumed < max_records:
            left = None if max_records is None else max_records - consumed
            batch = consumer.poll(timeout_ms=CONSUME_POLL_MS, max_records=left)
            now = time.monotonic()
            if batch:
                last_record_at = now
            elif idle_timeout_ms is not None and (now - last_record_at) * 1000 >= idle_timeout_ms:
                break
            for record in batch:
                _print_record(console, obj.json, record)
            consumed += len(batch)
    except KeyboardInterrupt:
        pass
    finally:
        try:
            consumer.close()
        except HighwaterError as error:
            Console(stderr=True).print(
                f"[yellow]warning: closing the consumer: {escape(str(error))}[/yellow]"
            )
    Console(stderr=True, highlight=False).print(f"[dim]consumed {consumed:,} record(s)[/dim]")


def _print_record(console: Console, as_json: bool, record: Any) -> None:
    if as_json:
        click.echo(
            json.dumps(
                {
                    "topic": record.topic,
                    "partition": record.partition,
                    "offset": record.offset,
                    "key": text_of(record.key),
                    "value": text_of(record.value),
                    "headers": {k: text_of(v) for k, v in record.headers},
                    "timestamp_ms": record.timestamp_ms,
                }
            )
        )
        return
    key = text_of(record.key)
    click.echo(
        f"{record.partition}\t{record.offset}\t{'-' if key is None else key}\t{text_of(record.value) or ''}"
    )


# --- cluster -----------------------------------------------------------------------------


@cli.group()
def cluster() -> None:
    """Inspect the cluster, or run a local one.

    \b
    Example:
      highwater cluster describe
    """


@cluster.command("describe")
@pass_cli
def cluster_describe(obj: CliContext) -> None:
    """Show the cluster id, the active controller, live brokers and gateways.

    \b
    Example:
      highwater --bootstrap 127.0.0.1:9092 cluster describe
    """
    with obj.admin() as admin:
        d = admin.describe_cluster()
    if obj.json:
        print_json(
            {
                "cluster_id": d.cluster_id,
                "controller_id": d.controller_id,
                "controller_epoch": d.controller_epoch,
                "controller_address": d.controller_address,
                "brokers": [{"id": b.node_id, "address": b.address, "rack": b.rack} for b in d.brokers],
                "gateways": [{"id": g.node_id, "address": g.address} for g in d.gateways],
                "etcd": None if d.etcd_space is None else dataclasses.asdict(d.etcd_space),
            }
        )
        return
    console = out()
    at = f" at {d.controller_address}" if d.controller_address else ""
    controller = (
        f"{d.controller_id}{at} (epoch {d.controller_epoch})"
        if d.controller_id >= 0
        else "[red]none active[/red]"
    )
    if d.cluster_id:
        console.print(f"cluster id: [bold]{escape(d.cluster_id)}[/bold]")
    console.print(f"controller: {controller}")
    if d.etcd_space is not None:
        space = d.etcd_space
        mib = 1024 * 1024
        alarm = " [red]NOSPACE alarm: writes fail (deploy/README.md)[/red]" if space.nospace_alarm else ""
        console.print(
            f"etcd: {space.db_size_bytes / mib:.1f} MiB of {space.quota_bytes / mib:.0f} MiB quota "
            f"({space.db_size_in_use_bytes / mib:.1f} MiB in use){alarm}"
        )
    rows = [("broker", str(b.node_id), b.address, b.rack) for b in d.brokers]
    rows += [("gateway", str(g.node_id), g.address, "") for g in d.gateways]
    console.print(make_table(("role", "id", "address", "rack"), rows, "nodes"))


# --- reassignments and elections ------------------------------------------------------------------


@cli.group()
def reassign() -> None:
    """Move partitions between brokers (kafka-reassign-partitions).

    \b
    Examples:
      highwater reassign start orders:0=2,3,1
      highwater reassign list
      highwater reassign cancel orders:0
    """


@reassign.command("start")
@click.argument("assignments", nargs=-1, required=True, metavar="TOPIC:PARTITION=REPLICAS...")
@pass_cli
def reassign_start(obj: CliContext, assignments: tuple[str, ...]) -> None:
    """Start moving each partition to a new replica list (first replica = preferred leader).

    \b
    Example:
      highwater reassign start orders:0=2,3,1 orders:1=3,1,2
    """
    wanted: dict[TopicPartition, list[int] | None] = {}
    for item in assignments:
        target, sep, replicas = item.partition("=")
        if not sep:
            raise click.BadParameter(
                f"{item!r} is not TOPIC:PARTITION=REPLICAS (e.g. orders:0=1,2,3)", param_hint="ASSIGNMENTS"
            )
        wanted[parse_topic_partition(target)] = parse_replicas(replicas, "ASSIGNMENTS")
    with obj.admin() as admin:
        admin.alter_partition_reassignments(wanted)
    if obj.json:
        print_json(
            [{"topic": tp.topic, "partition": tp.partition, "replicas": r} for tp, r in wanted.items()]
        )
        return
    for tp, replica_ids in wanted.items():
        out().print(f"reassigning {escape(str(tp))} to replicas {ids(replica_ids or [])}")
    out().print("follow it with `highwater reassign list`")


@reassign.command("list")
@click.argument("partitions", nargs=-1, metavar="[TOPIC:PARTITION]...")
@pass_cli
def reassign_list(obj: CliContext, partitions: tuple[str, ...]) -> None:
    """List reassignments in progress.

    \b
    Example:
      highwater reassign list
    """
    tps = [parse_topic_partition(p) for p in partitions] or None
    with obj.admin() as admin:
        ongoing = admin.list_partition_reassignments(tps)
    rows = sorted(ongoing.values(), key=lambda r: (r.topic, r.partition))
    if obj.json:
        print_json(
            [
                {
                    "topic": r.topic,
                    "partition": r.partition,
                    "replicas": list(r.replicas),
                    "adding": list(r.adding_replicas),
                    "removing": list(r.removing_replicas),
                }
                for r in rows
            ]
        )
        return
    if not rows:
        out().print("no reassignment in progress")
        return
    table = [
        (r.topic, str(r.partition), ids(r.replicas), ids(r.adding_replicas), ids(r.removing_replicas))
        for r in rows
    ]
    out().print(make_table(("topic", "partition", "replicas", "adding", "removing"), table))


@reassign.command("cancel")
@click.argument("partitions", nargs=-1, required=True, metavar="TOPIC:PARTITION...")
@pass_cli
def reassign_cancel(obj: CliContext, partitions: tuple[str, ...]) -> None:
    """Cancel reassignments in progress (the partitions keep their original replicas).

    \b
    Example:
      highwater reassign cancel orders:0
    """
    wanted: dict[TopicPartition, list[int] | None] = {parse_topic_partition(p): None for p in partitions}
    with obj.admin() as admin:
        admin.alter_partition_reassignments(wanted)
    if obj.json:
        print_json([str(tp) for tp in wanted])
        return
    for tp in wanted:
        out().print(f"cancelled the reassignment of {escape(str(tp))}")


@cli.command("elect-leaders")
@click.argument("partitions", nargs=-1, metavar="[TOPIC:PARTITION]...")
@click.option(
    "--type",
    "election_type",
    type=click.Choice(["preferred", "unclean"]),
    default="preferred",
    show_default=True,
    help="preferred: give leadership back to the first replica; unclean: let a "
    "replica outside the ISR lead (may lose acknowledged records).",
)
@click.option("--all", "all_partitions", is_flag=True, help="Every partition of every topic.")
@pass_cli
def elect_leaders(
    obj: CliContext, partitions: tuple[str, ...], election_type: str, all_partitions: bool
) -> None:
    """Run leader elections (kafka-leader-election).

    \b
    Examples:
      highwater elect-leaders --all
      highwater elect-leaders orders:0 orders:1 --type preferred
    """
    if bool(partitions) == all_partitions:
        raise click.UsageError("name partitions as TOPIC:PARTITION or pass --all (not both)")
    tps = [parse_topic_partition(p) for p in partitions] or None
    with obj.admin() as admin:
        outcome = admin.elect_leaders(election_type, tps)
    if obj.json:
        print_json(
            [{"topic": tp.topic, "partition": tp.partition, "result": r} for tp, r in sorted(outcome.items())]
        )
        return
    if not outcome:
        out().print("no partition needed an election")
    for tp, result in sorted(outcome.items()):
        out().print(f"{escape(str(tp))}: {result}")


# --- groups ---------------------------------------------------------------------------------


@cli.group()
def groups() -> None:
    """Consumer groups: members, assignments, committed offsets and lag (kafka-consumer-groups).

    \b
    Example:
      highwater groups list
      highwater groups describe billing
      highwater groups reset-offsets billing --topic orders --to-earliest
    """


@groups.command("list")
@pass_cli
def groups_list(obj: CliContext) -> None:
    """List the consumer groups: state, members, epoch.

    \b
    Example:
      highwater groups list
    """
    with obj.admin() as admin:
        listing = admin.list_groups()
    if obj.json:
        print_json([dataclasses.asdict(g) for g in listing])
        return
    if not listing:
        out().print("no consumer groups")
        return
    rows = [(escape(g.group_id), g.state, str(g.members), str(g.group_epoch)) for g in listing]
    columns = ("group", "state", "members", "epoch")
    out().print(make_table(columns, rows, "consumer groups", right=("members", "epoch")))


def _tps_text(tps: list[TopicPartition]) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in tps:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return (
        " ".join(f"{t}:{','.join(str(p) for p in sorted(ps))}" for t, ps in sorted(by_topic.items())) or "-"
    )


@groups.command("describe")
@click.argument("group")
@pass_cli
def groups_describe(obj: CliContext, group: str) -> None:
    """Show GROUP's members (host, client id, epoch, partitions) and, per partition, the
    committed offset, the end offset and the lag.

    \b
    Example:
      highwater groups describe billing
    """
    with obj.admin() as admin:
        d = admin.describe_consumer_group(group)
    if obj.json:
        print_json(dataclasses.asdict(d))
        return
    out().print(
        f"group [bold]{escape(group)}[/bold]: {d.state}, epoch {d.group_epoch}, "
        f"{len(d.members)} member(s), assignor {d.assignor}"
    )
    if d.members:
        members = [
            (
                m.member_id,
                escape(m.instance_id or "-"),
                m.client_host,
                escape(m.client_id),
                str(m.member_epoch),
                escape(_tps_text(m.assignment)),
                escape(_tps_text(m.target_assignment)),
            )
            for m in d.members
        ]
        columns = ("member id", "instance id", "host", "client id", "epoch", "partitions", "target")
        out().print(make_table(columns, members, "members"))
    if not d.offsets:
        out().print("no committed offsets")
        return
    owner = {tp: m.member_id for m in d.members for tp in m.assignment}
    offsets = [
        (
            escape(r.topic),
            str(r.partition),
            str(r.committed_offset) if r.committed_offset >= 0 else "-",
            str(r.end_offset),
            "-" if r.lag is None else str(r.lag),
            owner.get(TopicPartition(r.topic, r.partition), "-"),
        )
        for r in d.offsets
    ]
    offset_columns = ("topic", "partition", "committed offset", "end offset", "lag", "member id")
    right = ("partition", "committed offset", "end offset", "lag")
    out().print(make_table(offset_columns, offsets, "offsets", right=right))


@groups.command("delete")
@click.argument("group")
@pass_cli
def groups_delete(obj: CliContext, group: str) -> None:
    """Delete GROUP's committed offsets (refused while it has members).

    \b
    Example:
      highwater groups delete billing
    """
    with obj.admin() as admin:
        admin.delete_group(group)
    out().print(f"deleted group {escape(group)}")


@groups.command("reset-offsets")
@click.argument("group")
@click.option(
    "--topic", "topics", multiple=True, required=True, help="A topic, or TOPIC:PARTITION. Repeatable."
)
@click.option("--to-earliest", is_flag=True, help="To each partition's first offset.")
@click.option("--to-latest", is_flag=True, help="To each partition's end (skip everything unread).")
@click.option("--to-datetime", default=None, help="To the first record at or after this ISO 8601 time.")
@click.option("--to-offset", type=click.IntRange(min=0), default=None, help="To this offset.")
@click.option("--dry-run", is_flag=True, help="Show the new offsets without committing them.")
@pass_cli
def groups_reset_offsets(
    obj: CliContext,
    group: str,
    topics: tuple[str, ...],
    to_earliest: bool,
    to_latest: bool,
    to_datetime: str | None,
    to_offset: int | None,
    dry_run: bool,
) -> None:
    """Set GROUP's committed offsets; refused while the group has members (stop them first).

    \b
    Example:
      highwater groups reset-offsets billing --topic orders --to-earliest
      highwater groups reset-offsets billing --topic orders:0 --to-offset 42
      highwater groups reset-offsets billing --topic orders --to-datetime 2026-11-25T06:00:00Z --dry-run
    """
    chosen = [to_earliest, to_latest, to_datetime is not None, to_offset is not None]
    if sum(chosen) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-datetime, --to-offset")
    with obj.admin() as admin:
        wanted: list[TopicPartition] = []
        for spec in topics:
            if ":" in spec:
                wanted.append(parse_topic_partition(spec, "--topic"))
            else:
                (description,) = admin.describe_topics([spec])
                wanted.extend(TopicPartition(spec, p.partition) for p in description.partitions)
        if to_offset is not None:
            new = dict.fromkeys(wanted, to_offset)
        else:
            if to_earliest:
                timestamp = EARLIEST_TIMESTAMP
            elif to_latest:
                timestamp = LATEST_TIMESTAMP
            else:
                assert to_datetime is not None
                timestamp = _parse_datetime_ms(to_datetime)
            found = admin.list_offsets(dict.fromkeys(wanted, timestamp))
            ends = admin.list_offsets(dict.fromkeys(wanted, LATEST_TIMESTAMP))
            # No record at or after the time: the end, as kafka-consumer-groups does.
            new = {tp: found[tp] if found.get(tp, -1) >= 0 else ends[tp] for tp in wanted}
        if not dry_run:
            admin.alter_group_offsets(group, new)
    if obj.json:
        print_json(
            [{"topic": tp.topic, "partition": tp.partition, "offset": o} for tp, o in sorted(new.items())]
        )
        return
    title = escape(f"group {group}: new offsets{' (dry run, nothing committed)' if dry_run else ''}")
    rows = [(escape(tp.topic), str(tp.partition), str(offset)) for tp, offset in sorted(new.items())]
    right = ("partition", "new offset")
    out().print(make_table(("topic", "partition", "new offset"), rows, title, right=right))


def _parse_datetime_ms(text: str) -> int:
    """ISO 8601 (a trailing Z or an offset; none: UTC) -> ms since the epoch."""
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise click.BadParameter(f"{text!r} is not an ISO 8601 time, e.g. 2026-11-25T06:00:00Z") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


EARLIEST_TIMESTAMP = -2  # ListOffsets: the log start offset
LATEST_TIMESTAMP = -1  # ListOffsets: the high watermark


# --- transactions ------------------------------------------------------------------------------


@cli.group()
def transactions() -> None:
    """Transactions: list and describe transactional ids, abort a hanging transaction
    (kafka-transactions.sh).

    A hanging transaction is an open one whose producer is gone (killed between its writes and its
    commit, or a bug): until its transaction.timeout.ms runs out it holds every read_committed
    consumer of its partitions at its first offset (the last stable offset). `abort` ends it now.

    \b
    Example:
      highwater transactions list --state Ongoing --older-than-ms 60000
      highwater transactions describe billing-1
      highwater transactions abort billing-1
    """


@transactions.command("list")
@click.option(
    "--state", "states", multiple=True, help="Only these states (Ongoing, PrepareCommit, ...); repeatable."
)
@click.option(
    "--producer-id", "producer_ids", multiple=True, type=int, help="Only these producer ids; repeatable."
)
@click.option(
    "--older-than-ms", type=int, default=-1, help="Only transactions open for longer than this many ms."
)
@pass_cli
def transactions_list(
    obj: CliContext, states: tuple[str, ...], producer_ids: tuple[int, ...], older_than_ms: int
) -> None:
    """List the transactional ids: producer id and state.

    \b
    Example:
      highwater transactions list
      highwater transactions list --state Ongoing --older-than-ms 300000
    """
    with obj.admin() as admin:
        listing = admin.list_transactions(states, producer_ids, older_than_ms)
    if obj.json:
        print_json([dataclasses.asdict(t) for t in listing])
        return
    if not listing:
        out().print(
            "no transactional ids" + (" match" if states or producer_ids or older_than_ms >= 0 else "")
        )
        return
    rows = [(escape(t.transactional_id), str(t.producer_id), t.state) for t in listing]
    out().print(
        make_table(("transactional id", "producer id", "state"), rows, "transactions", right=("producer id",))
    )


@transactions.command("describe")
@click.argument("transactional_ids", nargs=-1, required=True)
@pass_cli
def transactions_describe(obj: CliContext, transactional_ids: tuple[str, ...]) -> None:
    """Show each id's state, producer id and epoch, timeout, how long its transaction has been
    open and the partitions and groups in it.

    \b
    Example:
      highwater transactions describe billing-1 billing-2
    """
    with obj.admin() as admin:
        described = admin.describe_transactions(transactional_ids)
    if obj.json:
        print_json([dataclasses.asdict(d) for d in described])
        return
    now_ms = int(time.time() * 1000)
    rows = [
        (
            escape(d.transactional_id),
            d.state,
            f"{d.producer_id}/{d.producer_epoch}",
            f"{d.transaction_timeout_ms} ms",
            f"{(now_ms - d.transaction_start_time_ms) / 1000:.1f} s"
            if d.transaction_start_time_ms > 0
            else "-",
            escape(_tps_text(list(d.partitions))),
            escape(", ".join(d.groups) or "-"),
        )
        for d in described
    ]
    columns = ("transactional id", "state", "producer/epoch", "timeout", "open for", "partitions", "groups")
    out().print(make_table(columns, rows, "transactions"))


@transactions.command("abort")
@click.argument("transactional_id")
@pass_cli
def transactions_abort(obj: CliContext, transactional_id: str) -> None:
    """Abort TRANSACTIONAL_ID's open transaction now: its producer is fenced (its next call
    fails PRODUCER_FENCED), its records are never read at read_committed, and the ABORT markers
    release its partitions' last stable offset within moments. Refused when nothing is open.

    \b
    Example:
      highwater transactions abort billing-1
    """
    with obj.admin() as admin:
        aborted = admin.abort_transaction(transactional_id)
    if obj.json:
        print_json(dataclasses.asdict(aborted))
        return
    out().print(
        f"aborted the transaction of {escape(transactional_id)}: producer {aborted.producer_id} "
        f"fenced at epoch {aborted.producer_epoch}"
    )


# --- commands of the other modules ------------------------------------------------------------------
# The commands that start processes (`cluster up`, `tls init`, `highwater broker` ...) are not
# here: services/launcher/cli.py adds them to a copy of this group, the `highwater` entry point,
# so that the client tools import nothing of the services.

cluster.add_command(status_command, "status")
for command in SECURITY_COMMANDS:
    cli.add_command(command)
