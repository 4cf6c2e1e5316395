"""Bearer tokens as a client sees them: the text's format and where it goes on a call.

A token reads `hwt.<token_id>.<secret>` (services/security/tokens.py makes, hashes and
checks them). A client needs only to recognise one, name it by its id for a revocation,
and send it as `authorization: Bearer <token>`. Pure: no I/O.
"""

from __future__ import annotations

# Re-exported: services/security/tokens.py and clients/tools/acl_cli.py import these bounds from here.
from clients.common.limits import TOKEN_CHARS_MAX as TOKEN_CHARS_MAX
from clients.common.limits import TOKEN_DESCRIPTION_CHARS_MAX as TOKEN_DESCRIPTION_CHARS_MAX
from clients.common.limits import TOKEN_ID_CHARS_MAX as TOKEN_ID_CHARS_MAX
from clients.common.limits import TOKEN_LIFETIME_MS_MAX as TOKEN_LIFETIME_MS_MAX

TOKEN_SCHEME = "hwt"


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
