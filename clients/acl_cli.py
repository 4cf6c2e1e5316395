"""`highwater acl|token|tls`: manage ACLs and client tokens in etcd, and make certificates.

Like Kafka's original kafka-acls (which wrote to ZooKeeper), the acl and token
commands talk to etcd directly (--etcd, env HIGHWATER_ETCD): whoever can write
to etcd is the cluster's administrator anyway. With --tls-dir on the root
command, etcd is reached with mutual TLS using the certificate named by
--tls-name (default: admin). Services pick up every change within
milliseconds through their watch.

Examples:

    highwater acl add --principal User:alice --operation Write --operation Read --topic orders
    highwater acl add --principal User:etl --operation Read --topic logs- --prefixed
    highwater acl add --principal User:* --operation Read --topic payroll --deny
    highwater token create --principal User:bob --expires-in-s 86400
    highwater tls init ./tls --name alice
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from services.common.authz import AclBinding, AclError, Operation, PatternType, Permission, ResourceType

T = TypeVar("T")
ETCD_DEFAULT = "127.0.0.1:2379"
DEFAULT_ADMIN_NAME = "admin"


def _etcd_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--etcd-prefix", envvar="HIGHWATER_ETCD_PREFIX", default="/highwater", show_default=True,
                     help="The cluster's key prefix in etcd.")(f)
    return click.option("--etcd", envvar="HIGHWATER_ETCD", default=ETCD_DEFAULT, show_default=True,
                        metavar="HOST:PORT[,HOST:PORT]", help="etcd endpoints (env HIGHWATER_ETCD).")(f)


def _with_store(ctx: click.Context, etcd: str, prefix: str, action: Callable[[Any], Awaitable[T]]) -> T:
    """Run `action(store)` against etcd, TLS per the root command's --tls-dir; errors become one line."""
    from coordinator.store import CoordinatorError, EtcdStore

    tls = None
    obj = ctx.find_root().obj
    tls_dir = getattr(obj, "tls_dir", None)
    if tls_dir:
        from services.security.tls import TlsMaterial

        try:
            tls = TlsMaterial.load(Path(tls_dir), getattr(obj, "tls_name", None) or DEFAULT_ADMIN_NAME).etcd_tls()
        except SystemExit as exc:
            raise click.ClickException(str(exc)) from None

    async def run() -> T:
        store = await EtcdStore.connect(etcd, prefix=prefix, tls=tls)
        try:
            return await action(store)
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except (CoordinatorError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


# --- acl ---------------------------------------------------------------------------------------


@click.group("acl")
def acl_group() -> None:
    """Add, remove and list ACLs (Kafka's kafka-acls).

    An ACL allows or denies a principal an operation on a topic, group or the
    cluster. Deny wins over allow; without any matching allow, access is refused.
    Services enforce ACLs only when started with --authorizer acl.

    \b
    Examples:
      highwater acl add --principal User:alice --operation Write --topic orders
      highwater acl add --principal User:etl --operation Read --topic logs- --prefixed
      highwater acl add --principal User:etl --operation Read --group etl
      highwater acl list --principal User:alice
    """


def _binding_options(f: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--principal", "principals", multiple=True, required=True, metavar="User:NAME",
                     help="Whom the ACL is for (User:* for everyone); repeatable."),
        click.option("--operation", "operations", multiple=True, required=True,
                     type=click.Choice([o.value for o in Operation], case_sensitive=False), help="Repeatable."),
        click.option("--topic", "topics", multiple=True, metavar="NAME", help="Topic name (or * for all); repeatable."),
        click.option("--group", "groups", multiple=True, metavar="NAME", help="Consumer group; repeatable."),
        click.option("--cluster", is_flag=True, help="The cluster (admin operations, ClusterAction)."),
        click.option("--prefixed", is_flag=True, help="Names are prefixes: they match every name starting so."),
        click.option("--deny", is_flag=True, help="A deny ACL (default: allow). Deny wins."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _bindings(principals: tuple[str, ...], operations: tuple[str, ...], topics: tuple[str, ...],
              groups: tuple[str, ...], cluster: bool, prefixed: bool, deny: bool) -> list[AclBinding]:
    resources = ([(ResourceType.TOPIC, t) for t in topics] + [(ResourceType.GROUP, g) for g in groups]
                 + ([(ResourceType.CLUSTER, "")] if cluster else []))
    if not resources:
        raise click.UsageError("name a resource: --topic, --group or --cluster")
    try:
        return [AclBinding.of(p, op, rtype, name or "-", permission=Permission.DENY if deny else Permission.ALLOW,
                              pattern_type=PatternType.PREFIXED if prefixed else PatternType.LITERAL)
                for p in principals for op in operations for rtype, name in resources]
    except AclError as exc:
        raise click.BadParameter(str(exc)) from None


@acl_group.command("add")
@_binding_options
@_etcd_options
@click.pass_context
def acl_add(ctx: click.Context, principals: tuple[str, ...], operations: tuple[str, ...], topics: tuple[str, ...],
            groups: tuple[str, ...], cluster: bool, prefixed: bool, deny: bool, etcd: str, etcd_prefix: str) -> None:
    """Add ACLs: every principal x operation x resource given.

    Example: highwater acl add --principal User:alice --operation Read --operation Write --topic orders
    """
    from coordinator.acls import add_acls

    bindings = _bindings(principals, operations, topics, groups, cluster, prefixed, deny)
    added = _with_store(ctx, etcd, etcd_prefix, lambda store: add_acls(store, [b.to_dict() for b in bindings]))
    for b in bindings:
        click.echo(b.describe())
    click.echo(f"{added} added, {len(bindings) - added} already present")


@acl_group.command("remove")
@_binding_options
@_etcd_options
@click.pass_context
def acl_remove(ctx: click.Context, principals: tuple[str, ...], operations: tuple[str, ...],
               topics: tuple[str, ...], groups: tuple[str, ...], cluster: bool, prefixed: bool, deny: bool,
               etcd: str, etcd_prefix: str) -> None:
    """Remove ACLs (the same arguments as add).

    Example: highwater acl remove --principal User:alice --operation Write --topic orders
    """
    from coordinator.acls import remove_acls

    bindings = _bindings(principals, operations, topics, groups, cluster, prefixed, deny)
    removed = _with_store(ctx, etcd, etcd_prefix, lambda store: remove_acls(store, [b.to_dict() for b in bindings]))
    click.echo(f"{removed} removed, {len(bindings) - removed} were not present")


@acl_group.command("list")
@click.option("--principal", default=None, metavar="User:NAME", help="Only ACLs of this principal.")
@click.option("--topic", default=None, metavar="NAME", help="Only ACLs whose pattern matches this topic.")
@click.option("--group", default=None, metavar="NAME", help="Only ACLs whose pattern matches this group.")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
@_etcd_options
@click.pass_context
def acl_list(ctx: click.Context, principal: str | None, topic: str | None, group: str | None, output: str,
             etcd: str, etcd_prefix: str) -> None:
    """List ACLs, optionally only those of a principal or matching a topic or group.

    Example: highwater acl list --topic orders
    """
    from coordinator.acls import list_acls
    from services.common.authz import Resource

    rows = []
    for data in _with_store(ctx, etcd, etcd_prefix, list_acls):
        try:
            b = AclBinding.from_dict(data)
        except AclError:
            continue
        if principal and b.principal not in (principal, "User:*"):
            continue
        if topic is not None and not b.matches_resource(Resource(ResourceType.TOPIC, topic)):
            continue
        if group is not None and not b.matches_resource(Resource(ResourceType.GROUP, group)):
            continue
        rows.append(b)
    rows.sort(key=lambda b: (b.resource_type.value, b.resource_name, b.principal, b.operation.value))
    if output == "json":
        click.echo(json.dumps([b.to_dict() for b in rows], indent=2))
        return
    table = Table(title=f"{len(rows)} ACLs", title_justify="left")
    for col in ("principal", "permission", "operation", "resource", "pattern"):
        table.add_column(col)
    for b in rows:
        table.add_row(escape(b.principal), b.permission.value, b.operation.value,
                      escape(f"{b.resource_type.value}:{b.resource_name}"), b.pattern_type.value)
    Console(highlight=False, soft_wrap=True).print(table)


# --- token -------------------------------------------------------------------------------------


@click.group("token")
def token_group() -> None:
    """Create, revoke and list bearer tokens for clients without certificates.

    Gateways and brokers accept a token on their TLS listeners (including the
    --client-port one, which needs no client certificate). Only a salted hash
    is stored; the token is shown once, at creation.

    \b
    Examples:
      highwater token create --principal User:bob --expires-in-s 86400
      HIGHWATER_TOKEN=hwt... highwater --tls-dir tls -b 127.0.0.1:9093 topic list
      highwater token revoke 3f2a9c0d1e4b5a69
    """


@token_group.command("create")
@click.option("--principal", required=True, metavar="User:NAME", help="Whom the token authenticates.")
@click.option("--expires-in-s", type=click.IntRange(0), default=0, show_default=True,
              help="Lifetime in seconds (0: until revoked).")
@click.option("--description", default="", help="A note stored with the token.")
@_etcd_options
@click.pass_context
def token_create(ctx: click.Context, principal: str, expires_in_s: int, description: str, etcd: str,
                 etcd_prefix: str) -> None:
    """Create a token and print it (once: it cannot be shown again).

    Example: highwater token create --principal User:bob --expires-in-s 3600
    """
    from coordinator.acls import put_token
    from services.security.tokens import TokenError, new_token

    try:
        text, token_id, record = new_token(principal, now_ms=int(time.time() * 1000),
                                           expires_in_ms=expires_in_s * 1000, description=description)
    except (TokenError, AclError) as exc:
        raise click.BadParameter(str(exc), param_hint="--principal") from None
    _with_store(ctx, etcd, etcd_prefix, lambda store: put_token(store, token_id, record.to_dict()))
    click.echo(f"token id {token_id} for {principal}" +
               (f", expires in {expires_in_s} s" if expires_in_s else ", never expires"), err=True)
    click.echo(text)


@token_group.command("revoke")
@click.argument("token_ids", nargs=-1, required=True, metavar="TOKEN_ID...")
@_etcd_options
@click.pass_context
def token_revoke(ctx: click.Context, token_ids: tuple[str, ...], etcd: str, etcd_prefix: str) -> None:
    """Revoke tokens by id (the part between the dots of hwt.<id>.<secret>, or the whole token).

    Example: highwater token revoke 3f2a9c0d1e4b5a69
    """
    from coordinator.acls import delete_token
    from services.security.tokens import parse_token

    ids = [(parse_token(t) or (t, ""))[0] for t in token_ids]

    async def revoke(store: Any) -> list[bool]:
        return [await delete_token(store, i) for i in ids]

    for token_id, existed in zip(ids, _with_store(ctx, etcd, etcd_prefix, revoke), strict=True):
        click.echo(f"{token_id}: {'revoked' if existed else 'no such token'}")


@token_group.command("list")
@_etcd_options
@click.pass_context
def token_list(ctx: click.Context, etcd: str, etcd_prefix: str) -> None:
    """List tokens: id, principal, expiry (never the secrets).

    Example: highwater token list
    """
    from coordinator.acls import list_tokens

    tokens = _with_store(ctx, etcd, etcd_prefix, list_tokens)
    now_ms = int(time.time() * 1000)
    table = Table(title=f"{len(tokens)} tokens", title_justify="left")
    for col in ("id", "principal", "expires", "description"):
        table.add_column(col)
    for token_id, rec in sorted(tokens.items()):
        expires = int(rec.get("expires_ms", 0) or 0)
        when = "never" if not expires else ("expired" if expires <= now_ms else
                                            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(expires / 1000)))
        table.add_row(token_id, escape(str(rec.get("principal"))), when, escape(str(rec.get("description", ""))))
    Console(highlight=False, soft_wrap=True).print(table)


# --- tls ---------------------------------------------------------------------------------------


@click.group("tls")
def tls_group() -> None:
    """Make a local certificate authority and certificates (for development and tests).

    \b
    Examples:
      highwater tls init ./tls --name etcd --name controller-1 --name broker-1 --name gateway-1 --name admin \\
          --etcd-client etcd --etcd-client controller-1 --etcd-client broker-1 --etcd-client gateway-1 \\
          --etcd-client admin
      highwater tls init ./tls --name alice          # a client: reaches the services, never etcd
      highwater tls init ./tls --name broker-2 --host broker-2.internal --etcd-client broker-2
    """


@tls_group.command("init")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option("--name", "names", multiple=True, metavar="NAME",
              help="A certificate to make (CN = NAME): controller-<id>, broker-<id>, gateway-<id>, etcd, or a "
                   "client name. Repeatable; existing ones are kept.")
@click.option("--host", "hosts", multiple=True, metavar="HOST",
              help="Extra DNS name or IP address for every certificate made (besides NAME, localhost, 127.0.0.1).")
@click.option("--etcd-client", "etcd_clients", multiple=True, metavar="NAME",
              help="An etcd client certificate to make, from the separate etcd client CA (made if missing): only "
                   "the services, etcd's own health probe (etcd) and operators who run `highwater acl|token`. "
                   "Repeatable.")
def tls_init(directory: Path, names: tuple[str, ...], hosts: tuple[str, ...], etcd_clients: tuple[str, ...]
             ) -> None:
    """Create DIRECTORY/ca.pem (if missing) and DIRECTORY/NAME.pem + NAME-key.pem for each name,
    and DIRECTORY/etcd-client-ca.pem with NAME.etcd-client.pem for each --etcd-client.

    etcd must trust etcd-client-ca.pem (its --trusted-ca-file), never ca.pem: a certificate of
    the cluster CA is then no key to etcd.

    \b
    Example:
      highwater tls init ./tls --name broker-1 --etcd-client broker-1
    """
    from services.security.certs import ensure_local_pki

    ensure_local_pki(directory, names, hosts=hosts, etcd_clients=etcd_clients)
    click.echo(f"CA and {len(names)} certificates in {directory}"
               + (f"; etcd client CA and {len(etcd_clients)} etcd client certificates" if etcd_clients else ""))


SECURITY_COMMANDS: list[click.Command] = [acl_group, token_group, tls_group]
