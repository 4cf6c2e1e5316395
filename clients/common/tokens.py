"""Bearer tokens as a client sees them: the text's format and where it goes on a call.

A token reads `hwt.<token_id>.<secret>` (services/security/tokens.py makes, hashes and
checks them). A client needs only to recognise one, name it by its id for a revocation,
and send it as `authorization: Bearer <token>`. Pure: no I/O.
"""

from __future__ import annotations

TOKEN_SCHEME = "hwt"
# A token string is at most this long; anything longer is refused before any work.
TOKEN_CHARS_MAX = 128
# Human text stored with a token, bounded like every other field.
TOKEN_DESCRIPTION_CHARS_MAX = 200
# Longest lifetime a token may be given (ten years): keeps expires_ms far inside int64.
TOKEN_LIFETIME_MS_MAX = 10 * 365 * 24 * 3600 * 1000
# Token ids are 16 hex digits; ids up to this long are accepted when read back (etcd keys, revocations).
TOKEN_ID_CHARS_MAX = 64


def is_token_id(text: str) -> bool:
    """True for what may name a token record: 1-TOKEN_ID_CHARS_MAX ASCII letters or digits."""
    return 0 < len(text) <= TOKEN_ID_CHARS_MAX and text.isascii() and text.isalnum()


def parse_token(text: str) -> tuple[str, str] | None:
    """(token_id, secret) of a well-formed token string, else None."""
    if not text or len(text) > TOKEN_CHARS_MAX:
        return None
    parts = text.split(".")
    if len(parts) != 3 or parts[0] != TOKEN_SCHEME or not parts[1] or not parts[2]:
        return None
    token_id, secret = parts[1], parts[2]
    if not is_token_id(token_id):
        return None
    return token_id, secret


def token_id_of(text: str) -> str | None:
    """The token id of a whole token (hwt.<id>.<secret>) or of a bare id, else None (for revocations)."""
    parsed = parse_token(text)
    if parsed is not None:
        return parsed[0]
    return text if is_token_id(text) else None


def bearer_value(header: str) -> str | None:
    """The token of an "authorization: Bearer <token>" header value, else None."""
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
