"""SecurityConfig: the security flags of one service process, and the checks between them.

Every field defaults to off; a service built without any of them behaves
exactly as before this layer existed (no interceptor, plaintext listeners,
plaintext etcd). Relations are checked at start-up (`check`) and stop the
process with a message saying which flag is missing:

- authorization, quotas and the token listener need authenticated callers,
  so they need --tls-dir;
- with --tls-dir the process name must be a service identity (identity.py),
  because that is the certificate it presents to peers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clients.common.errors import check
from services.common import limits
from services.security.authz import AclError, check_principal
from services.security.identity import parse_service_name
from services.security.tokens import TOKEN_CHARS_MAX

if TYPE_CHECKING:  # imported when used: `highwater --help` should not load grpc and etcd3aio
    from coordinator.store import EtcdTls
    from services.security.tls import TlsMaterial

AUTHORIZERS = ("none", "acl")
# What gRPC's own request headers (:path, :authority, content-type, te, user-agent, grpc-timeout)
# count against grpc.max_metadata_size, generously (HPACK counts name + value + 32 bytes an entry).
GRPC_STANDARD_HEADERS_BYTES_MAX = 1024
# `authorization: Bearer <token>` as HPACK counts it.
TOKEN_HEADER_BYTES_MAX = len("authorization") + len("Bearer ") + TOKEN_CHARS_MAX + 32


class SecurityConfigError(SystemExit):
    """Flags that do not work together; stops the process at start-up."""


@dataclass(frozen=True)
class SecurityConfig:
    """One service's security settings (all off by default). See docs/SECURITY.md."""

    tls_dir: Path | None = None
    # This process's identity and certificate file stem: controller-1, broker-2, gateway-1.
    name: str = ""
    # An extra TLS listener without client certificates, for bearer-token clients.
    client_port: int | None = None
    authorizer: str = "none"
    super_users: tuple[str, ...] = ()
    # gRPC's receive bound for one request (0: the services' default, GRPC_MAX_MESSAGE_BYTES).
    max_request_bytes: int = 0
    # Records in one produce batch (0: no bound beyond the batch's byte size).
    max_batch_records: int = 0
    # Per-principal byte rates (0: unlimited); Kafka's producer_byte_rate / consumer_byte_rate.
    producer_byte_rate: int = 0
    consumer_byte_rate: int = 0
    # Requests one connection may have in progress at once; more wait for a slot (0: no bound).
    max_requests_per_connection: int = 0

    @property
    def tls(self) -> bool:
        return self.tls_dir is not None

    @property
    def acl(self) -> bool:
        return self.authorizer == "acl"

    @property
    def quotas(self) -> bool:
        return self.producer_byte_rate > 0 or self.consumer_byte_rate > 0

    @property
    def needs_interceptor(self) -> bool:
        """Whether requests pass through the security interceptor at all."""
        return (
            self.tls
            or self.acl
            or self.quotas
            or self.max_batch_records > 0
            or self.max_requests_per_connection > 0
        )

    @property
    def active(self) -> bool:
        return self.needs_interceptor or self.max_request_bytes > 0

    def for_service(self, name: str) -> SecurityConfig:
        return dataclasses.replace(self, name=name)

    def check(self) -> None:
        """Raise SecurityConfigError naming the flags that do not fit together."""
        if self.authorizer not in AUTHORIZERS:
            raise SecurityConfigError(
                f"--authorizer must be one of {', '.join(AUTHORIZERS)}, got {self.authorizer!r}"
            )
        needs_tls = [
            flag
            for flag, on in (
                ("--authorizer acl", self.acl),
                ("--client-port", self.client_port is not None),
                ("--producer-byte-rate/--consumer-byte-rate", self.quotas),
                ("--super-users", bool(self.super_users)),
            )
            if on
        ]
        if needs_tls and not self.tls:
            raise SecurityConfigError(
                f"{', '.join(needs_tls)} need authenticated callers: add --tls-dir (see docs/SECURITY.md)"
            )
        if self.tls and parse_service_name(self.name) is None:
            raise SecurityConfigError(
                f"TLS identity {self.name!r} is not a service name "
                "(controller-<id>, broker-<id>, gateway-<id>)"
            )
        for user in self.super_users:
            try:
                check_principal(user)
            except AclError as exc:
                raise SecurityConfigError(f"--super-users: {exc}") from exc
        if (
            self.max_request_bytes
            and not limits.MAX_REQUEST_BYTES_MIN <= self.max_request_bytes <= limits.GRPC_MAX_MESSAGE_BYTES
        ):
            raise SecurityConfigError(
                f"--max-request-bytes must be within [{limits.MAX_REQUEST_BYTES_MIN}, "
                f"{limits.GRPC_MAX_MESSAGE_BYTES}], got {self.max_request_bytes}"
            )
        if not 0 <= self.max_batch_records <= limits.MAX_BATCH_RECORDS_MAX:
            raise SecurityConfigError(
                f"--max-batch-records must be within [0, {limits.MAX_BATCH_RECORDS_MAX}]"
            )
        if not 0 <= self.max_requests_per_connection <= limits.REQUESTS_PER_CONNECTION_MAX:
            raise SecurityConfigError(
                "--max-concurrent-requests-per-connection must be within "
                f"[0, {limits.REQUESTS_PER_CONNECTION_MAX}]"
            )
        if self.client_port is not None:
            # The token listener's header bound must let a bearer token through with gRPC's own headers.
            check(
                limits.TOKEN_LISTENER_METADATA_BYTES_MAX
                >= GRPC_STANDARD_HEADERS_BYTES_MAX + TOKEN_HEADER_BYTES_MAX,
                "token listener: a %s-byte header bound cannot carry a bearer token (%s bytes) and gRPC's "
                "own headers (%s bytes)",
                limits.TOKEN_LISTENER_METADATA_BYTES_MAX,
                TOKEN_HEADER_BYTES_MAX,
                GRPC_STANDARD_HEADERS_BYTES_MAX,
            )

    def tls_material(self) -> TlsMaterial | None:
        """The process's certificate files, read now (None without --tls-dir). Raises TlsConfigError."""
        if self.tls_dir is None:
            return None
        from services.security.tls import TlsMaterial

        return TlsMaterial.load(self.tls_dir, self.name)

    def etcd_tls(self) -> EtcdTls | None:
        """TLS settings for EtcdStore.connect: mutual TLS with this process's certificate.

        Checks the flags first, so a bad combination is reported before any file is read."""
        self.check()
        material = self.tls_material()
        return material.etcd_tls() if material is not None else None
