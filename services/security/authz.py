"""The ACL authorizer, modelled on Kafka's AclAuthorizer: (principal, operation, resource) -> allow?

Pure: no grpc, no etcd, no clock. `services/security/cache.py` keeps one
immutable `Authorizer` built from the ACLs in etcd and swaps in a new one
when its watch sees a change; the server interceptor asks it. So a decision
never sees half an update, and this module is tested without any I/O.

The rules are Kafka's:

- An ACL binding is (principal, permission Allow|Deny, operation, resource
  pattern). A pattern is a resource type (Topic, Group, Cluster), a name, and a
  pattern type: Literal (the name itself, or "*" for every resource of the
  type) or Prefixed (every name starting with it).
- A binding's principal is "User:<name>" or "User:*" (everyone).
- Super users are allowed everything, whatever the ACLs say.
- Otherwise: any matching Deny refuses (deny wins); else any matching Allow
  allows; else refused (no ACL, no access).
- Operation All in a binding matches every operation. Describe is implied by
  Read, Write, Delete and Alter (a producer may see the topic it writes to);
  a Deny is checked for the asked operation (and All) only, as in Kafka.

Every refusal is the caller's business, not an error: `authorize` returns a
bool. A malformed binding (unknown operation, empty name) raises AclError
when it is built, so bad input is caught at `highwater acl add`, not at
request time.
"""

from __future__ import annotations

from collections.abc import Iterable

# The binding model lives in the client library (clients/common/acls.py): names re-exported here so
# the services keep one import for the authorizer and what it decides with.
from clients.common.acls import (
    ACL_BINDINGS_MAX,
    ACL_BINDINGS_PER_REQUEST_MAX,
    CLUSTER,
    CLUSTER_NAME,
    IMPLIES_DESCRIBE,
    PRINCIPAL_NAME_MAX_CHARS,
    USER_TYPE,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclError,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    Resource,
    ResourceType,
    check_principal,
    group,
    topic,
)

# Re-exported names first (services import them from here), then this module's own.
__all__ = [
    "ACL_BINDINGS_MAX",
    "ACL_BINDINGS_PER_REQUEST_MAX",
    "CLUSTER",
    "CLUSTER_NAME",
    "IMPLIES_DESCRIBE",
    "PRINCIPAL_NAME_MAX_CHARS",
    "USER_TYPE",
    "WILDCARD",
    "WILDCARD_PRINCIPAL",
    "AclBinding",
    "AclError",
    "AclFilter",
    "Operation",
    "PatternType",
    "Permission",
    "Resource",
    "ResourceType",
    "check_principal",
    "group",
    "topic",
    "DECISION_CACHE_ENTRIES_MAX",
    "Authorizer",
    "parse_super_users",
]

# Decisions cached per Authorizer snapshot; a new snapshot starts empty. The
# bound keeps a flood of distinct topic names from growing memory.
DECISION_CACHE_ENTRIES_MAX = 100_000


class Authorizer:
    """An immutable snapshot of every ACL plus the super users; answers authorization questions.

    Owned by whoever built it; `authorize` only reads, plus a bounded memo of
    decisions that is private to this snapshot (a new ACL set means a new
    Authorizer, so the memo can never be stale).
    """

    def __init__(self, acls: Iterable[AclBinding] = (), super_users: Iterable[str] = ()) -> None:
        self.acls = tuple(acls)
        self.super_users = frozenset(super_users)
        self._by_type: dict[ResourceType, tuple[AclBinding, ...]] = {
            rtype: tuple(a for a in self.acls if a.resource_type is rtype) for rtype in ResourceType
        }
        self._memo: dict[tuple[str, Operation, Resource], bool] = {}

    def authorize(self, principal: str, operation: Operation, resource: Resource) -> bool:
        """True when `principal` may do `operation` on `resource` (deny wins; no ACL, no access)."""
        if principal in self.super_users:
            return True
        key = (principal, operation, resource)
        decided = self._memo.get(key)
        if decided is None:
            decided = self._decide(principal, operation, resource)
            if len(self._memo) >= DECISION_CACHE_ENTRIES_MAX:
                self._memo.clear()
            self._memo[key] = decided
        return decided

    def _decide(self, principal: str, operation: Operation, resource: Resource) -> bool:
        allow_ops = {operation, Operation.ALL}
        if operation is Operation.DESCRIBE:
            allow_ops |= IMPLIES_DESCRIBE
        allowed = False
        for acl in self._by_type[resource.type]:
            if acl.principal not in (principal, WILDCARD_PRINCIPAL) or not acl.matches_resource(resource):
                continue
            if acl.permission is Permission.DENY:
                if acl.operation in (operation, Operation.ALL):
                    return False
            elif acl.operation in allow_ops:
                allowed = True
        return allowed

    def authorize_any(self, principal: str, operation: Operation, resource_type: ResourceType) -> bool:
        """True when `principal` may do `operation` on at least one resource of the type.

        Kafka's authorizeByResourceType, simplified: some Allow binding for the
        principal (or everyone) names the operation, and no Deny binding for it
        covers every resource of the type (literal '*'). Used for InitProducerId:
        an idempotent producer needs Write on some topic.
        """
        if principal in self.super_users:
            return True
        allowed = False
        for acl in self._by_type[resource_type]:
            if acl.principal not in (principal, WILDCARD_PRINCIPAL) or acl.operation not in (
                operation,
                Operation.ALL,
            ):
                continue
            if acl.permission is Permission.DENY:
                if acl.pattern_type is PatternType.LITERAL and acl.resource_name == WILDCARD:
                    return False
            else:
                allowed = True
        return allowed


def parse_super_users(text: str) -> tuple[str, ...]:
    """Kafka's super.users syntax: "User:admin;User:ops" -> ("User:admin", "User:ops");
    AclError if malformed.
    """
    users = tuple(u.strip() for u in text.replace(",", ";").split(";") if u.strip())
    for user in users:
        check_principal(user)
    return users
