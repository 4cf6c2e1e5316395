"""`highwater controller|broker|gateway`: run one service process.

Every flag can also be given as an environment variable with the same name
(HIGHWATER_BROKER_ID for --broker-id, and so on), which is how the container
image is configured.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from services.common import limits
from services.kafka.cli_options import kafka_listener_options
from services.security.cli_options import security_options

ETCD_HELP = "etcd endpoints, host:port[,host:port...]"


def _endpoints(value: str) -> list[str]:
    endpoints = [e.strip() for e in value.split(",") if e.strip()]
    if not endpoints:
        raise click.BadParameter("give at least one etcd endpoint, e.g. 127.0.0.1:2379")
    return endpoints


@dataclass(frozen=True)
class CommonOptions:
    """The flags every service command takes (`@_common`), handed over as one `common` argument."""

    etcd: str
    etcd_prefix: str
    host: str
    port: int
    metrics_port: int
    lease_ttl_s: int
    ready_file: Path | None
    log_level: str
    json_logs: bool

    def config_fields(self) -> dict[str, Any]:
        """The fields they set in every service's config (BrokerConfig, ControllerConfig, GatewayConfig)."""
        return {
            "etcd_endpoints": _endpoints(self.etcd),
            "host": self.host,
            "port": self.port,
            "metrics_port": self.metrics_port,
            "etcd_prefix": self.etcd_prefix,
            "lease_ttl_s": self.lease_ttl_s,
            "ready_file": self.ready_file,
        }


_COMMON_NAMES = tuple(CommonOptions.__dataclass_fields__)


def _common(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add the flags every service takes; the command receives them as `common=CommonOptions(...)`."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in _COMMON_NAMES}
        return f(*args, common=CommonOptions(**values), **kwargs)

    options = [
        click.option("--etcd", "etcd", default="127.0.0.1:2379", show_default=True, help=ETCD_HELP),
        click.option("--etcd-prefix", default="/highwater", show_default=True, help="Key prefix in etcd."),
        click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on."),
        click.option(
            "--port",
            type=click.IntRange(0, 65535),
            default=0,
            show_default=True,
            help="gRPC port (0: any free port, written to --ready-file).",
        ),
        click.option(
            "--metrics-port",
            type=click.IntRange(0, 65535),
            default=0,
            show_default=True,
            help="Prometheus /metrics port (0: any free port).",
        ),
        click.option(
            "--lease-ttl-s",
            type=click.IntRange(limits.LEASE_TTL_S_MIN, limits.LEASE_TTL_S_MAX),
            default=limits.LEASE_TTL_S,
            show_default=True,
            help="etcd lease TTL: how soon a dead process is noticed.",
        ),
        click.option(
            "--ready-file",
            type=click.Path(path_type=Path),
            default=None,
            help="Write {pid, port, metrics_port} as JSON here once ready.",
        ),
        click.option(
            "--log-level",
            default="INFO",
            show_default=True,
            type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
        ),
        click.option("--json-logs", is_flag=True, help="Log JSON lines instead of text."),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def _run(main: Coroutine[Any, Any, None], common: CommonOptions) -> None:
    from coordinator.store import CoordinatorError
    from services.common.server import configure_logging

    configure_logging(common.log_level, common.json_logs)
    try:
        asyncio.run(main)
    except CoordinatorError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        pass
    else:
        # The service stopped cleanly: its logs are closed and synced, its lease revoked, every
        # connection closed. Exit now rather than let the interpreter tear down a heap of
        # partitions, channels and threads one object at a time (0.2 s at 1,000 partitions,
        # most of what a controlled shutdown spent after its last leadership moved).
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@click.command("broker", context_settings={"auto_envvar_prefix": "HIGHWATER"})
@click.option(
    "--broker-id", type=click.IntRange(0, 2**31 - 1), required=True, help="Unique id of this broker."
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    required=True,
    help="Directory for the partition logs of this broker.",
)
@click.option("--rack", default="", help="Rack (failure domain) for replica placement.")
@click.option(
    "--replica-lag-time-max-ms",
    type=click.IntRange(limits.REPLICA_LAG_TIME_MAX_MS_MIN),
    default=limits.REPLICA_LAG_TIME_MAX_MS,
    show_default=True,
    help="A follower not caught up for this long leaves the ISR.",
)
@click.option(
    "--log-cache-window-bytes",
    type=click.IntRange(limits.LOG_CACHE_WINDOW_OFF),
    default=limits.LOG_CACHE_WINDOW_BYTES_DEFAULT,
    show_default=True,
    help="Newest bytes of each partition's log file kept in the page cache; older ones are written "
    "back and dropped as the log grows, so readers behind by more read from disk. At least 1048576 "
    "(1 MiB); -1 leaves the page cache to the kernel, as Kafka does.",
)
@click.option(
    "--kafka-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Also speak Kafka's wire protocol on this port (0: any free port; docs/KAFKA.md). "
    "Off when not given.",
)
@click.option(
    "--replicas-max",
    type=click.IntRange(1, limits.REPLICAS_PER_BROKER_MAX_CEILING),
    default=limits.REPLICAS_PER_BROKER_MAX,
    show_default=True,
    help="Replicas this broker prepares for (3 open files each) and registers; the controller places "
    "no more on it.",
)
@click.option(
    "--fetch-max-bytes",
    type=click.IntRange(limits.FETCH_RESPONSE_MAX_BYTES_MIN, limits.FETCH_RESPONSE_MAX_BYTES_CEILING),
    default=limits.FETCH_RESPONSE_MAX_BYTES_DEFAULT,
    show_default=True,
    help="Most record bytes in one consumer Fetch answer, gRPC or Kafka, whatever max_bytes the "
    "client asked (Kafka's fetch.max.bytes). The first batch is returned whole even when larger, so "
    "consumers always make progress.",
)
@click.option(
    "--log-cleaner-enable/--no-log-cleaner-enable",
    default=True,
    show_default=True,
    help="Run the log cleaner, which keeps only the latest record per key of topics with "
    "cleanup.policy=compact (Kafka's log.cleaner.enable). Without it compacted topics keep every record.",
)
@click.option(
    "--log-cleaner-dedupe-buffer-bytes",
    type=click.IntRange(limits.LOG_CLEANER_DEDUPE_BUFFER_BYTES_MIN),
    default=limits.LOG_CLEANER_DEDUPE_BUFFER_BYTES_DEFAULT,
    show_default=True,
    help="Memory of the cleaner's key -> latest offset map (Kafka's log.cleaner.dedupe.buffer.size), "
    f"about {limits.LOG_CLEANER_OFFSET_MAP_ENTRY_BYTES} bytes a key; a log with more keys in its dirty "
    "part is cleaned in several passes.",
)
@click.option(
    "--log-cleaner-io-max-bytes-per-second",
    type=click.IntRange(0),
    default=limits.LOG_CLEANER_IO_MAX_BYTES_PER_SECOND_DEFAULT,
    show_default=True,
    help="The cleaner's read + write rate (Kafka's log.cleaner.io.max.bytes.per.second); 0: no limit.",
)
@click.option(
    "--log-cleaner-backoff-ms",
    type=click.IntRange(1),
    default=limits.LOG_CLEANER_BACKOFF_MS_DEFAULT,
    show_default=True,
    help="Sleep between looks for a compacted log to clean when none needs it "
    "(Kafka's log.cleaner.backoff.ms).",
)
@click.option(
    "--log-cleaner-cpu-max-share",
    type=click.FloatRange(0, 1),
    default=limits.LOG_CLEANER_CPU_MAX_SHARE_DEFAULT,
    show_default=True,
    help="The share of one core the cleaner may use (0: no limit). Cleaning is background work: "
    "what it spends, produce and fetch lose. Raise it when compacted topics are written faster "
    "than the cleaner keeps up (highwater_log_cleaner_max_dirty_ratio keeps rising).",
)
@click.option(
    "--log-cleaner-cpu-share-under-pressure",
    type=click.FloatRange(0, 1),
    default=limits.LOG_CLEANER_CPU_SHARE_UNDER_PRESSURE_DEFAULT,
    show_default=True,
    help="The cleaner's share of one core while the machine's CPUs are contended (Linux's "
    "/proc/pressure/cpu: tasks waited for a CPU over 10% of the last 10 s); it takes back "
    "--log-cleaner-cpu-max-share when cycles are spare. Set it equal to the max share to "
    "clean at one rate whatever the load.",
)
@kafka_listener_options
@_common
@security_options
def broker_command(
    broker_id: int,
    data_dir: Path,
    rack: str,
    replica_lag_time_max_ms: int,
    log_cache_window_bytes: int,
    kafka_port: int | None,
    replicas_max: int,
    fetch_max_bytes: int,
    log_cleaner_enable: bool,
    log_cleaner_dedupe_buffer_bytes: int,
    log_cleaner_io_max_bytes_per_second: int,
    log_cleaner_backoff_ms: int,
    log_cleaner_cpu_max_share: float,
    log_cleaner_cpu_share_under_pressure: float,
    common: CommonOptions,
    security: Any,
    kafka_limits: Any,
) -> None:
    """Run a broker: stores partition logs, leads and follows partitions.

    Example: highwater broker --broker-id 1 --data-dir /var/lib/highwater/1 --etcd 127.0.0.1:2379
    """
    from services.broker.log_cleaner import CleanerConfig
    from services.broker.server import BrokerConfig, serve

    config = BrokerConfig(
        broker_id=broker_id,
        data_dir=data_dir,
        rack=rack,
        replica_lag_time_max_ms=replica_lag_time_max_ms,
        log_cache_window_bytes=log_cache_window_bytes,
        kafka_port=kafka_port,
        kafka_limits=kafka_limits,
        replicas_max=replicas_max,
        fetch_max_bytes=fetch_max_bytes,
        cleaner=CleanerConfig(
            enable=log_cleaner_enable,
            dedupe_buffer_bytes=log_cleaner_dedupe_buffer_bytes,
            io_max_bytes_per_second=log_cleaner_io_max_bytes_per_second,
            backoff_ms=log_cleaner_backoff_ms,
            cpu_max_share=log_cleaner_cpu_max_share,
            cpu_share_under_pressure=log_cleaner_cpu_share_under_pressure,
        ),
        security=security.for_service(f"broker-{broker_id}"),
        **common.config_fields(),
    )
    _run(serve(config), common)


@click.command("controller", context_settings={"auto_envvar_prefix": "HIGHWATER"})
@click.option(
    "--controller-id",
    type=click.IntRange(0, 2**31 - 1),
    required=True,
    help="Unique id of this controller candidate.",
)
@click.option(
    "--delete-topic-enable/--no-delete-topic-enable",
    default=True,
    show_default=True,
    help="Allow DeleteTopics (Kafka's delete.topic.enable).",
)
@click.option(
    "--auto-leader-rebalance-enable/--no-auto-leader-rebalance-enable",
    default=True,
    show_default=True,
    help="Move leadership back to preferred replicas when a broker's imbalance passes the threshold.",
)
@click.option(
    "--leader-imbalance-check-interval-s", type=click.FloatRange(1), default=300.0, show_default=True
)
@click.option(
    "--leader-imbalance-per-broker-percentage", type=click.IntRange(0, 100), default=10, show_default=True
)
@click.option(
    "--broker-connection-grace-ms",
    type=click.IntRange(limits.BROKER_CONNECTION_GRACE_MS_MIN, limits.BROKER_CONNECTION_GRACE_MS_MAX),
    default=limits.BROKER_CONNECTION_GRACE_MS,
    show_default=True,
    help="A broker whose liveness stream to the controller closed (its process died: connections "
    "reset) and was not reopened within this is handled as failed at once (its lease is revoked) "
    "instead of when its lease expires; must be under --lease-ttl-s. A network blip longer than "
    "this costs a leader move, never data.",
)
@click.option(
    "--controller-connection-grace-ms",
    type=click.IntRange(limits.BROKER_CONNECTION_GRACE_MS_MIN, limits.BROKER_CONNECTION_GRACE_MS_MAX),
    default=limits.CONTROLLER_CONNECTION_GRACE_MS,
    show_default=True,
    help="While standing by: when the active controller's connections reset (its process died) and "
    "it accepts none for this long, revoke its lease and run the election at once instead of when "
    "its lease expires; must be under --lease-ttl-s. A network blip longer than this costs a "
    "controller move, never data.",
)
@_common
@security_options
def controller_command(
    controller_id: int,
    delete_topic_enable: bool,
    auto_leader_rebalance_enable: bool,
    leader_imbalance_check_interval_s: float,
    leader_imbalance_per_broker_percentage: int,
    broker_connection_grace_ms: int,
    controller_connection_grace_ms: int,
    common: CommonOptions,
    security: Any,
) -> None:
    """Run a controller candidate: one wins the election in etcd and manages the cluster.

    Example: highwater controller --controller-id 1 --etcd 127.0.0.1:2379
    """
    from services.controller.server import ControllerConfig, serve

    config = ControllerConfig(
        controller_id=controller_id,
        delete_topic_enable=delete_topic_enable,
        auto_leader_rebalance_enable=auto_leader_rebalance_enable,
        leader_imbalance_check_interval_s=leader_imbalance_check_interval_s,
        leader_imbalance_per_broker_percentage=leader_imbalance_per_broker_percentage,
        broker_connection_grace_ms=broker_connection_grace_ms,
        controller_connection_grace_ms=controller_connection_grace_ms,
        security=security.for_service(f"controller-{controller_id}"),
        **common.config_fields(),
    )
    _run(serve(config), common)


@click.command("gateway", context_settings={"auto_envvar_prefix": "HIGHWATER"})
@click.option(
    "--gateway-id", type=click.IntRange(0, 2**31 - 1), required=True, help="Unique id of this gateway."
)
@_common
@security_options
def gateway_command(gateway_id: int, common: CommonOptions, security: Any) -> None:
    """Run a fetch gateway: the address clients talk to; routes requests to partition leaders.

    Example: highwater gateway --gateway-id 1 --port 9092 --etcd 127.0.0.1:2379
    """
    from services.gateway.server import GatewayConfig, serve

    config = GatewayConfig(
        gateway_id=gateway_id,
        security=security.for_service(f"gateway-{gateway_id}"),
        **common.config_fields(),
    )
    _run(serve(config), common)


SERVICE_COMMANDS: list[click.Command] = [controller_command, broker_command, gateway_command]
