"""The settings every service's config carries: BrokerConfig, ControllerConfig and
GatewayConfig derive from `ServiceConfig`, so the common ones have one home.

They are the flags every service command takes (services/cli.py `CommonOptions`, whose
`config_fields()` fills exactly these) plus the service's security settings; ServiceProcess
(services/common/server.py) starts etcd, security and the gRPC runtime from them alone.
Keyword-only: each service's own fields (its id first) keep their places, and a common field
is always named where a config is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from services.common import limits
from services.security.config import SecurityConfig


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    etcd_endpoints: list[str]
    host: str = "127.0.0.1"
    # 0: any free port (the bound one is in the ready file and the registration).
    port: int = 0
    # The Prometheus /metrics endpoint; 0: any free port, None: none.
    metrics_port: int | None = 0
    etcd_prefix: str = "/highwater"
    # The registration's (and a controller's election) lease in etcd.
    lease_ttl_s: int = limits.LEASE_TTL_S
    # Written once the service serves, removed when it stops: how whoever started it waits.
    ready_file: Path | None = None
    security: SecurityConfig = field(default_factory=SecurityConfig)
