"""Seed derivation: every random choice in the orchestrator comes from (run seed, parts...).

SeedSequence hashing mixes the parts so that nearby integers (step 4 vs 5, prompt 0 vs 1)
give unrelated streams; a plain `seed + step` would correlate neighbouring streams.
"""

from __future__ import annotations

import zlib

import numpy as np


def derive_seed(*parts: int) -> int:
    """A non-negative int63 seed mixed from integer parts."""
    state = np.random.SeedSequence([p % (1 << 32) for p in parts]).generate_state(2)
    return int((int(state[0]) << 31) ^ int(state[1]))


def text_key(text: str) -> int:
    """A stable 32-bit integer for a string (task names in seeds; not `hash()`, which is
    salted per process)."""
    return zlib.crc32(text.encode())
