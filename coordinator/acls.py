"""ACLs and client tokens in etcd: the storage side of the security layer.

Layout, under the cluster's key prefix (spelled here rather than in keys.py
because only this module and nothing in the core metadata reads it):

| key | value (JSON) | lifetime |
|---|---|---|
| `/security/acls/{digest}` | one ACL binding: principal, permission, operation, resource_type, resource_name, pattern_type, host | persistent |
| `/security/tokens/{token_id}` | principal, salt, hash (sha256 of salt + secret), created_ms, expires_ms, description | until revoked |

One key per ACL binding, named by a digest of the binding's canonical JSON:
adding is a put (adding the same binding twice is one key), removing is a
delete of the same digest, and a watch on the prefix sees each change as one
event. Nothing here interprets a binding or checks a token: that is
services/security/authz.py and services/security/tokens.py. Values are plain
dicts so the coordinator package depends on nothing above it.

Writers: the active controller, through `commit_security_changes` (one
transaction fenced by its controller epoch, so a deposed controller cannot
write), when it serves CreateAcls, DeleteAcls, CreateToken and RevokeToken.
The unfenced helpers (`add_acls`, `put_token`, ...) are for tests and for
repairs by whoever holds an etcd client certificate.

Every call may raise CoordinatorUnavailable (store.py).
"""  # noqa: E501 (a Markdown table cannot be wrapped)

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from coordinator.election import fenced_txn
from coordinator.limits import ETCD_TXN_OPS_MAX
from coordinator.store import CoordinatorError, Delete, MetadataStore, Op, Put
from coordinator.values import from_json_bytes, json_bytes

# Token ids are random hex (services/security/tokens.py); anything else is not ours.
TOKEN_ID_MAX_CHARS = 64


class SecurityKeys:
    """Key names of the security subtree under one cluster prefix."""

    __slots__ = ("acls_prefix", "prefix", "tokens_prefix")

    def __init__(self, cluster_prefix: str) -> None:
        self.prefix = f"{cluster_prefix.rstrip('/')}/security/"
        self.acls_prefix = f"{self.prefix}acls/"
        self.tokens_prefix = f"{self.prefix}tokens/"

    def acl(self, binding: dict[str, str]) -> str:
        return f"{self.acls_prefix}{acl_digest(binding)}"

    def token(self, token_id: str) -> str:
        if (
            not token_id
            or not token_id.isalnum()
            or not token_id.isascii()
            or len(token_id) > TOKEN_ID_MAX_CHARS
        ):
            raise ValueError(f"token id {token_id!r} must be 1-{TOKEN_ID_MAX_CHARS} ASCII letters or digits")
        return f"{self.tokens_prefix}{token_id}"


def acl_digest(binding: dict[str, str]) -> str:
    """A stable name for one binding: the same binding always maps to the same key."""
    return hashlib.sha256(json_bytes(binding)).hexdigest()[:32]


def security_keys(store: MetadataStore) -> SecurityKeys:
    return SecurityKeys(store.keys.prefix)


# --- ACLs ----------------------------------------------------------------------------


async def add_acls(store: MetadataStore, bindings: Iterable[dict[str, str]]) -> int:
    """Store each binding (idempotent); returns how many were new."""
    keys = security_keys(store)
    added = 0
    for binding in bindings:
        key = keys.acl(binding)
        if await store.get(key) is None:
            added += 1
        await store.put(key, json_bytes(binding))
    return added


async def remove_acls(store: MetadataStore, bindings: Iterable[dict[str, str]]) -> int:
    """Delete each binding; returns how many existed."""
    keys = security_keys(store)
    removed = 0
    for binding in bindings:
        removed += await store.delete(keys.acl(binding))
    return removed


async def list_acls(store: MetadataStore) -> list[dict[str, Any]]:
    kvs, _ = await store.get_prefix(security_keys(store).acls_prefix)
    return [_json_or_none(kv.value) or {} for kv in kvs]


# --- tokens --------------------------------------------------------------------------


async def put_token(store: MetadataStore, token_id: str, record: dict[str, Any]) -> None:
    await store.put(security_keys(store).token(token_id), json_bytes(record))


async def delete_token(store: MetadataStore, token_id: str) -> bool:
    """Revoke: delete the token's record; False when there was none."""
    return await store.delete(security_keys(store).token(token_id)) > 0


async def list_tokens(store: MetadataStore) -> dict[str, dict[str, Any]]:
    keys = security_keys(store)
    kvs, _ = await store.get_prefix(keys.tokens_prefix)
    return {kv.key[len(keys.tokens_prefix) :]: _json_or_none(kv.value) or {} for kv in kvs}


# --- the controller's fenced writes ---------------------------------------------------


async def commit_security_changes(
    store: MetadataStore, controller_epoch: int, changes: Iterable[SecurityChange]
) -> None:
    """Apply the changes in one transaction fenced by controller_epoch: all of them or none.

    A change puts its value under `/security/{acls|tokens}/{name}`, or deletes the key when
    value is None; build ACL changes with `acl_change`, which names them by digest. Raises
    ControllerFenced when controller_epoch is no longer current, CoordinatorError when the
    changes do not fit one transaction, ValueError for a malformed token id.
    """
    keys = security_keys(store)
    ops: list[Op] = []
    for change in changes:
        key = keys.token(change.name) if change.kind == "token" else f"{keys.acls_prefix}{change.name}"
        ops.append(Delete(key) if change.value is None else Put(key, json_bytes(change.value)))
    if not ops:
        return
    if len(ops) > ETCD_TXN_OPS_MAX:
        raise CoordinatorError(
            f"{len(ops)} security changes do not fit one etcd transaction (at most {ETCD_TXN_OPS_MAX})"
        )
    await fenced_txn(store, controller_epoch, [], ops)


def acl_change(binding: dict[str, str], *, delete: bool = False) -> SecurityChange:
    """The change that stores (or removes) one binding under its digest key."""
    return SecurityChange("acl", acl_digest(binding), None if delete else binding)


# --- snapshot and watch (for the services' caches) ------------------------------------


@dataclass(frozen=True, slots=True)
class SecurityChange:
    """One change under /security/: an ACL or token record put (value) or deleted (None)."""

    kind: Literal["acl", "token"]
    name: str  # the ACL digest or the token id
    value: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class SecuritySnapshot:
    acls: dict[str, dict[str, Any]]
    tokens: dict[str, dict[str, Any]]
    revision: int


async def load_security(store: MetadataStore) -> SecuritySnapshot:
    """Every ACL and token, read at one revision; watch from revision + 1 to follow it."""
    keys = security_keys(store)
    kvs, revision = await store.get_prefix(keys.prefix)
    acls: dict[str, dict[str, Any]] = {}
    tokens: dict[str, dict[str, Any]] = {}
    for kv in kvs:
        change = _classify(keys, kv.key, kv.value)
        if change is not None and change.value is not None:
            (acls if change.kind == "acl" else tokens)[change.name] = change.value
    return SecuritySnapshot(acls, tokens, revision)


async def watch_security(store: MetadataStore, start_revision: int) -> AsyncIterator[list[SecurityChange]]:
    """The changes under /security/ from start_revision on, one list per etcd watch response.

    Raises WatchCompacted when that history is gone (re-read with load_security).
    """
    keys = security_keys(store)
    async for events in store.watch_prefix(keys.prefix, start_revision=start_revision):
        changes = []
        for event in events:
            change = _classify(
                keys, event.key, event.value if event.kind == "put" else None, deleted=event.kind == "delete"
            )
            if change is not None:
                changes.append(change)
        if changes:
            yield changes


def _classify(
    keys: SecurityKeys, key: str, value: bytes | None, *, deleted: bool = False
) -> SecurityChange | None:
    parsed = None if deleted or value is None else _json_or_none(value)
    if not deleted and not isinstance(parsed, dict):
        # A hand-written or foreign value: ignore it rather than stop the cache.
        return None
    if key.startswith(keys.acls_prefix):
        return SecurityChange("acl", key[len(keys.acls_prefix) :], parsed)
    if key.startswith(keys.tokens_prefix):
        return SecurityChange("token", key[len(keys.tokens_prefix) :], parsed)
    return None


def _json_or_none(value: bytes) -> Any:
    try:
        return from_json_bytes(value)
    except (ValueError, UnicodeDecodeError):
        return None
