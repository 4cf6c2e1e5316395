"""ACL bindings and filters as Kafka models them: what `Admin.create_acls` and `highwater acl`
build and what the authorizer (services/security/authz.py) decides with.

Pure data and parsing, no I/O. It lives in the client library because both sides use it:
a client builds bindings and checks them before sending, the services parse the same
strings back (services depend on the client library, never the other way). The rules
the bindings take part in are documented with the authorizer.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

# Re-exported: services and clients/admin.py import these bounds from here.
from clients.common.limits import ACL_BINDINGS_MAX as ACL_BINDINGS_MAX
from clients.common.limits import ACL_BINDINGS_PER_REQUEST_MAX as ACL_BINDINGS_PER_REQUEST_MAX
from clients.common.limits import PRINCIPAL_NAME_MAX_CHARS as PRINCIPAL_NAME_MAX_CHARS

# Kafka's name for the one cluster resource; ACLs on the cluster use it.
CLUSTER_NAME = "highwater-cluster"
WILDCARD = "*"
USER_TYPE = "User"
WILDCARD_PRINCIPAL = "User:*"
_PRINCIPAL = re.compile(r"^User:[\x21-\x7e][\x20-\x7e]*$")


class AclError(ValueError):
    """A binding or principal that cannot be used (bad operation, name, pattern)."""


class Operation(enum.Enum):
    ALL = "All"
    READ = "Read"
    WRITE = "Write"
    CREATE = "Create"
    DELETE = "Delete"
    ALTER = "Alter"
    DESCRIBE = "Describe"
    CLUSTER_ACTION = "ClusterAction"


class ResourceType(enum.Enum):
    TOPIC = "Topic"
    GROUP = "Group"
    CLUSTER = "Cluster"


class PatternType(enum.Enum):
    LITERAL = "Literal"
    PREFIXED = "Prefixed"


class Permission(enum.Enum):
    ALLOW = "Allow"
    DENY = "Deny"


# Operations that imply Describe when allowed (Kafka's AclAuthorizer).
IMPLIES_DESCRIBE = frozenset({Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER})


def _enum(cls: type[enum.Enum], value: object, what: str) -> Any:
    if isinstance(value, cls):
        return value
    for member in cls:
        if isinstance(value, str) and value.replace("_", "").lower() == member.value.lower():
            return member
    raise AclError(f"{what} must be one of {', '.join(m.value for m in cls)}; got {value!r}")


def check_principal(principal: object) -> str:
    """Return `principal` if it is "User:<name>" (printable ASCII, bounded), else raise AclError."""
    if not isinstance(principal, str) or not _PRINCIPAL.match(principal):
        raise AclError(f"principal must look like User:<name> (printable ASCII); got {principal!r}")
    if len(principal) > PRINCIPAL_NAME_MAX_CHARS:
        raise AclError(f"principal is {len(principal)} characters; the limit is {PRINCIPAL_NAME_MAX_CHARS}")
    return principal


@dataclass(frozen=True, slots=True)
class Resource:
    """A concrete resource a request touches: ("Topic", "orders"), ("Cluster", CLUSTER_NAME)."""

    type: ResourceType
    name: str


def topic(name: str) -> Resource:
    return Resource(ResourceType.TOPIC, name)


def group(name: str) -> Resource:
    return Resource(ResourceType.GROUP, name)


CLUSTER = Resource(ResourceType.CLUSTER, CLUSTER_NAME)


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL. Build with `AclBinding.of(...)` (validates) or `from_dict` (what etcd holds)."""

    principal: str
    permission: Permission
    operation: Operation
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType = PatternType.LITERAL
    host: str = WILDCARD

    @classmethod
    def of(
        cls,
        principal: str,
        operation: str | Operation,
        resource_type: str | ResourceType,
        resource_name: str,
        *,
        permission: str | Permission = Permission.ALLOW,
        pattern_type: str | PatternType = PatternType.LITERAL,
        host: str = WILDCARD,
    ) -> AclBinding:
        """A checked binding; raises AclError naming the bad field."""
        rtype = _enum(ResourceType, resource_type, "resource type")
        ptype = _enum(PatternType, pattern_type, "pattern type")
        if rtype is ResourceType.CLUSTER:
            resource_name = CLUSTER_NAME
        if not isinstance(resource_name, str) or not resource_name:
            raise AclError("resource name must be a non-empty string (or * for every resource of the type)")
        if ptype is PatternType.PREFIXED and resource_name == WILDCARD:
            raise AclError("a prefixed pattern cannot be '*'; use a literal '*' for every resource")
        if host != WILDCARD:
            # Connections are identified by certificate or token, not address; an address
            # rule would silently never match behind the gateway.
            raise AclError("only host '*' is supported")
        if principal != WILDCARD_PRINCIPAL:
            check_principal(principal)
        return cls(
            principal,
            _enum(Permission, permission, "permission"),
            _enum(Operation, operation, "operation"),
            rtype,
            resource_name,
            ptype,
            host,
        )

    def to_dict(self) -> dict[str, str]:
        """The JSON form stored in etcd (Kafka's names, so it reads like kafka-acls output)."""
        return {
            "principal": self.principal,
            "permission": self.permission.value,
            "operation": self.operation.value,
            "resource_type": self.resource_type.value,
            "resource_name": self.resource_name,
            "pattern_type": self.pattern_type.value,
            "host": self.host,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AclBinding:
        try:
            return cls.of(
                data["principal"],
                data["operation"],
                data["resource_type"],
                data["resource_name"],
                permission=data["permission"],
                pattern_type=data.get("pattern_type", "Literal"),
                host=data.get("host", WILDCARD),
            )
        except (KeyError, TypeError) as exc:
            raise AclError(f"ACL record {data!r} lacks a field or has a wrong type: {exc}") from exc

    def matches_resource(self, resource: Resource) -> bool:
        if resource.type is not self.resource_type:
            return False
        if self.pattern_type is PatternType.PREFIXED:
            return resource.name.startswith(self.resource_name)
        return self.resource_name in (WILDCARD, resource.name)

    def describe(self) -> str:
        """One line for people: 'User:alice has Allow permission for Read on Topic:LITERAL:orders'."""
        return (
            f"{self.principal} has {self.permission.value} permission for {self.operation.value} on "
            f"{self.resource_type.value}:{self.pattern_type.value.upper()}:{self.resource_name}"
        )

    def sort_key(self) -> tuple[str, str, str, str, str, str]:
        """The order listings use: resource, then principal, then operation."""
        return (
            self.resource_type.value,
            self.resource_name,
            self.pattern_type.value,
            self.principal,
            self.operation.value,
            self.permission.value,
        )


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Which bindings a listing returns (Kafka's AclBindingFilter with pattern type MATCH).

    principal: bindings of this principal and of everyone ("User:*"); None: any.
    resource_type: bindings on resources of this type; None: any.
    resource_name: with a type, bindings whose pattern matches this very resource
      (literal name, "*" or a matching prefix); None: any name.
    """

    principal: str | None = None
    resource_type: ResourceType | None = None
    resource_name: str | None = None

    @classmethod
    def of(cls, principal: str = "", resource_type: str = "", resource_name: str = "") -> AclFilter:
        """Empty strings match everything; raises AclError for a malformed principal or type."""
        if principal and principal != WILDCARD_PRINCIPAL:
            check_principal(principal)
        if resource_name and not resource_type:
            raise AclError("a resource name needs a resource type (Topic, Group or Cluster)")
        rtype = _enum(ResourceType, resource_type, "resource type") if resource_type else None
        name = CLUSTER_NAME if rtype is ResourceType.CLUSTER else (resource_name or None)
        return cls(principal or None, rtype, name)

    def matches(self, binding: AclBinding) -> bool:
        if self.principal is not None and binding.principal not in (self.principal, WILDCARD_PRINCIPAL):
            return False
        if self.resource_type is None:
            return True
        if self.resource_name is None:
            return binding.resource_type is self.resource_type
        return binding.matches_resource(Resource(self.resource_type, self.resource_name))
