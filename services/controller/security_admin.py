"""The controller's security admin calls, decided: ACLs and bearer tokens (decide, then apply).

Pure: no grpc, no etcd, no clock (now_ms is an argument). The servicer
(server.py) reads the current records from etcd (coordinator/acls.py), asks a
function here, commits the returned writes in one transaction fenced by its
controller epoch, and answers with the returned response. Every service then
sees the change through its watch (services/security/cache.py); the
controller keeps no security state of its own, so a new controller has
nothing to rebuild.

Who may call is not decided here: the interceptor's rules (rules.py) demand
Alter on the Cluster to change ACLs or tokens and Describe on it to list
them, before any of this runs. What is decided here is whether the request
is well-formed and within the bounds:

- a malformed binding or filter: INVALID_REQUEST for that binding (CreateAcls
  and DeleteAcls answer per binding, as Kafka does) or for the request;
- more than ACL_BINDINGS_PER_REQUEST_MAX bindings in one request, or a
  CreateAcls that would take the cluster past ACL_BINDINGS_MAX, or a token
  past TOKENS_MAX: INVALID_REQUEST for the whole request, nothing written;
- a token for a service's name, with a negative or too long lifetime:
  INVALID_REQUEST (tokens.py).

A token's secret appears once, in the CreateToken response; the write holds
only the record with its salted hash (tokens.TokenRecord).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from protos.highwater.v1 import common_pb2, controller_pb2
from services.security import tokens
from services.security.authz import (
    ACL_BINDINGS_MAX,
    ACL_BINDINGS_PER_REQUEST_MAX,
    WILDCARD,
    AclBinding,
    AclError,
    AclFilter,
)

INVALID_REQUEST = common_pb2.INVALID_REQUEST


# ---- what a decision asks for -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AclWrite:
    """Store one binding (delete False) or remove it (delete True); the store names the key by its digest."""

    binding: dict[str, str]
    delete: bool = False


@dataclass(frozen=True, slots=True)
class TokenWrite:
    """Store a token's record, or delete it (record None: the revocation)."""

    token_id: str
    record: dict[str, Any] | None


SecurityWrite = AclWrite | TokenWrite


@dataclass
class Decision:
    """The writes to commit (all or none) and the answer to give once they are committed."""

    response: Any
    writes: list[SecurityWrite] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SecurityState:
    """The ACLs and token records in etcd when the request was read.

    Malformed records (hand-written into etcd) are left out, as the services' caches leave them
    out; token_ids still names every token record, so any of them can be revoked.
    """

    acls: frozenset[AclBinding]
    tokens: Mapping[str, tokens.TokenRecord]
    token_ids: frozenset[str] = frozenset()

    @classmethod
    def from_records(
        cls, acls: Iterable[dict[str, Any]], token_records: Mapping[str, dict[str, Any]]
    ) -> SecurityState:
        bindings = set()
        for data in acls:
            try:
                bindings.add(AclBinding.from_dict(data))
            except AclError:
                continue
        records = {}
        for token_id, data in token_records.items():
            try:
                records[token_id] = tokens.TokenRecord.from_dict(data)
            except ValueError:
                continue
        return cls(frozenset(bindings), records, frozenset(token_records))


# ---- wire form of a binding ---------------------------------------------------------------------


def binding_from_proto(msg: controller_pb2.AclBinding) -> AclBinding:
    """The checked binding a message stands for; raises AclError naming the bad field."""
    return AclBinding.of(
        msg.principal,
        msg.operation,
        msg.resource_type,
        msg.resource_name,
        permission=msg.permission,
        pattern_type=msg.pattern_type or "Literal",
        host=msg.host or WILDCARD,
    )


def binding_to_proto(binding: AclBinding) -> controller_pb2.AclBinding:
    return controller_pb2.AclBinding(**binding.to_dict())


def token_info(token_id: str, record: tokens.TokenRecord) -> controller_pb2.TokenInfo:
    return controller_pb2.TokenInfo(
        token_id=token_id,
        principal=record.principal,
        created_ms=record.created_ms,
        expires_ms=record.expires_ms,
        description=record.description,
    )


# ---- ACLs ---------------------------------------------------------------------------------------


def _too_many(count: int, what: str) -> str | None:
    if count > ACL_BINDINGS_PER_REQUEST_MAX:
        return (
            f"{what} names {count} ACL bindings; at most {ACL_BINDINGS_PER_REQUEST_MAX} per request "
            "(send several requests)"
        )
    return None


def _parse_each(
    messages: Iterable[controller_pb2.AclBinding],
) -> list[tuple[controller_pb2.AclBinding, AclBinding | None, str]]:
    """(as sent, checked binding or None, why not) for each binding of a request."""
    parsed: list[tuple[controller_pb2.AclBinding, AclBinding | None, str]] = []
    for msg in messages:
        try:
            parsed.append((msg, binding_from_proto(msg), ""))
        except AclError as exc:
            parsed.append((msg, None, str(exc)))
    return parsed


def _change_each(
    state: SecurityState,
    messages: Iterable[controller_pb2.AclBinding],
    response: controller_pb2.CreateAclsResponse | controller_pb2.DeleteAclsResponse,
    *,
    delete: bool,
) -> tuple[list[SecurityWrite], set[AclBinding]]:
    """Answer each binding in `response.results`: malformed, or whether adding it (removing it,
    with `delete`) changes the ACLs. The writes that do, and their bindings (each once)."""
    writes: list[SecurityWrite] = []
    changing: set[AclBinding] = set()
    for sent, binding, why in _parse_each(messages):
        if binding is None:
            response.results.add(binding=sent, error_code=INVALID_REQUEST, error_message=why)
            continue
        # Adding changes what is absent, removing what is present.
        changed = (binding in state.acls) == delete and binding not in changing
        if changed:
            changing.add(binding)
            writes.append(AclWrite(binding.to_dict(), delete=delete))
        response.results.add(binding=binding_to_proto(binding), changed=changed)
    return writes, changing


def create_acls(state: SecurityState, request: controller_pb2.CreateAclsRequest) -> Decision:
    """Store each well-formed binding (adding one already present changes nothing)."""
    problem = _too_many(len(request.creations), "CreateAcls")
    if problem:
        return Decision(controller_pb2.CreateAclsResponse(error_code=INVALID_REQUEST, error_message=problem))
    response = controller_pb2.CreateAclsResponse()
    writes, new = _change_each(state, request.creations, response, delete=False)
    if len(state.acls) + len(new) > ACL_BINDINGS_MAX:
        return Decision(
            controller_pb2.CreateAclsResponse(
                error_code=INVALID_REQUEST,
                error_message=f"the cluster has {len(state.acls)} ACLs; {len(new)} more would pass the limit "
                f"of {ACL_BINDINGS_MAX} (remove some, or use prefixed and wildcard patterns)",
            )
        )
    return Decision(response, writes)


def delete_acls(state: SecurityState, request: controller_pb2.DeleteAclsRequest) -> Decision:
    """Remove each named binding that exists (exact match, not a filter)."""
    problem = _too_many(len(request.deletions), "DeleteAcls")
    if problem:
        return Decision(controller_pb2.DeleteAclsResponse(error_code=INVALID_REQUEST, error_message=problem))
    response = controller_pb2.DeleteAclsResponse()
    writes, _ = _change_each(state, request.deletions, response, delete=True)
    return Decision(response, writes)


def describe_acls(state: SecurityState, request: controller_pb2.DescribeAclsRequest) -> Decision:
    """The bindings the filter matches, sorted; writes nothing."""
    try:
        acl_filter = AclFilter.of(request.principal, request.resource_type, request.resource_name)
    except AclError as exc:
        return Decision(
            controller_pb2.DescribeAclsResponse(error_code=INVALID_REQUEST, error_message=str(exc))
        )
    matching = sorted((b for b in state.acls if acl_filter.matches(b)), key=AclBinding.sort_key)
    return Decision(controller_pb2.DescribeAclsResponse(acls=[binding_to_proto(b) for b in matching]))


# ---- tokens -------------------------------------------------------------------------------------


def create_token(
    state: SecurityState, request: controller_pb2.CreateTokenRequest, *, now_ms: int
) -> Decision:
    """A new token for the principal: its record is written, its text answered once."""
    if len(state.token_ids | state.tokens.keys()) >= tokens.TOKENS_MAX:
        return Decision(
            controller_pb2.CreateTokenResponse(
                error_code=INVALID_REQUEST,
                error_message=f"the cluster has {tokens.TOKENS_MAX} tokens, the limit; "
                "revoke unused ones first",
            )
        )
    try:
        text, token_id, record = tokens.new_token(
            request.principal,
            now_ms=now_ms,
            expires_in_ms=request.expires_in_ms,
            description=request.description,
        )
    except (tokens.TokenError, AclError) as exc:
        return Decision(
            controller_pb2.CreateTokenResponse(error_code=INVALID_REQUEST, error_message=str(exc))
        )
    return Decision(
        controller_pb2.CreateTokenResponse(token=text, info=token_info(token_id, record)),
        [TokenWrite(token_id, record.to_dict())],
    )


def revoke_token(state: SecurityState, request: controller_pb2.RevokeTokenRequest) -> Decision:
    """Delete the token's record; revoked False when there was none."""
    if not tokens.is_token_id(request.token_id):
        return Decision(
            controller_pb2.RevokeTokenResponse(
                error_code=INVALID_REQUEST,
                error_message=f"{request.token_id[:80]!r} is not a token id (1-{tokens.TOKEN_ID_CHARS_MAX} "
                "ASCII letters or digits: the part between the dots of hwt.<id>.<secret>)",
            )
        )
    if request.token_id not in state.tokens and request.token_id not in state.token_ids:
        return Decision(controller_pb2.RevokeTokenResponse(revoked=False))
    return Decision(controller_pb2.RevokeTokenResponse(revoked=True), [TokenWrite(request.token_id, None)])


def list_tokens(state: SecurityState, request: controller_pb2.ListTokensRequest) -> Decision:
    """Every token's id, principal and lifetime: never a secret, never a hash."""
    return Decision(
        controller_pb2.ListTokensResponse(
            tokens=[token_info(i, state.tokens[i]) for i in sorted(state.tokens)]
        )
    )
