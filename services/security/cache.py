"""ACLs and tokens from etcd, kept current by a watch: the thin adapter around the pure authorizer.

One task owns the cache: it reads every record under `/security/` at one
revision, then follows the watch from the next revision. Each change batch
builds a new immutable `Authorizer` and swaps it in with one assignment, so a
request sees either the old ACL set or the new one, never half of each.

If etcd becomes unreachable the last known ACLs and tokens stay in force
(fail static): refusing every request because etcd blinked would turn an etcd
outage into a cluster outage, and granting everything would be worse. A
revoked token or removed ACL therefore takes effect when etcd is reachable
again, normally within milliseconds of the change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from coordinator.acls import SecurityChange, load_security, watch_security
from coordinator.store import CoordinatorError, MetadataStore
from services.common import limits
from services.security import tokens
from services.security.authz import AclBinding, AclError, Authorizer

log = logging.getLogger("highwater.security")


class SecurityCache:
    """The current ACL snapshot and token records of one service process."""

    def __init__(self, store: MetadataStore, *, super_users: tuple[str, ...] = ()) -> None:
        self.store = store
        self.super_users = super_users
        self.authorizer = Authorizer((), super_users)
        self._acls: dict[str, AclBinding] = {}
        self._tokens: dict[str, tokens.TokenRecord] = {}
        self._task: asyncio.Task[None] | None = None
        # Set after the first complete read; tests wait on it.
        self.loaded = asyncio.Event()
        # Bumped on every applied change (tests and metrics can tell the cache moved).
        self.changes_applied = 0

    async def start(self) -> None:
        """Read everything once (raises CoordinatorUnavailable if etcd is down), then follow the watch."""
        revision = await self._reload()
        self._task = asyncio.create_task(self._follow(revision), name="security-cache")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    # ---- reading ----------------------------------------------------------------------------

    def verify_token(self, token: str, now_ms: int) -> str | None:
        parsed = tokens.parse_token(token)
        if parsed is None:
            return None
        token_id, secret = parsed
        return tokens.verify(self._tokens.get(token_id), secret, now_ms)

    # ---- following etcd -----------------------------------------------------------------------

    async def _reload(self) -> int:
        snapshot = await load_security(self.store)
        self._acls = {}
        self._tokens = {}
        for name, value in snapshot.acls.items():
            self._put_acl(name, value)
        for name, value in snapshot.tokens.items():
            self._put_token(name, value)
        self._publish()
        self.loaded.set()
        return snapshot.revision

    async def _follow(self, revision: int) -> None:
        backoff_s = limits.SECURITY_RELOAD_BACKOFF_S_MIN
        while True:
            try:
                async for changes in watch_security(self.store, revision + 1):
                    self._apply(changes)
                    backoff_s = limits.SECURITY_RELOAD_BACKOFF_S_MIN
                log.warning("the watch on ACLs and tokens ended; reading them again")
            except asyncio.CancelledError:
                raise
            except (CoordinatorError, Exception) as exc:
                log.warning(
                    "the watch on ACLs and tokens failed (%s); keeping the last known set and "
                    "reading again in %.1f s",
                    exc,
                    backoff_s,
                )
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, limits.SECURITY_RELOAD_BACKOFF_S_MAX)
            try:
                revision = await self._reload()
            except CoordinatorError as exc:
                log.warning("reading ACLs and tokens failed (%s); keeping the last known set", exc)

    def _apply(self, changes: list[SecurityChange]) -> None:
        for change in changes:
            if change.kind == "acl":
                if change.value is None:
                    self._acls.pop(change.name, None)
                else:
                    self._put_acl(change.name, change.value)
            elif change.value is None:
                self._tokens.pop(change.name, None)
            else:
                self._put_token(change.name, change.value)
        self._publish()

    def _put_acl(self, name: str, value: dict[str, Any]) -> None:
        try:
            self._acls[name] = AclBinding.from_dict(value)
        except AclError as exc:
            log.warning("ignoring ACL record %s: %s", name, exc)

    def _put_token(self, name: str, value: dict[str, Any]) -> None:
        try:
            self._tokens[name] = tokens.TokenRecord.from_dict(value)
        except ValueError as exc:
            log.warning("ignoring token record %s: %s", name, exc)

    def _publish(self) -> None:
        self.authorizer = Authorizer(self._acls.values(), self.super_users)
        self.changes_applied += 1
        log.info("security cache: %d ACLs, %d tokens", len(self._acls), len(self._tokens))
