"""The security flags every service command takes (`highwater broker|controller|gateway`).

`@security_options` adds the flags and hands the command one `security:
SecurityConfig` argument instead of ten loose values. Like every service flag,
each can also be given as an environment variable (HIGHWATER_TLS_DIR for
--tls-dir, ...), because the commands use auto_envvar_prefix="HIGHWATER".
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from services.security.authz import AclError, parse_super_users
from services.security.config import AUTHORIZERS, SecurityConfig


def _super_users(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    try:
        return parse_super_users(value or "")
    except AclError as exc:
        raise click.BadParameter(str(exc)) from exc


def _limit_option(*param_decls: str, help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A limit or quota flag: a count >= 0, where 0 (the default) leaves it off (or at its default)."""
    return click.option(*param_decls, type=click.IntRange(0), default=0, help=help_text)


OPTIONS: list[Callable[[Callable[..., Any]], Callable[..., Any]]] = [
    click.option(
        "--tls-dir",
        type=click.Path(path_type=Path, file_okay=False),
        default=None,
        help="Turn on TLS: listeners, peer channels (mutual TLS) and etcd. Holds ca.pem, <name>.pem, "
        "<name>-key.pem, <name> being controller-<id>, broker-<id> or gateway-<id>.",
    ),
    click.option(
        "--client-port",
        type=click.IntRange(0, 65535),
        default=None,
        help="Also listen here with TLS but without client certificates, for bearer-token clients "
        "(0: any free port, written to --ready-file). Needs --tls-dir.",
    ),
    click.option(
        "--authorizer",
        type=click.Choice(AUTHORIZERS),
        default="none",
        show_default=True,
        help="acl: check every request against the ACLs in etcd (`highwater acl`). Needs --tls-dir.",
    ),
    click.option(
        "--super-users",
        default="",
        callback=_super_users,
        metavar="User:A;User:B",
        help="Principals allowed everything, whatever the ACLs say.",
    ),
    _limit_option(
        "--max-request-bytes",
        help_text="Refuse requests larger than this (RESOURCE_EXHAUSTED). 0: the 64 MiB default.",
    ),
    _limit_option(
        "--max-batch-records",
        help_text="Refuse produce batches holding more records than this (per partition). 0: no limit.",
    ),
    _limit_option(
        "--producer-byte-rate",
        help_text="Per-principal produce quota in bytes/s; over it, responses carry throttle_time_ms. "
        "0: unlimited. Needs --tls-dir.",
    ),
    _limit_option(
        "--consumer-byte-rate",
        help_text="Per-principal fetch quota in bytes/s. 0: unlimited. Needs --tls-dir.",
    ),
    _limit_option(
        "--max-concurrent-requests-per-connection",
        "max_requests_per_connection",
        help_text="Requests one connection may have in progress at once; more wait for a slot "
        "(a bounded queue, then RESOURCE_EXHAUSTED). 0: no limit.",
    ),
]
_NAMES = (
    "tls_dir",
    "client_port",
    "authorizer",
    "super_users",
    "max_request_bytes",
    "max_batch_records",
    "producer_byte_rate",
    "consumer_byte_rate",
    "max_requests_per_connection",
)


def security_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add the security flags to a service command; it receives them as `security=SecurityConfig(...)`."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in _NAMES}
        return f(*args, security=SecurityConfig(**values), **kwargs)

    for option in reversed(OPTIONS):
        wrapper = option(wrapper)
    return wrapper
