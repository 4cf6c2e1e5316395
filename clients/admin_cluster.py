"""The admin client's cluster calls: describe the cluster, and its ACLs and bearer tokens
(AsyncAdmin, clients/admin.py). Changing ACLs or tokens needs Alter on the cluster; listing
them, Describe."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from clients.admin_calls import AdminCalls, raise_first
from clients.common.acls import ACL_BINDINGS_PER_REQUEST_MAX, AclBinding, AclError
from clients.config import check_int
from clients.errors import HighwaterError, InvalidArgument, error_for_code
from clients.types import ClusterDescription, EtcdSpace, NodeDescription
from protos.highwater.v1 import common_pb2, controller_pb2


@dataclass(frozen=True)
class TokenDescription:
    """A bearer token as ListTokens shows it: never its secret. expires_ms 0: never."""

    token_id: str
    principal: str
    created_ms: int
    expires_ms: int
    description: str


@dataclass(frozen=True)
class CreatedToken:
    """A new token: `token` (hwt.<id>.<secret>) is shown this once; the cluster keeps only a hash."""

    token: str
    description: TokenDescription


def _token_description(info: controller_pb2.TokenInfo) -> TokenDescription:
    return TokenDescription(info.token_id, info.principal, info.created_ms, info.expires_ms, info.description)


def _binding(msg: controller_pb2.AclBinding) -> AclBinding:
    try:
        return AclBinding.of(
            msg.principal,
            msg.operation,
            msg.resource_type,
            msg.resource_name,
            permission=msg.permission,
            pattern_type=msg.pattern_type or "Literal",
            host=msg.host or "*",
        )
    except AclError as exc:
        raise error_for_code(
            common_pb2.UNKNOWN_SERVER_ERROR, f"the cluster answered a malformed ACL: {exc}"
        ) from None


def _check_bindings(bindings: Iterable[AclBinding], what: str) -> list[AclBinding]:
    checked = list(bindings)
    if not checked:
        raise InvalidArgument(f"{what}() needs at least one ACL binding")
    for b in checked:
        if not isinstance(b, AclBinding):
            raise InvalidArgument(f"{what}() takes AclBinding objects (AclBinding.of(...)), got {b!r}")
    return checked


class ClusterAdmin(AdminCalls):
    """The cluster, ACLs and tokens: AsyncAdmin's cluster calls."""

    async def describe_cluster(self) -> ClusterDescription:
        """Cluster id, the active controller, live brokers and gateways."""
        r = await self._call("DescribeCluster", common_pb2.DescribeClusterRequest())
        controller_address = f"{r.controller_host}:{r.controller_port}" if r.controller_host else ""
        return ClusterDescription(
            cluster_id=r.cluster_id,
            controller_id=r.controller_id,
            controller_epoch=r.controller_epoch,
            controller_address=controller_address,
            brokers=tuple(
                sorted(
                    (NodeDescription(b.broker_id, b.host, b.port, b.rack) for b in r.brokers),
                    key=lambda n: n.node_id,
                )
            ),
            gateways=tuple(
                sorted(
                    (NodeDescription(g.gateway_id, g.host, g.port) for g in r.gateways),
                    key=lambda n: n.node_id,
                )
            ),
            etcd_space=EtcdSpace(
                r.etcd_space.db_size_bytes,
                r.etcd_space.db_size_in_use_bytes,
                r.etcd_space.quota_bytes,
                r.etcd_space.nospace_alarm,
            )
            if r.HasField("etcd_space")
            else None,
        )

    # --- ACLs and tokens (need Alter on the cluster; listing, Describe) -------------------

    async def _alter_acls(self, method: str, bindings: Iterable[AclBinding]) -> dict[AclBinding, bool]:
        wanted = _check_bindings(bindings, "create_acls" if method == "CreateAcls" else "delete_acls")
        outcome: dict[AclBinding, bool] = {}
        errors: list[HighwaterError] = []
        for start in range(0, len(wanted), ACL_BINDINGS_PER_REQUEST_MAX):
            chunk = [
                controller_pb2.AclBinding(**b.to_dict())
                for b in wanted[start : start + ACL_BINDINGS_PER_REQUEST_MAX]
            ]
            request = (
                controller_pb2.CreateAclsRequest(creations=chunk)
                if method == "CreateAcls"
                else controller_pb2.DeleteAclsRequest(deletions=chunk)
            )
            response = await self._call(method, request)
            for r in response.results:
                if r.error_code != common_pb2.NONE:
                    errors.append(error_for_code(r.error_code, r.error_message or method))
                else:
                    b = _binding(r.binding)
                    outcome[b] = outcome.get(b, False) or r.changed
        raise_first(errors)
        return outcome

    async def create_acls(self, bindings: Iterable[AclBinding]) -> dict[AclBinding, bool]:
        """Add ACLs; returns {binding: True if it was new, False if already present}.

        Raises ClusterAuthorizationFailed without Alter on the cluster, InvalidRequest for a
        malformed binding (the well-formed ones of the same request are added).
        """
        return await self._alter_acls("CreateAcls", bindings)

    async def delete_acls(self, bindings: Iterable[AclBinding]) -> dict[AclBinding, bool]:
        """Remove these exact ACLs; returns {binding: True if it was present}."""
        return await self._alter_acls("DeleteAcls", bindings)

    async def describe_acls(
        self, principal: str | None = None, resource_type: str | None = None, resource_name: str | None = None
    ) -> list[AclBinding]:
        """ACLs of a principal (and of User:*), and/or whose pattern matches a resource; default all."""
        response = await self._call(
            "DescribeAcls",
            controller_pb2.DescribeAclsRequest(
                principal=principal or "",
                resource_type=resource_type or "",
                resource_name=resource_name or "",
            ),
        )
        return [_binding(b) for b in response.acls]

    async def create_token(
        self, principal: str, expires_in_ms: int = 0, description: str = ""
    ) -> CreatedToken:
        """A bearer token for the principal (0: until revoked). The token text is returned only here."""
        check_int("expires_in_ms", expires_in_ms, minimum=0)
        response = await self._call(
            "CreateToken",
            controller_pb2.CreateTokenRequest(
                principal=principal, expires_in_ms=expires_in_ms, description=description
            ),
        )
        return CreatedToken(response.token, _token_description(response.info))

    async def revoke_token(self, token_id: str) -> bool:
        """Revoke a token by id (or give the whole token); False when there was no such token."""
        from clients.common.tokens import token_id_of

        parsed = token_id_of(token_id) if isinstance(token_id, str) else None
        if parsed is None:
            raise InvalidArgument(f"{str(token_id)[:80]!r} is neither a token nor a token id")
        response = await self._call("RevokeToken", controller_pb2.RevokeTokenRequest(token_id=parsed))
        return bool(response.revoked)

    async def list_tokens(self) -> list[TokenDescription]:
        """Every token: id, principal, creation and expiry, description (never a secret)."""
        response = await self._call("ListTokens", controller_pb2.ListTokensRequest())
        return [_token_description(t) for t in response.tokens]
