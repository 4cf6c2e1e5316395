"""The Kafka listener's client bounds as `highwater broker` flags (`@kafka_listener_options`).

The command receives them as one `kafka_limits: KafkaListenerLimits` argument. Like every
service flag, each is also read from an environment variable (HIGHWATER_KAFKA_CONNECTIONS_PER_IP_MAX
for --kafka-connections-per-ip-max, ...), as the commands use auto_envvar_prefix="HIGHWATER".
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from services.common import limits
from services.kafka.listener_limits import KafkaListenerLimits, parse_connection_overrides


def _overrides(ctx: click.Context, param: click.Parameter, value: str | None) -> dict[str, int]:
    try:
        return parse_connection_overrides(value or "")
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


OPTIONS: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    click.option(
        "--kafka-connections-per-ip-max",
        type=click.IntRange(0),
        default=limits.KAFKA_CONNECTIONS_PER_IP_MAX,
        show_default=True,
        show_envvar=True,
        help="Kafka connections one client address may have open at once; one more is closed as "
        f"soon as it is accepted, so one client cannot take all {limits.KAFKA_CONNECTIONS_MAX} of the "
        "broker's (Kafka's max.connections.per.ip).",
    ),
    click.option(
        "--kafka-connections-per-ip-overrides",
        default="",
        callback=_overrides,
        show_envvar=True,
        help="Per-address bounds instead of --kafka-connections-per-ip-max, as address:count[,...], "
        "e.g. 127.0.0.2:500,10.0.0.7:0 (Kafka's max.connections.per.ip.overrides).",
    ),
    click.option(
        "--kafka-request-body-timeout-ms",
        type=click.IntRange(1),
        default=limits.KAFKA_REQUEST_BODY_TIMEOUT_MS,
        show_default=True,
        show_envvar=True,
        help="Once a Kafka request's size is read, its whole body must arrive within this, or the "
        "connection is closed: a client that announces a large request and stalls holds no buffer.",
    ),
    click.option(
        "--kafka-partial-frame-bytes-max",
        type=click.IntRange(1),
        default=limits.KAFKA_PARTIAL_FRAME_BYTES_MAX,
        show_default=True,
        show_envvar=True,
        help="Bytes of Kafka requests being read at once, over all connections; the connection whose "
        "request would pass it is closed. At least the largest request (--max-request-bytes).",
    ),
]
_NAMES = (
    "connections_per_ip_max",
    "connections_per_ip_overrides",
    "request_body_timeout_ms",
    "partial_frame_bytes_max",
)


def kafka_listener_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add the flags to a command; it receives them as `kafka_limits=KafkaListenerLimits(...)`."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(f"kafka_{name}") for name in _NAMES}
        return f(*args, kafka_limits=KafkaListenerLimits(**values), **kwargs)

    for option in reversed(OPTIONS):
        wrapper = option(wrapper)
    return wrapper
