"""ServiceSecurity: the security layer of one running service, as serve() and ServiceRuntime use it.

    store = await EtcdStore.connect(..., tls=config.security.etcd_tls())
    security = await ServiceSecurity.start(config.security, store)
    runtime = ServiceRuntime(..., security=security)   # interceptor, TLS listeners, limits
    ...
    await security.close()

With every flag off, `start` returns an inactive object that changes nothing:
ServiceRuntime builds the same plaintext server as before.

Listeners with --tls-dir: the service port (`--port`, the one registered in
etcd and used by peers) is mutual TLS; `--client-port` adds a TLS listener
without client certificates for bearer-token clients (gRPC Python cannot make
a client certificate optional on one port). Both run the same servicers
behind the same interceptor.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc

from coordinator.store import MetadataStore
from services.common.quotas import QuotaManager
from services.security import channels, rules
from services.security.cache import SecurityCache
from services.security.config import SecurityConfig
from services.security.identity import parse_service_name
from services.security.interceptor import ConnectionLimiter, ForwardPrincipal, SecurityInterceptor
from services.security.tls import TlsMaterial

log = logging.getLogger("highwater.security")


class ServiceSecurity:
    """TLS material, the ACL/token cache and the interceptor of one service process."""

    def __init__(self, config: SecurityConfig, tls: TlsMaterial | None, cache: SecurityCache | None,
                 interceptor: SecurityInterceptor | None) -> None:
        self.config = config
        self.tls = tls
        self.cache = cache
        self.interceptor = interceptor
        self.bound_client_port = 0

    @property
    def active(self) -> bool:
        return self.config.active

    @classmethod
    async def start(cls, config: SecurityConfig, store: MetadataStore) -> ServiceSecurity:
        """Check the flags, read certificates, load ACLs and tokens. Raises SystemExit on bad settings."""
        config.check()
        if not config.active:
            return cls(config, None, None, None)
        tls = config.tls_material()
        cache = None
        if tls is not None:
            cache = SecurityCache(store, super_users=config.super_users)
            await cache.start()
            identity = parse_service_name(config.name)
            forward = [ForwardPrincipal()] if identity is not None and identity.kind == "gateway" else []
            channels.configure(tls.channel_credentials(), forward)
        quotas = None
        if config.quotas:
            quotas = QuotaManager(produce_bytes_per_s=config.producer_byte_rate,
                                  fetch_bytes_per_s=config.consumer_byte_rate)
        interceptor = None
        if config.needs_interceptor:
            interceptor = SecurityInterceptor(tls=tls is not None, cache=cache, acl=config.acl,
                                              limits=rules.Limits(max_batch_records=config.max_batch_records),
                                              quotas=quotas,
                                              connections=ConnectionLimiter(config.max_requests_per_connection)
                                              if config.max_requests_per_connection else None)
        log.info("security: tls=%s authorizer=%s super_users=%s quotas(produce=%d B/s, fetch=%d B/s) "
                 "max_request_bytes=%d max_batch_records=%d max_requests_per_connection=%d client_port=%s",
                 tls is not None, config.authorizer, ",".join(config.super_users) or "-",
                 config.producer_byte_rate, config.consumer_byte_rate, config.max_request_bytes,
                 config.max_batch_records, config.max_requests_per_connection, config.client_port)
        return cls(config, tls, cache, interceptor)

    def server_kwargs(self, options: list[tuple[str, Any]]) -> dict[str, Any]:
        """Keyword arguments for grpc.aio.server: the options with our limits, and the interceptor."""
        if not self.active:
            return {"options": options}
        merged = dict(options)
        if self.config.max_request_bytes:
            merged["grpc.max_receive_message_length"] = self.config.max_request_bytes
        kwargs: dict[str, Any] = {"options": list(merged.items())}
        if self.interceptor is not None:
            kwargs["interceptors"] = [self.interceptor]
        return kwargs

    def bind(self, server: grpc.aio.Server, host: str, port: int) -> int:
        """Add the listeners; returns the service port (0 if it could not be bound)."""
        if self.tls is None:
            return server.add_insecure_port(f"{host}:{port}")
        bound = server.add_secure_port(f"{host}:{port}", self.tls.server_credentials(require_client_cert=True))
        if bound and self.config.client_port is not None:
            self.bound_client_port = server.add_secure_port(
                f"{host}:{self.config.client_port}", self.tls.server_credentials(require_client_cert=False))
            if self.bound_client_port == 0:
                raise SystemExit(f"cannot listen on {host}:{self.config.client_port} for token clients "
                                 "(port in use?)")
        return bound

    def ready_info(self) -> dict[str, Any]:
        """Extra fields for the ready file."""
        if self.tls is None:
            return {}
        info: dict[str, Any] = {"tls": True}
        if self.bound_client_port:
            info["client_port"] = self.bound_client_port
        return info

    async def close(self) -> None:
        if self.cache is not None:
            await self.cache.close()
