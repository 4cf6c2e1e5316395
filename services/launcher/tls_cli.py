"""`highwater tls init`: a local certificate authority and certificates, for development and tests.

It lives with the launcher, above the client library: it writes the CAs' keys through the
services' own PKI code (services/security/certs.py), which the client tools never import.
`cluster up --tls` makes the same files through the same function. See docs/SECURITY.md.

Example:

    highwater tls init ./tls --name alice
"""

from __future__ import annotations

from pathlib import Path

import click


@click.group("tls")
def tls_group() -> None:
    """Make a local certificate authority and certificates (for development and tests).

    \b
    Examples:
      highwater tls init ./tls --name etcd --name controller-1 --name broker-1 --name gateway-1 --name admin \\
          --etcd-client etcd --etcd-client controller-1 --etcd-client broker-1 --etcd-client gateway-1
      highwater tls init ./tls --name alice          # a client or operator: reaches the services, never etcd
      highwater tls init ./tls --name broker-2 --host broker-2.internal --etcd-client broker-2
    """  # noqa: E501 (help text: click prints the example lines as they are)


@tls_group.command("init")
@click.argument("directory", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--name",
    "names",
    multiple=True,
    metavar="NAME",
    help="A certificate to make (CN = NAME): controller-<id>, broker-<id>, gateway-<id>, etcd, or a "
    "client name. Repeatable; existing ones are kept.",
)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    metavar="HOST",
    help="Extra DNS name or IP address for every certificate made (besides NAME, localhost, 127.0.0.1).",
)
@click.option(
    "--etcd-client",
    "etcd_clients",
    multiple=True,
    metavar="NAME",
    help="An etcd client certificate to make, from the separate etcd client CA (made if missing): only "
    "the services and etcd's own health probe (etcd); operators need none (`highwater acl|token` "
    "go through the controller). Repeatable.",
)
def tls_init(
    directory: Path, names: tuple[str, ...], hosts: tuple[str, ...], etcd_clients: tuple[str, ...]
) -> None:
    """Create DIRECTORY/ca.pem (if missing) and DIRECTORY/NAME.pem + NAME-key.pem for each name,
    and DIRECTORY/etcd-client-ca.pem with NAME.etcd-client.pem for each --etcd-client.

    etcd must trust etcd-client-ca.pem (its --trusted-ca-file), never ca.pem: a certificate of
    the cluster CA is then no key to etcd.

    \b
    Example:
      highwater tls init ./tls --name broker-1 --etcd-client broker-1
    """
    # Imported here: `highwater --help` and the client commands should not load `cryptography`.
    from services.security.certs import ensure_local_pki

    ensure_local_pki(directory, names, hosts=hosts, etcd_clients=etcd_clients)
    click.echo(
        f"CA and {len(names)} certificates in {directory}"
        + (f"; etcd client CA and {len(etcd_clients)} etcd client certificates" if etcd_clients else "")
    )
