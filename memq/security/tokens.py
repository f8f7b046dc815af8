"""Bearer tokens: high-entropy random secrets, kept by the broker only as SHA-256 hashes.

A config entry is `PRINCIPAL:HEXDIGEST`; revoking a token is removing its entry. A SHA-256
of a 256-bit random secret needs no salt or slow hash: it cannot be guessed, only stolen.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Iterable

from memq.errors import ConfigError

TOKEN_PREFIX = "memq_"
_HEX_DIGEST_LEN = 64


@dataclass(frozen=True, slots=True)
class TokenEntry:
    principal: str
    digest: str      # hex SHA-256 of the token

    def __str__(self) -> str:
        return f"{self.principal}:{self.digest}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(principal: str) -> tuple[str, TokenEntry]:
    """A fresh token (shown once) and the entry that lets the broker recognise it."""
    if not principal or ":" in principal or any(c.isspace() for c in principal):
        raise ConfigError(f"principal {principal!r}: use a non-empty name without ':' or spaces")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, TokenEntry(principal, hash_token(token))


def parse_entry(line: str, where: str = "security.tokens") -> TokenEntry:
    principal, sep, digest = line.strip().rpartition(":")
    digest = digest.lower()
    if not sep or not principal or len(digest) != _HEX_DIGEST_LEN or not all(c in "0123456789abcdef" for c in digest):
        raise ConfigError(f"{where}: {line!r} is not 'PRINCIPAL:SHA256HEX' (make one with `memq token create`)")
    return TokenEntry(principal, digest)


def parse_entries(lines: Iterable[str], where: str = "security.tokens") -> tuple[TokenEntry, ...]:
    return tuple(parse_entry(line, f"{where}[{i}]") for i, line in enumerate(lines))


def principal_of(token: str, entries: Iterable[TokenEntry]) -> str | None:
    """The principal whose entry matches `token`, else None. Compares every entry in constant
    time, so the answer's timing tells nothing about how close a guess was."""
    digest = hash_token(token)
    found: str | None = None
    for e in entries:
        if hmac.compare_digest(digest, e.digest):
            found = e.principal
    return found
