"""Tokens per chunk of the chunked LM head; torch-free, so config, planner and step share it."""

from __future__ import annotations

from typing import Literal

ChunkSize = Literal["auto", "disabled"] | int
AUTO_CHUNK_BYTES = 64 * 2**20
"""`fused_lm_head_token_chunk_size = "auto"`: one chunk's fp32 logits take about this much."""


def resolve_chunk_size(setting: ChunkSize, vocab_size: int) -> int | None:
    """Tokens per chunk for a `fused_lm_head_token_chunk_size` setting; None = disabled."""
    if setting == "disabled":
        return None
    if setting == "auto":
        return max(1, AUTO_CHUNK_BYTES // (4 * vocab_size))
    if isinstance(setting, int) and setting > 0:
        return setting
    raise ValueError(
        f"fused_lm_head_token_chunk_size must be > 0, 'auto' or 'disabled'; got {setting!r}"
    )
