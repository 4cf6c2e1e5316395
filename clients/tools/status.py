"""`highwater cluster status`: the cluster's health on one screen.

The controller, every broker with its rack and liveness, partition counts,
under-replicated and offline partitions, and each broker's replica fetcher
lag. The picture comes from two sources:

- the gateway's DescribeCluster (the active controller's view: live brokers
  with their metrics ports, and every partition's leader, ISR and replicas);
- each live broker's Prometheus /metrics (its own gauges: fetcher lag,
  under-replicated partitions it leads), fetched concurrently with a short
  timeout, so one unreachable broker costs at most METRICS_TIMEOUT_S.

A broker named in some partition's replica list but missing from the live
list is shown as down. Wiring: `cluster.add_command(status_command)` in
clients/tools/cli.py.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import click
import grpc
from prometheus_client.parser import text_string_to_metric_families
from rich import box
from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table

from clients.config import DEFAULT_BOOTSTRAP
from protos.highwater.v1 import common_pb2, gateway_pb2_grpc

F = TypeVar("F", bound=Callable[..., Any])

# DescribeCluster goes gateway -> active controller; a healthy cluster answers in
# milliseconds, a controller election can take a lease TTL (6 s by default).
DESCRIBE_TIMEOUT_S = 10.0
# Per broker /metrics scrape; brokers are scraped concurrently.
METRICS_TIMEOUT_S = 2.0
METRICS_WORKERS_MAX = 16
# Under-replicated / offline partitions listed one by one in the table, at most.
PARTITIONS_LISTED_MAX = 20

# The broker gauges the status shows (services/broker/metrics.py).
LAG_METRIC = "highwater_replica_fetcher_max_lag"
URP_METRIC = "highwater_under_replicated_partitions"


class StatusError(click.ClickException):
    """The status cannot be had at all (no gateway, no controller): one line, exit code 1."""

    exit_code = 1


@dataclass
class PartitionRow:
    topic: str
    partition: int
    leader: int
    isr: list[int]
    replicas: list[int]


@dataclass
class BrokerRow:
    id: int
    address: str
    rack: str
    alive: bool
    partitions: int = 0
    leaders: int = 0
    under_replicated: int = 0
    max_lag: float | None = None
    metrics_error: str | None = None


@dataclass
class ClusterStatus:
    cluster_id: str
    controller_id: int
    controller_address: str
    controller_epoch: int
    brokers: list[BrokerRow] = field(default_factory=list)
    partition_count: int = 0
    under_replicated: list[PartitionRow] = field(default_factory=list)
    offline: list[PartitionRow] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "cluster_id": self.cluster_id,
            "controller": {
                "id": self.controller_id,
                "address": self.controller_address,
                "epoch": self.controller_epoch,
            },
            "brokers": [asdict(b) for b in self.brokers],
            "partitions": {
                "total": self.partition_count,
                "under_replicated": len(self.under_replicated),
                "offline": len(self.offline),
            },
            "under_replicated_partitions": [asdict(p) for p in self.under_replicated],
            "offline_partitions": [asdict(p) for p in self.offline],
        }


# ---- gathering ---------------------------------------------------------------------------------


def describe_cluster(
    bootstrap: str, timeout_s: float = DESCRIBE_TIMEOUT_S
) -> common_pb2.DescribeClusterResponse:
    """DescribeCluster through the first gateway of `bootstrap` that answers; StatusError if none does."""
    addresses = [a.strip() for a in bootstrap.split(",") if a.strip()]
    if not addresses:
        raise StatusError("--bootstrap names no gateway; give HOST:PORT[,HOST:PORT]")
    failures: list[str] = []
    for address in addresses:
        with grpc.insecure_channel(address) as channel:
            try:
                # The generated *_pb2_grpc stubs carry no annotations (pyproject.toml, [tool.mypy]).
                stub = gateway_pb2_grpc.GatewayServiceStub(channel)  # type: ignore[no-untyped-call]
                resp: common_pb2.DescribeClusterResponse = stub.DescribeCluster(
                    common_pb2.DescribeClusterRequest(), timeout=timeout_s
                )
            except grpc.RpcError as exc:
                failures.append(f"{address}: {exc.code().name}")
                continue
        if resp.error_code != common_pb2.NONE:
            code = common_pb2.ErrorCode.Name(resp.error_code)
            raise StatusError(
                f"the gateway at {address} answered {code}: {resp.error_message or 'no detail'}"
            )
        return resp
    raise StatusError(
        f"cannot reach a gateway ({'; '.join(failures)}); is one running? pass --bootstrap "
        "HOST:PORT or set HIGHWATER_BOOTSTRAP"
    )


def scrape_broker(host: str, metrics_port: int, timeout_s: float = METRICS_TIMEOUT_S) -> dict[str, float]:
    """The unlabelled samples of one broker's /metrics; raises OSError/ValueError when unreachable."""
    if metrics_port <= 0:
        raise ValueError("the broker registered no metrics port")
    with urllib.request.urlopen(f"http://{host}:{metrics_port}/metrics", timeout=timeout_s) as resp:
        text = resp.read().decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.labels
    }


def _scrape_all(brokers: list[common_pb2.BrokerNode]) -> dict[int, dict[str, float] | str]:
    """broker id -> samples, or the reason they could not be had."""

    def one(b: common_pb2.BrokerNode) -> dict[str, float] | str:
        try:
            return scrape_broker(b.host, b.metrics_port)
        except (OSError, ValueError, urllib.error.URLError) as exc:
            return str(getattr(exc, "reason", exc)) or type(exc).__name__

    if not brokers:
        return {}
    with ThreadPoolExecutor(max_workers=min(len(brokers), METRICS_WORKERS_MAX)) as pool:
        return dict(zip([b.broker_id for b in brokers], pool.map(one, brokers), strict=True))


def build_status(
    resp: common_pb2.DescribeClusterResponse, metrics: dict[int, dict[str, float] | str]
) -> ClusterStatus:
    """Pure: the status from a DescribeCluster answer and the brokers' scraped samples."""
    status = ClusterStatus(
        cluster_id=resp.cluster_id,
        controller_id=resp.controller_id,
        controller_address=(f"{resp.controller_host}:{resp.controller_port}" if resp.controller_host else ""),
        controller_epoch=resp.controller_epoch,
    )
    rows: dict[int, BrokerRow] = {
        b.broker_id: BrokerRow(id=b.broker_id, address=f"{b.host}:{b.port}", rack=b.rack, alive=True)
        for b in resp.brokers
    }
    for p in resp.partitions:
        row = PartitionRow(p.topic, p.partition, p.leader, list(p.isr), list(p.replicas))
        status.partition_count += 1
        for replica in p.replicas:
            # A replica's broker that is not live is down (its lease expired, or it was stopped).
            broker = rows.setdefault(replica, BrokerRow(id=replica, address="", rack="", alive=False))
            broker.partitions += 1
        if p.leader < 0:
            status.offline.append(row)
            continue
        if p.leader in rows:
            rows[p.leader].leaders += 1
        if len(p.isr) < len(p.replicas):
            status.under_replicated.append(row)
            if p.leader in rows:
                rows[p.leader].under_replicated += 1
    for broker_id, samples in metrics.items():
        if broker_id not in rows:
            continue
        if isinstance(samples, str):
            rows[broker_id].metrics_error = samples
        else:
            rows[broker_id].max_lag = samples.get(LAG_METRIC)
    status.brokers = sorted(rows.values(), key=lambda b: b.id)
    return status


def gather(bootstrap: str) -> ClusterStatus:
    resp = describe_cluster(bootstrap)
    return build_status(resp, _scrape_all(list(resp.brokers)))


# ---- showing -----------------------------------------------------------------------------------


def render(status: ClusterStatus, console: Console) -> None:
    if status.controller_id >= 0:
        controller = (
            f"{status.controller_id} at {status.controller_address or '?'} (epoch {status.controller_epoch})"
        )
    else:
        controller = "[red]none active[/red]"
    console.print(f"cluster id: [bold]{escape(status.cluster_id or '-')}[/bold]   controller: {controller}")
    urp, offline = len(status.under_replicated), len(status.offline)
    console.print(
        f"partitions: {status.partition_count}   "
        f"under-replicated: {_colour(urp, 'yellow')}   offline: {_colour(offline, 'red')}"
    )

    # Short headers, explained in the caption, so the table fits an 80-column terminal.
    table = Table(
        title="brokers",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        caption_justify="left",
        caption="replicas: partition replicas hosted; leads: partitions led; URP: of those, "
        "under-replicated; lag: replica fetcher max lag (records)",
    )
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("id", "right"),
        ("address", "left"),
        ("rack", "left"),
        ("status", "left"),
        ("replicas", "right"),
        ("leads", "right"),
        ("URP", "right"),
        ("lag", "right"),
    )
    for column, justify in columns:
        table.add_column(column, justify=justify, no_wrap=column == "address")
    for b in status.brokers:
        if b.metrics_error is not None:
            lag = f"[dim]? ({escape(b.metrics_error)})[/dim]"
        elif b.max_lag is None:
            lag = "-" if not b.alive else "0"
        else:
            lag = f"{b.max_lag:.0f}"
        table.add_row(
            str(b.id),
            b.address or "-",
            b.rack or "-",
            "[green]up[/green]" if b.alive else "[red]down[/red]",
            str(b.partitions),
            str(b.leaders),
            _colour(b.under_replicated, "yellow"),
            lag,
        )
    console.print(table)

    for title, rows, colour in (
        ("offline partitions", status.offline, "red"),
        ("under-replicated partitions", status.under_replicated, "yellow"),
    ):
        if not rows:
            continue
        t = Table(title=f"[{colour}]{title}[/{colour}]", title_justify="left", box=box.SIMPLE_HEAD)
        for column in ("partition", "leader", "isr", "replicas"):
            t.add_column(column)
        for p in rows[:PARTITIONS_LISTED_MAX]:
            t.add_row(
                escape(f"{p.topic}-{p.partition}"),
                str(p.leader) if p.leader >= 0 else "[red]none[/red]",
                ",".join(map(str, p.isr)),
                ",".join(map(str, p.replicas)),
            )
        console.print(t)
        if len(rows) > PARTITIONS_LISTED_MAX:
            console.print(f"... and {len(rows) - PARTITIONS_LISTED_MAX} more (--output json lists all)")


def _colour(n: int, colour: str) -> str:
    return f"[{colour}]{n}[/{colour}]" if n else "0"


def bootstrap_option(help_text: str) -> Callable[[F], F]:
    """`--bootstrap/-b HOST:PORT[,HOST:PORT]` (env HIGHWATER_BOOTSTRAP). Defined here, not in
    cli.py, because cli.py imports this module; the root `highwater` command uses it too."""
    return click.option(
        "--bootstrap",
        "-b",
        envvar="HIGHWATER_BOOTSTRAP",
        default=DEFAULT_BOOTSTRAP,
        show_default=True,
        metavar="HOST:PORT[,HOST:PORT]",
        help=help_text,
    )


def output_option(help_text: str) -> Callable[[F], F]:
    """`--output/-o table|json` (default table), here for the same reason as bootstrap_option."""
    return click.option(
        "--output",
        "-o",
        type=click.Choice(["table", "json"]),
        default="table",
        show_default=True,
        help=help_text,
    )


@click.command("status")
@bootstrap_option("Gateway addresses (env HIGHWATER_BOOTSTRAP), tried in order.")
@output_option("A table for people, JSON for scripts.")
def status_command(bootstrap: str, output: str) -> None:
    """Show the controller, brokers (rack, up/down, lag) and partition health.

    Per broker: partition replicas it hosts, partitions it leads, how many of
    those are under-replicated, and its replica fetcher's max lag (records
    behind the leaders' high watermark, from its /metrics).

    \b
    Examples:
      highwater cluster status
      highwater cluster status --bootstrap 127.0.0.1:19092 --output json
    """
    status = gather(bootstrap)
    if output == "json":
        click.echo(json.dumps(status.to_json(), indent=2))
        return
    render(status, Console(highlight=False, soft_wrap=True))
