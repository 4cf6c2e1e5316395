"""Who is calling: service identities, principals, and the Caller of one request.

A **service identity** is proven only by a certificate from the cluster's
certificate authority whose common name is one of the reserved names:
"controller" or "controller-<id>", "broker-<id>", "gateway-<id>". It is never
taken from a token or from request metadata. A **principal** is what ACLs name:
"User:<common name>" for a certificate, the token's principal for a bearer
token, and "User:ANONYMOUS" on a plaintext listener (Kafka's names).

The reserved names are therefore privileges: the certificate authority must not
issue them to clients, and `highwater token create` refuses them.

Pure: no grpc, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

ANONYMOUS = "User:ANONYMOUS"
ServiceKind = Literal["controller", "broker", "gateway"]
_SERVICE_NAME = re.compile(r"^(controller)(?:-(\d{1,10}))?$|^(broker|gateway)-(\d{1,10})$")


@dataclass(frozen=True, slots=True)
class ServiceIdentity:
    """A Highwater process proven by its certificate. id is None for a plain "controller"."""

    kind: ServiceKind
    id: int | None

    @property
    def name(self) -> str:
        return self.kind if self.id is None else f"{self.kind}-{self.id}"


def parse_service_name(name: str) -> ServiceIdentity | None:
    """The service identity a certificate common name stands for, or None for any other name."""
    m = _SERVICE_NAME.match(name)
    if m is None:
        return None
    if m.group(1):
        return ServiceIdentity("controller", int(m.group(2)) if m.group(2) else None)
    kind: ServiceKind = "broker" if m.group(3) == "broker" else "gateway"  # the pattern allows no other
    return ServiceIdentity(kind, int(m.group(4)))


def is_reserved_principal(principal: str) -> bool:
    """True for "User:<service name>": no token may carry it (it would look like a service)."""
    return principal.startswith("User:") and parse_service_name(principal[len("User:") :]) is not None


@dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated party of one request.

    principal: whom ACLs and quotas apply to.
    service: set only when the connection's certificate is a service's and the
      request acts for that service itself (not for a forwarded principal).
    forwarded_by: the gateway that authenticated the principal and passed it on;
      the gateway already charged its quotas.
    authenticated_by: "certificate", "token", "forwarded" or "none" (plaintext).
    """

    principal: str
    service: ServiceIdentity | None = None
    forwarded_by: ServiceIdentity | None = None
    authenticated_by: str = "none"

    def describe(self) -> str:
        if self.service is not None:
            return f"service {self.service.name}"
        if self.forwarded_by is not None:
            return f"{self.principal} (via {self.forwarded_by.name})"
        return self.principal


ANONYMOUS_CALLER = Caller(ANONYMOUS)


def certificate_caller(common_name: str) -> Caller:
    """The caller a verified client certificate stands for: "User:<CN>", and the service identity
    when the CN is a reserved service name. One derivation for every listener (gRPC, Kafka)."""
    return Caller(
        f"User:{common_name}", service=parse_service_name(common_name), authenticated_by="certificate"
    )
