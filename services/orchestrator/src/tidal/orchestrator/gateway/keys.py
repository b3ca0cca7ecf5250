"""Episode keys: one random bearer key per agent session, valid until its episode ends.

Only the sha256 of a key is kept, mapped to its session; a key is found by its digest (a
dict lookup: timing can tell an attacker about digests, never about keys) and refused once
its deadline passed or its session closed. Keys come from `secrets`, 256 bits each, so a
key cannot be guessed and one episode's key opens nothing of another's.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Generic, TypeVar

S = TypeVar("S")

KEY_PREFIX = "tidal-ep-"


def digest(key: str) -> str:
    # surrogateescape: aiohttp keeps a header's non-UTF-8 bytes as lone surrogates
    return hashlib.sha256(key.encode(errors="surrogateescape")).hexdigest()


@dataclass
class _Entry(Generic[S]):
    session: S
    expires_at: float


@dataclass
class EpisodeKeys(Generic[S]):
    """Digest → session for the keys of open episodes."""

    clock: object = field(default=time.monotonic)
    _entries: dict[str, _Entry[S]] = field(default_factory=dict)

    def mint(self, session: S, *, ttl_s: float) -> str:
        """A fresh key for `session`, expiring `ttl_s` seconds from now."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        self._entries[digest(key)] = _Entry(session, self._now() + ttl_s)
        return key

    def session(self, key: str) -> S | None:
        """The session `key` opens, or None (unknown, expired or revoked)."""
        entry = self._entries.get(digest(key)) if key else None
        if entry is None:
            return None
        if self._now() >= entry.expires_at:
            return None
        return entry.session

    def revoke(self, key: str) -> None:
        self._entries.pop(digest(key), None)

    def __len__(self) -> int:
        return len(self._entries)

    def _now(self) -> float:
        return self.clock()  # type: ignore[operator]
