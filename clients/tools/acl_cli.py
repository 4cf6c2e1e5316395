"""`highwater acl|token`: manage ACLs and client tokens through the controller.

The acl and token commands call the controller's admin RPCs (CreateAcls,
DeleteAcls, DescribeAcls, CreateToken, RevokeToken, ListTokens) through a
gateway (--bootstrap on the root command), like the topic commands: the
caller needs Alter on the Cluster to change ACLs or tokens and Describe on
it to list them, or to be a super user (--super-users on the services). No
etcd access is involved: an operator needs a client certificate of the
cluster CA (or a token), never an etcd client certificate. With --tls-dir
and neither --tls-name nor --token, the certificate DIR/admin.pem is used
(what `cluster up --tls` makes for its super user).

Bootstrap: with --authorizer acl nobody holds Alter on the Cluster at first;
a super user grants it (`acl add --principal User:ops --operation Alter
--cluster`). See docs/SECURITY.md.

Examples:

    highwater acl add --principal User:alice --operation Write --operation Read --topic orders
    highwater acl add --principal User:etl --operation Read --topic logs- --prefixed
    highwater acl add --principal User:* --operation Read --topic payroll --deny
    highwater token create --principal User:bob --expires-in-s 86400

Certificates are made by `highwater tls init` (services/launcher/tls_cli.py: it writes a CA's
key, which the services' code owns).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from clients.common.acls import AclBinding, AclError, Operation, PatternType, Permission, ResourceType

if TYPE_CHECKING:  # imported when used: `highwater --help` should not load grpc
    from clients.admin import Admin

DEFAULT_ADMIN_NAME = "admin"


def _no_etcd(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value:
        raise click.UsageError(
            "--etcd is gone: `highwater acl` and `highwater token` call the controller through "
            "a gateway now (pass --bootstrap HOST:PORT to `highwater`); no etcd certificate "
            "is needed",
            ctx,
        )


def _legacy_etcd_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """The old --etcd option, hidden: it says what replaced it instead of "no such option"."""
    return click.option("--etcd", hidden=True, expose_value=False, callback=_no_etcd, metavar="HOST:PORT")(f)


def _admin(ctx: click.Context) -> Admin:
    """An Admin client per the root command's --bootstrap, --tls-dir, --tls-name, --token."""
    obj = ctx.find_root().obj
    if obj is None:  # the group invoked on its own (tests): plain defaults
        from clients.config import DEFAULT_BOOTSTRAP, REQUEST_TIMEOUT_MS_DEFAULT
        from clients.tools.cli import CliContext

        obj = CliContext(bootstrap=DEFAULT_BOOTSTRAP, output="table", timeout_ms=REQUEST_TIMEOUT_MS_DEFAULT)
    if obj.tls_dir and not obj.tls_name and not obj.token:
        obj.tls_name = DEFAULT_ADMIN_NAME
    if obj.tls_dir and obj.tls_name and not (Path(obj.tls_dir) / f"{obj.tls_name}.pem").exists():
        raise click.ClickException(
            f"no client certificate {Path(obj.tls_dir) / obj.tls_name}.pem: pass "
            "--tls-name NAME (a certificate of the cluster CA) or --token"
        )
    admin: Admin = obj.admin()
    return admin


# --- acl ---------------------------------------------------------------------------------------


@click.group("acl")
def acl_group() -> None:
    """Add, remove and list ACLs (Kafka's kafka-acls), through the controller.

    An ACL allows or denies a principal an operation on a topic, group or the
    cluster. Deny wins over allow; without any matching allow, access is refused.
    Services enforce ACLs only when started with --authorizer acl. Adding and
    removing need Alter on the cluster, listing Describe on it (or a super user).

    \b
    Examples:
      highwater acl add --principal User:alice --operation Write --topic orders
      highwater acl add --principal User:etl --operation Read --topic logs- --prefixed
      highwater acl add --principal User:etl --operation Read --group etl
      highwater acl add --principal User:ops --operation Alter --cluster    # delegate ACL management
      highwater acl list --principal User:alice
    """


def _binding_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options that name ACLs (--principal ... --deny); the command gets them as `bindings`,
    every principal x operation x resource given (see _bindings)."""

    @functools.wraps(f)
    def command(**given: Any) -> Any:
        return f(bindings=_bindings(**given))

    options = [
        click.option(
            "--principal",
            "principals",
            multiple=True,
            required=True,
            metavar="User:NAME",
            help="Whom the ACL is for (User:* for everyone); repeatable.",
        ),
        click.option(
            "--operation",
            "operations",
            multiple=True,
            required=True,
            type=click.Choice([o.value for o in Operation], case_sensitive=False),
            help="Repeatable.",
        ),
        click.option(
            "--topic", "topics", multiple=True, metavar="NAME", help="Topic name (or * for all); repeatable."
        ),
        click.option("--group", "groups", multiple=True, metavar="NAME", help="Consumer group; repeatable."),
        click.option("--cluster", is_flag=True, help="The cluster (admin operations, ClusterAction)."),
        click.option(
            "--prefixed", is_flag=True, help="Names are prefixes: they match every name starting so."
        ),
        click.option("--deny", is_flag=True, help="A deny ACL (default: allow). Deny wins."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _bindings(
    principals: tuple[str, ...],
    operations: tuple[str, ...],
    topics: tuple[str, ...],
    groups: tuple[str, ...],
    cluster: bool,
    prefixed: bool,
    deny: bool,
) -> list[AclBinding]:
    resources = (
        [(ResourceType.TOPIC, t) for t in topics]
        + [(ResourceType.GROUP, g) for g in groups]
        + ([(ResourceType.CLUSTER, "")] if cluster else [])
    )
    if not resources:
        raise click.UsageError("name a resource: --topic, --group or --cluster")
    try:
        return [
            AclBinding.of(
                p,
                op,
                rtype,
                name or "-",
                permission=Permission.DENY if deny else Permission.ALLOW,
                pattern_type=PatternType.PREFIXED if prefixed else PatternType.LITERAL,
            )
            for p in principals
            for op in operations
            for rtype, name in resources
        ]
    except AclError as exc:
        raise click.BadParameter(str(exc)) from None


@acl_group.command("add")
@_binding_options
@_legacy_etcd_option
@click.pass_context
def acl_add(ctx: click.Context, bindings: list[AclBinding]) -> None:
    """Add ACLs: every principal x operation x resource given.

    Example: highwater acl add --principal User:alice --operation Read --operation Write --topic orders
    """
    with _admin(ctx) as admin:
        outcome = admin.create_acls(bindings)
    for b in bindings:
        click.echo(b.describe())
    added = sum(outcome.values())
    click.echo(f"{added} added, {len(outcome) - added} already present")


@acl_group.command("remove")
@_binding_options
@_legacy_etcd_option
@click.pass_context
def acl_remove(ctx: click.Context, bindings: list[AclBinding]) -> None:
    """Remove ACLs (the same arguments as add).

    Example: highwater acl remove --principal User:alice --operation Write --topic orders
    """
    with _admin(ctx) as admin:
        outcome = admin.delete_acls(bindings)
    removed = sum(outcome.values())
    click.echo(f"{removed} removed, {len(outcome) - removed} were not present")


@acl_group.command("list")
@click.option(
    "--principal", default=None, metavar="User:NAME", help="Only ACLs of this principal (and of User:*)."
)
@click.option("--topic", default=None, metavar="NAME", help="Only ACLs whose pattern matches this topic.")
@click.option("--group", default=None, metavar="NAME", help="Only ACLs whose pattern matches this group.")
@click.option("--cluster", is_flag=True, help="Only ACLs on the cluster.")
@click.option(
    "--output",
    "-o",
    type=click.Choice(["table", "json"]),
    default=None,
    help="table or json (default: the root command's --output).",
)
@_legacy_etcd_option
@click.pass_context
def acl_list(
    ctx: click.Context,
    principal: str | None,
    topic: str | None,
    group: str | None,
    cluster: bool,
    output: str | None,
) -> None:
    """List ACLs, optionally only those of a principal or matching a topic, a group or the cluster.

    Example: highwater acl list --topic orders
    """
    resources = [
        (t, n)
        for t, n in (("Topic", topic), ("Group", group), ("Cluster", "" if cluster else None))
        if n is not None
    ]
    if len(resources) > 1:
        raise click.UsageError("give at most one of --topic, --group, --cluster")
    resource_type, resource_name = resources[0] if resources else (None, None)
    with _admin(ctx) as admin:
        rows = admin.describe_acls(principal, resource_type, resource_name)
    root = ctx.find_root().obj
    if (output or getattr(root, "output", "table")) == "json":
        click.echo(json.dumps([b.to_dict() for b in rows], indent=2))
        return
    table = Table(title=f"{len(rows)} ACLs", title_justify="left")
    for col in ("principal", "permission", "operation", "resource", "pattern"):
        table.add_column(col)
    for b in rows:
        table.add_row(
            escape(b.principal),
            b.permission.value,
            b.operation.value,
            escape(f"{b.resource_type.value}:{b.resource_name}"),
            b.pattern_type.value,
        )
    Console(highlight=False, soft_wrap=True).print(table)


# --- token -------------------------------------------------------------------------------------


@click.group("token")
def token_group() -> None:
    """Create, revoke and list bearer tokens for clients without certificates, through the controller.

    Gateways and brokers accept a token on their TLS listeners (including the
    --client-port one, which needs no client certificate). Only a salted hash
    is stored; the token is shown once, at creation. Creating and revoking
    need Alter on the cluster, listing Describe on it (or a super user).

    \b
    Examples:
      highwater token create --principal User:bob --expires-in-s 86400
      HIGHWATER_TOKEN=hwt... highwater --tls-dir tls -b 127.0.0.1:9093 topic list
      highwater token revoke 3f2a9c0d1e4b5a69
    """


@token_group.command("create")
@click.option("--principal", required=True, metavar="User:NAME", help="Whom the token authenticates.")
@click.option(
    "--expires-in-s",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Lifetime in seconds (0: until revoked).",
)
@click.option("--description", default="", help="A note stored with the token.")
@_legacy_etcd_option
@click.pass_context
def token_create(ctx: click.Context, principal: str, expires_in_s: int, description: str) -> None:
    """Create a token and print it (once: it cannot be shown again).

    Example: highwater token create --principal User:bob --expires-in-s 3600
    """
    from clients.common.acls import check_principal
    from clients.common.tokens import TOKEN_LIFETIME_MS_MAX

    try:
        check_principal(principal)
    except AclError as exc:
        raise click.BadParameter(str(exc), param_hint="--principal") from None
    if expires_in_s * 1000 > TOKEN_LIFETIME_MS_MAX:
        raise click.BadParameter(f"at most {TOKEN_LIFETIME_MS_MAX // 1000} s", param_hint="--expires-in-s")
    with _admin(ctx) as admin:
        created = admin.create_token(principal, expires_in_s * 1000, description)
    click.echo(
        f"token id {created.description.token_id} for {principal}"
        + (f", expires in {expires_in_s} s" if expires_in_s else ", never expires"),
        err=True,
    )
    click.echo(created.token)


@token_group.command("revoke")
@click.argument("token_ids", nargs=-1, required=True, metavar="TOKEN_ID...")
@_legacy_etcd_option
@click.pass_context
def token_revoke(ctx: click.Context, token_ids: tuple[str, ...]) -> None:
    """Revoke tokens by id (the part between the dots of hwt.<id>.<secret>, or the whole token).

    Example: highwater token revoke 3f2a9c0d1e4b5a69
    """
    from clients.common.tokens import token_id_of

    ids = []
    for text in token_ids:
        token_id = token_id_of(text)
        if token_id is None:
            raise click.BadParameter(
                f"{text[:80]!r} is neither a token nor a token id", param_hint="TOKEN_ID"
            )
        ids.append(token_id)
    with _admin(ctx) as admin:
        for token_id in ids:
            click.echo(f"{token_id}: {'revoked' if admin.revoke_token(token_id) else 'no such token'}")


@token_group.command("list")
@_legacy_etcd_option
@click.pass_context
def token_list(ctx: click.Context) -> None:
    """List tokens: id, principal, expiry (never the secrets).

    Example: highwater token list
    """
    with _admin(ctx) as admin:
        tokens = admin.list_tokens()
    now_ms = int(time.time() * 1000)
    table = Table(title=f"{len(tokens)} tokens", title_justify="left")
    for col in ("id", "principal", "expires", "description"):
        table.add_column(col)
    for t in tokens:
        when = (
            "never"
            if not t.expires_ms
            else (
                "expired"
                if t.expires_ms <= now_ms
                else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t.expires_ms / 1000))
            )
        )
        table.add_row(t.token_id, escape(t.principal), when, escape(t.description))
    Console(highlight=False, soft_wrap=True).print(table)


SECURITY_COMMANDS: list[click.Command] = [acl_group, token_group]
