"""The controller's ACL and token admin calls: decisions (pure) and the servicer over the in-memory store.

The servicer tests drive the real ControllerServicer and the real coordinator
functions against coordinator/memory_store.py, which refuses what etcd
refuses; only the event loop is replaced by what the servicer reads of it
(its epoch and its `resigned` event), since these calls do not go through it.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest

from coordinator.acls import load_security, put_token
from coordinator.memory_store import MemoryStore
from protos.highwater.v1 import common_pb2, controller_pb2
from services.controller import security_admin
from services.controller.security_admin import AclWrite, SecurityState, TokenWrite
from services.security import tokens
from services.security.authz import (
    ACL_BINDINGS_MAX,
    ACL_BINDINGS_PER_REQUEST_MAX,
    AclBinding,
    Authorizer,
    Operation,
    topic,
)
from tests.python_source import parse_python

ROOT = Path(__file__).resolve().parents[2]
NONE = common_pb2.NONE
INVALID = common_pb2.INVALID_REQUEST


def wire(principal: str, operation: str, rtype: str, name: str, **kw: str) -> controller_pb2.AclBinding:
    return controller_pb2.AclBinding(
        principal=principal,
        operation=operation,
        resource_type=rtype,
        resource_name=name,
        permission=kw.get("permission", "Allow"),
        pattern_type=kw.get("pattern_type", ""),
    )


def binding(principal: str, operation: str, rtype: str, name: str) -> AclBinding:
    return AclBinding.of(principal, operation, rtype, name)


EMPTY = SecurityState(frozenset(), {})


# --- decisions --------------------------------------------------------------------------------


def test_security_admin_decisions_stay_pure() -> None:
    tree = parse_python((ROOT / "services/controller/security_admin.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"grpc", "etcd3aio", "asyncio", "coordinator", "time", "socket", "threading"}


def test_create_acls_writes_new_bindings_once_and_answers_each_in_order() -> None:
    present = binding("User:alice", "Read", "Topic", "orders")
    state = SecurityState(frozenset({present}), {})
    request = controller_pb2.CreateAclsRequest(
        creations=[
            wire("User:alice", "Read", "Topic", "orders"),  # already there
            wire("User:alice", "write", "topic", "orders"),  # new (names are case-insensitive)
            wire("User:alice", "Write", "Topic", "orders"),  # the same again in this request
            wire("alice", "Read", "Topic", "orders"),  # malformed principal
            wire("User:ops", "Alter", "Cluster", "ignored"),  # the cluster has one name
            wire("User:x", "Fly", "Topic", "t"),  # unknown operation
        ]
    )
    decision = security_admin.create_acls(state, request)
    r = decision.response
    assert r.error_code == NONE
    assert [(x.error_code, x.changed) for x in r.results] == [
        (NONE, False),
        (NONE, True),
        (NONE, False),
        (INVALID, False),
        (NONE, True),
        (INVALID, False),
    ]
    assert "User:<name>" in r.results[3].error_message and "operation" in r.results[5].error_message
    assert r.results[4].binding.resource_name == "highwater-cluster"
    assert decision.writes == [
        AclWrite(binding("User:alice", "Write", "Topic", "orders").to_dict()),
        AclWrite(binding("User:ops", "Alter", "Cluster", "").to_dict()),
    ]


def test_acl_requests_and_the_acl_set_are_bounded_and_refused_whole() -> None:
    many = controller_pb2.CreateAclsRequest(
        creations=[wire("User:a", "Read", "Topic", f"t{i}") for i in range(ACL_BINDINGS_PER_REQUEST_MAX + 1)]
    )
    for decision in (
        security_admin.create_acls(EMPTY, many),
        security_admin.delete_acls(EMPTY, controller_pb2.DeleteAclsRequest(deletions=many.creations)),
    ):
        assert decision.response.error_code == INVALID and not decision.writes
        assert f"at most {ACL_BINDINGS_PER_REQUEST_MAX}" in decision.response.error_message
    full = SecurityState(
        frozenset(binding("User:a", "Read", "Topic", f"t{i}") for i in range(ACL_BINDINGS_MAX)), {}
    )
    decision = security_admin.create_acls(
        full,
        controller_pb2.CreateAclsRequest(
            creations=[wire("User:a", "Read", "Topic", "t0"), wire("User:a", "Read", "Topic", "new")]
        ),
    )
    assert decision.response.error_code == INVALID and not decision.writes
    assert f"limit of {ACL_BINDINGS_MAX}" in decision.response.error_message
    again = security_admin.create_acls(
        full, controller_pb2.CreateAclsRequest(creations=[wire("User:a", "Read", "Topic", "t0")])
    )
    assert again.response.error_code == NONE and not again.writes, "re-adding one present is not growth"


def test_delete_acls_removes_exactly_the_named_bindings() -> None:
    a, b = binding("User:alice", "Read", "Topic", "orders"), binding("User:alice", "Write", "Topic", "orders")
    decision = security_admin.delete_acls(
        SecurityState(frozenset({a, b}), {}),
        controller_pb2.DeleteAclsRequest(
            deletions=[
                wire("User:alice", "Read", "Topic", "orders"),
                wire("User:alice", "Read", "Topic", "orders"),
                wire("User:alice", "Read", "Topic", "ord", pattern_type="Prefixed"),
            ]
        ),
    )
    assert [x.changed for x in decision.response.results] == [True, False, False]
    assert decision.writes == [AclWrite(a.to_dict(), delete=True)]


def test_describe_acls_filters_and_sorts() -> None:
    bindings = [
        binding("User:bob", "Read", "Topic", "orders"),
        binding("User:alice", "Read", "Topic", "orders"),
        binding("User:alice", "Read", "Group", "g"),
        binding("User:*", "Describe", "Topic", "*"),
    ]
    state = SecurityState(frozenset(bindings), {})

    def described(**kw: str) -> list[tuple[str, str, str]]:
        r = security_admin.describe_acls(state, controller_pb2.DescribeAclsRequest(**kw)).response
        assert r.error_code == NONE
        return [(b.principal, b.resource_type, b.resource_name) for b in r.acls]

    assert described() == [
        ("User:alice", "Group", "g"),
        ("User:*", "Topic", "*"),
        ("User:alice", "Topic", "orders"),
        ("User:bob", "Topic", "orders"),
    ]
    assert described(principal="User:alice", resource_type="Topic", resource_name="orders") == [
        ("User:*", "Topic", "*"),
        ("User:alice", "Topic", "orders"),
    ]
    bad = security_admin.describe_acls(
        state, controller_pb2.DescribeAclsRequest(resource_type="Table")
    ).response
    assert bad.error_code == INVALID and "resource type" in bad.error_message


def test_create_token_answers_the_secret_once_and_writes_only_its_hash() -> None:
    decision = security_admin.create_token(
        EMPTY,
        controller_pb2.CreateTokenRequest(principal="User:bob", expires_in_ms=60_000, description="ci"),
        now_ms=1_000,
    )
    r = decision.response
    assert r.error_code == NONE and r.token.startswith("hwt.")
    token_id, secret = tokens.parse_token(r.token)  # type: ignore[misc]
    assert (r.info.token_id, r.info.principal, r.info.created_ms, r.info.expires_ms, r.info.description) == (
        token_id,
        "User:bob",
        1_000,
        61_000,
        "ci",
    )
    [write] = decision.writes
    assert isinstance(write, TokenWrite) and write.token_id == token_id and write.record is not None
    assert secret not in repr(write.record), "the secret is never stored"
    record = tokens.TokenRecord.from_dict(write.record)
    assert tokens.verify(record, secret, now_ms=2_000) == "User:bob"
    assert tokens.verify(record, secret, now_ms=61_000) is None, "expired"


@pytest.mark.parametrize(
    "principal, expires_in_ms, says",
    [
        ("User:controller-1", 0, "service identity"),
        ("User:gateway-2", 0, "service identity"),
        ("bob", 0, "User:<name>"),
        ("User:bob", -1, "expiry"),
        ("User:bob", tokens.TOKEN_LIFETIME_MS_MAX + 1, "expiry"),
    ],
)
def test_create_token_refuses_service_names_and_bad_lifetimes(
    principal: str, expires_in_ms: int, says: str
) -> None:
    decision = security_admin.create_token(
        EMPTY, controller_pb2.CreateTokenRequest(principal=principal, expires_in_ms=expires_in_ms), now_ms=0
    )
    assert decision.response.error_code == INVALID and says in decision.response.error_message
    assert not decision.writes and not decision.response.token


def test_tokens_are_bounded_revoked_by_id_and_listed_without_secrets() -> None:
    _, token_id, record = tokens.new_token("User:bob", now_ms=5, description="d")
    state = SecurityState.from_records(
        [{"bogus": 1}], {token_id: record.to_dict(), "junk": {"principal": "x"}}
    )
    assert set(state.tokens) == {token_id} and state.token_ids == {token_id, "junk"}
    listed = security_admin.list_tokens(state, controller_pb2.ListTokensRequest()).response
    assert [(t.token_id, t.principal, t.created_ms, t.description) for t in listed.tokens] == [
        (token_id, "User:bob", 5, "d")
    ]
    assert record.digest.hex() not in str(listed) and record.salt.hex() not in str(listed)
    revoke = security_admin.revoke_token(state, controller_pb2.RevokeTokenRequest(token_id=token_id))
    assert revoke.response.revoked and revoke.writes == [TokenWrite(token_id, None)]
    junk = security_admin.revoke_token(state, controller_pb2.RevokeTokenRequest(token_id="junk"))
    assert junk.response.revoked, "a malformed record can still be revoked"
    missing = security_admin.revoke_token(state, controller_pb2.RevokeTokenRequest(token_id="0123abcd"))
    assert not missing.response.revoked and not missing.writes
    bad = security_admin.revoke_token(state, controller_pb2.RevokeTokenRequest(token_id="../acls/x"))
    assert bad.response.error_code == INVALID and not bad.writes
    full = SecurityState(frozenset(), {}, frozenset(f"{i:x}" for i in range(tokens.TOKENS_MAX)))
    over = security_admin.create_token(
        full, controller_pb2.CreateTokenRequest(principal="User:bob"), now_ms=0
    )
    assert over.response.error_code == INVALID and not over.writes


# --- the servicer over the in-memory store -----------------------------------------------------------


class ActiveLoop:
    """What ControllerServicer reads of its event loop for these calls: the epoch, and `resigned`."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.resigned = asyncio.Event()


async def servicer_at(epoch: int) -> tuple[Any, MemoryStore]:
    from services.controller.server import ControllerServicer

    store = MemoryStore()
    # As an election leaves them: the epoch, and /controller (fenced writes require both).
    await store.put(store.keys.controller_epoch, str(epoch).encode())
    await store.put(
        store.keys.controller, b'{"controller_id": 1, "epoch": %d, "host": "h", "port": 9}' % epoch
    )
    servicer = ControllerServicer(store)  # type: ignore[arg-type]
    servicer.active = ActiveLoop(epoch)  # type: ignore[assignment]
    return servicer, store


@pytest.mark.asyncio
async def test_the_active_controller_writes_acls_and_tokens_that_the_services_caches_read() -> None:
    servicer, store = await servicer_at(3)
    created = await servicer.CreateAcls(
        controller_pb2.CreateAclsRequest(creations=[wire("User:alice", "Write", "Topic", "orders")]), None
    )
    assert created.results[0].changed
    token = await servicer.CreateToken(controller_pb2.CreateTokenRequest(principal="User:bob"), None)
    snapshot = await load_security(store)
    state = SecurityState.from_records(snapshot.acls.values(), snapshot.tokens)
    assert Authorizer(state.acls).authorize("User:alice", Operation.WRITE, topic("orders"))
    token_id, secret = tokens.parse_token(token.token)  # type: ignore[misc]
    assert tokens.verify(state.tokens[token_id], secret, now_ms=token.info.created_ms) == "User:bob"
    listed = await servicer.ListTokens(controller_pb2.ListTokensRequest(), None)
    assert [t.token_id for t in listed.tokens] == [token_id]
    assert (await servicer.RevokeToken(controller_pb2.RevokeTokenRequest(token_id=token_id), None)).revoked
    assert (
        (
            await servicer.DeleteAcls(
                controller_pb2.DeleteAclsRequest(deletions=[wire("User:alice", "Write", "Topic", "orders")]),
                None,
            )
        )
        .results[0]
        .changed
    )
    after = await load_security(store)
    assert not after.acls and not after.tokens


@pytest.mark.asyncio
async def test_a_standby_answers_not_controller_and_a_fenced_one_writes_nothing_and_resigns() -> None:
    servicer, store = await servicer_at(3)
    await store.put(store.keys.controller, b'{"controller_id": 2, "epoch": 4, "host": "h", "port": 9}')
    loop = servicer.active
    servicer.active = None
    standby = await servicer.CreateAcls(
        controller_pb2.CreateAclsRequest(creations=[wire("User:alice", "Read", "Topic", "t")]), None
    )
    assert standby.error_code == common_pb2.NOT_CONTROLLER and standby.active_controller.port == 9
    servicer.active = loop
    await store.put(store.keys.controller_epoch, b"4")  # a newer controller won meanwhile
    fenced = await servicer.CreateToken(controller_pb2.CreateTokenRequest(principal="User:bob"), None)
    assert fenced.error_code == common_pb2.NOT_CONTROLLER and not fenced.token
    assert loop.resigned.is_set()
    snapshot = await load_security(store)
    assert not snapshot.acls and not snapshot.tokens


@pytest.mark.asyncio
async def test_revoking_a_token_someone_wrote_by_hand_works_through_the_controller() -> None:
    servicer, store = await servicer_at(1)
    await put_token(store, "abc123", {"principal": "User:bob"})  # malformed: no hash
    assert (await servicer.RevokeToken(controller_pb2.RevokeTokenRequest(token_id="abc123"), None)).revoked
    assert not (await load_security(store)).tokens


# --- the gateway's pass-through -------------------------------------------------------------------


class RefusingController:
    """A controller stub whose every call ends as the controller's interceptor ends a refused one."""

    def __getattr__(self, rpc: str) -> Any:
        async def call(request: Any, timeout: float) -> Any:
            import grpc

            raise grpc.aio.AioRpcError(
                grpc.StatusCode.PERMISSION_DENIED,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details=f"User:ops may not Alter Cluster 'highwater-cluster' ({rpc})",
            )

        return call


class AbortingContext:
    async def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(f"aborted {code.name}: {details}")


@pytest.mark.asyncio
async def test_the_gateway_passes_the_controllers_refusal_on_instead_of_a_retriable_not_controller() -> None:
    """The gateway admitted the caller (its ACL cache ahead of the controller's, or --super-users set on
    the gateway only); the controller refused. The client sees PERMISSION_DENIED at once, not 30 s of
    NOT_CONTROLLER retries."""
    from services.gateway.server import GatewayServicer

    store = MemoryStore()
    await store.put(
        store.keys.controller, b'{"controller_id": 1, "epoch": 1, "host": "127.0.0.1", "port": 1}'
    )

    class Peers:
        def controller(self, address: str) -> RefusingController:
            return RefusingController()

    gateway = GatewayServicer(store, Peers())  # type: ignore[arg-type]
    with pytest.raises(
        RuntimeError, match="aborted PERMISSION_DENIED: the controller refused: User:ops may not"
    ):
        await gateway.CreateAcls(controller_pb2.CreateAclsRequest(), AbortingContext())  # type: ignore[arg-type]
