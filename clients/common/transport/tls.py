"""TLS and bearer-token credentials for every gRPC channel a client makes: the client library's
(clients/connection.py, clients/leaders.py), the Spark connector's and the servers' own calls to
one another (services depend on the client library's transport, as Kafka's broker depends on its
clients' common package, never the other way).

Kafka's client names: ssl_cafile (the CA that signed the gateways'
certificates; None uses the system's roots), ssl_certfile / ssl_keyfile (a
client certificate: principal "User:<CN>"), and auth_token (a bearer token
from `highwater token create`, sent as `authorization: Bearer ...` on every
call). gRPC refuses to send call credentials over a plaintext channel, so a
token never travels in the clear.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc


class ClientTlsError(ValueError):
    """A TLS setting cannot be used (file missing, certificate without key)."""


def _read(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ClientTlsError(f"{what} {path}: {exc.strerror}") from exc


@dataclass(frozen=True)
class ClientTls:
    ca_cert: bytes | None
    cert_chain: bytes | None
    private_key: bytes | None
    token: str | None

    @classmethod
    def from_settings(
        cls,
        *,
        ssl_cafile: str | None,
        ssl_certfile: str | None,
        ssl_keyfile: str | None,
        auth_token: str | None,
    ) -> ClientTls | None:
        """None when nothing is set (plaintext, as before); raises ClientTlsError for unusable files."""
        if not (ssl_cafile or ssl_certfile or ssl_keyfile or auth_token):
            return None
        if bool(ssl_certfile) != bool(ssl_keyfile):
            raise ClientTlsError("ssl_certfile and ssl_keyfile go together: give both or neither")
        return cls(
            _read(ssl_cafile, "ssl_cafile") if ssl_cafile else None,
            _read(ssl_certfile, "ssl_certfile") if ssl_certfile else None,
            _read(ssl_keyfile, "ssl_keyfile") if ssl_keyfile else None,
            auth_token or None,
        )

    def credentials(self) -> grpc.ChannelCredentials:
        creds = grpc.ssl_channel_credentials(
            root_certificates=self.ca_cert, private_key=self.private_key, certificate_chain=self.cert_chain
        )
        if self.token:
            creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(self.token))
        return creds

    def aio_channel(self, address: str, options: Sequence[tuple[str, Any]]) -> grpc.aio.Channel:
        return grpc.aio.secure_channel(address, self.credentials(), options=options)

    def channel(self, address: str, options: Sequence[tuple[str, Any]] = ()) -> grpc.Channel:
        """A blocking channel (tests, tools)."""
        return grpc.secure_channel(address, self.credentials(), options=options)


def tls_dir_settings(tls_dir: str | Path, name: str | None = None) -> dict[str, str]:
    """Client settings for a TLS directory laid out as services/security/tls.py describes:
    ca.pem, and <name>.pem / <name>-key.pem when name is given."""
    directory = Path(tls_dir)
    settings = {"ssl_cafile": str(directory / "ca.pem")}
    if name:
        settings["ssl_certfile"] = str(directory / f"{name}.pem")
        settings["ssl_keyfile"] = str(directory / f"{name}-key.pem")
    return settings
