"""Bearer tokens for clients that do not use certificates: format, hashing, verification.

A token reads `hwt.<token_id>.<secret>`: token_id (16 hex digits) names its
record in etcd (`/security/tokens/{token_id}`), secret is 32 random bytes in
URL-safe base64. Only sha256(salt + secret) is stored, with a per-token random
salt, so a copy of etcd does not hand out working tokens.

Why sha256 and not a slow KDF (scrypt, PBKDF2): a KDF protects low-entropy
secrets chosen by people against guessing. These secrets are 256 random bits;
nobody can enumerate them, and a salted sha256 costs about a microsecond, so
every request can be checked without a cache of verified tokens.

Tokens are made by the active controller's CreateToken
(services/controller/security_admin.py), which returns the token text once
and stores only the record; RevokeToken deletes the record.

Comparisons use hmac.compare_digest. Expiry is checked against the `now_ms`
the caller passes in (wall-clock milliseconds): this module reads no clock.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

# The token format, shared with the client library.
from clients.common.tokens import (
    TOKEN_CHARS_MAX,
    TOKEN_DESCRIPTION_CHARS_MAX,
    TOKEN_ID_CHARS_MAX,
    TOKEN_LIFETIME_MS_MAX,
    TOKEN_SCHEME,
    bearer_value,
    is_token_id,
    parse_token,
    token_id_of,
)
from services.common.limits import TOKENS_MAX
from services.security.authz import check_principal
from services.security.identity import is_reserved_principal

# Re-exported names first (services import them from here), then this module's own.
__all__ = [
    "TOKEN_CHARS_MAX",
    "TOKEN_DESCRIPTION_CHARS_MAX",
    "TOKEN_ID_CHARS_MAX",
    "TOKEN_LIFETIME_MS_MAX",
    "TOKEN_SCHEME",
    "bearer_value",
    "is_token_id",
    "parse_token",
    "token_id_of",
    "TOKEN_ID_BYTES",
    "TOKEN_SECRET_BYTES",
    "TOKEN_SALT_BYTES",
    "TOKENS_MAX",
    "TokenError",
    "TokenRecord",
    "new_token",
    "verify",
]

# Random bytes in a token's id and secret, and in the salt its stored digest is made with.
TOKEN_ID_BYTES = 8
TOKEN_SECRET_BYTES = 32
TOKEN_SALT_BYTES = 16


class TokenError(ValueError):
    """A token cannot be created as asked (reserved principal, bad expiry)."""


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """What etcd holds for one token (never the secret itself)."""

    principal: str
    salt: bytes
    digest: bytes
    created_ms: int
    expires_ms: int  # 0: never
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "principal": self.principal,
            "salt": self.salt.hex(),
            "hash": self.digest.hex(),
            "created_ms": self.created_ms,
            "expires_ms": self.expires_ms,
            "description": self.description,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenRecord:
        """Raises ValueError for a record that is not one of ours."""
        try:
            return cls(
                check_principal(data["principal"]),
                bytes.fromhex(data["salt"]),
                bytes.fromhex(data["hash"]),
                int(data["created_ms"]),
                int(data.get("expires_ms", 0)),
                str(data.get("description", "")),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"token record {data!r} lacks a field or has a wrong type") from exc

    def expired(self, now_ms: int) -> bool:
        return self.expires_ms > 0 and now_ms >= self.expires_ms


def _digest(salt: bytes, secret: str) -> bytes:
    return hashlib.sha256(salt + secret.encode()).digest()


def new_token(
    principal: str, *, now_ms: int, expires_in_ms: int = 0, description: str = ""
) -> tuple[str, str, TokenRecord]:
    """A fresh token: (token string to hand to the client once, token id, record to store).

    Raises TokenError for a service name as principal or a negative expiry.
    """
    check_principal(principal)
    if is_reserved_principal(principal):
        raise TokenError(f"{principal} is a service identity; services authenticate with certificates only")
    if not 0 <= expires_in_ms <= TOKEN_LIFETIME_MS_MAX:
        raise TokenError(
            f"expiry must be within [0, {TOKEN_LIFETIME_MS_MAX}] ms (0: never), got {expires_in_ms}"
        )
    token_id = secrets.token_hex(TOKEN_ID_BYTES)
    secret = base64.urlsafe_b64encode(secrets.token_bytes(TOKEN_SECRET_BYTES)).decode().rstrip("=")
    salt = secrets.token_bytes(TOKEN_SALT_BYTES)
    record = TokenRecord(
        principal,
        salt,
        _digest(salt, secret),
        now_ms,
        now_ms + expires_in_ms if expires_in_ms else 0,
        description[:TOKEN_DESCRIPTION_CHARS_MAX],
    )
    return f"{TOKEN_SCHEME}.{token_id}.{secret}", token_id, record


def verify(record: TokenRecord | None, secret: str, now_ms: int) -> str | None:
    """The principal when `secret` matches an unexpired record, else None
    (unknown, revoked, expired, wrong).
    """
    if record is None:
        # Same work as a real check, so timing does not tell which token ids exist.
        hmac.compare_digest(_digest(b"\0" * TOKEN_SALT_BYTES, secret), b"\0" * 32)
        return None
    if not hmac.compare_digest(_digest(record.salt, secret), record.digest):
        return None
    if record.expired(now_ms):
        return None
    if is_reserved_principal(record.principal):
        return None  # hand-written into etcd: never let a token act as a service
    return record.principal
