"""The packed-attention kernels a model can run (`model.attn`), without importing torch.

Torch-free so the trainer's config validates `model.attn` without torch;
`attention.py` builds the kernels.
"""

from __future__ import annotations

from typing import Literal

PackedKind = Literal["sdpa", "flash_attention_2"]
# The optional extra in services/trainer/pyproject.toml; flash-attn builds against the
# installed torch, hence no build isolation.
FLASH_ATTN_INSTALL = (
    'on a CUDA machine: pip install "tidal-trainer[flash-attn]" --no-build-isolation'
)
