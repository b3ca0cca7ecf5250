"""`RopeScaling`: RoPE frequency scaling settings, shared by `DecoderArgs` and the HF mapping.

Torch-free with no imports of ours, so `args.py` and `hf_config.py` (below it) both use it.
"""

from __future__ import annotations

from dataclasses import dataclass

ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling: "linear" (positions / factor) or Llama 3.1's "llama3"."""

    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.type not in ROPE_TYPES:
            raise ValueError(
                f"rope scaling type {self.type!r} is not supported; supported: {ROPE_TYPES}"
            )
        if self.type == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"llama3 rope scaling needs high_freq_factor ({self.high_freq_factor}) > "
                f"low_freq_factor ({self.low_freq_factor})"
            )
