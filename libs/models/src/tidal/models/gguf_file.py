"""What a GGUF file says, checked before anything slow: its architecture and tensor types.

A `.gguf` is converted once into a Hugging Face folder (`gguf_import.py`); this module
refuses what that conversion could not carry, naming the GGUF field at fault: an
architecture our families lack (`general.architecture`), a tensor type `gguf` cannot
dequantize. Reading maps the file, so a check costs no dequantization. Torch-free, and
`gguf` is imported on first use, so the CLI parses its options without either.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidal.models.families import FAMILIES

GGUF_FAMILIES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
}
"""GGUF `general.architecture` → our family (llama.cpp spells the MoE ones without `_`)."""
assert set(GGUF_FAMILIES.values()) <= set(FAMILIES)

DTYPES = ("float32", "bfloat16")
"""What the dequantized weights are written as; float32 holds them exactly."""
DEFAULT_DTYPE = "float32"
ARCHITECTURE = "general.architecture"
TOKENIZER_MODEL = "tokenizer.ggml.model"
INSTALL_HINT = "install the gguf extra: pip install 'tidal-models[gguf]'"


class GGUFImportError(ValueError):
    """A GGUF file is missing, unreadable, or holds what Tidal cannot convert."""


@dataclass(frozen=True)
class GGUFSummary:
    path: Path
    architecture: str  # general.architecture, as the file spells it
    family: str  # our family
    tensor_types: dict[str, int]  # GGML type name → tensor count
    name: str | None  # general.name


def read_gguf(path: Path) -> GGUFSummary:
    """The file's architecture and tensor types; raises GGUFImportError naming the field."""
    path = Path(path)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise GGUFImportError(f"{path} {what}: give the path of a .gguf file")
    gguf = import_gguf_package()
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as exc:  # bad magic, unknown version or tensor type id
        raise GGUFImportError(f"{path} is not a GGUF file gguf can read: {exc}") from None
    architecture = _string_field(reader, ARCHITECTURE)
    if architecture is None:
        raise GGUFImportError(f"{path} has no {ARCHITECTURE}: cannot tell its model family")
    family = GGUF_FAMILIES.get(architecture)
    if family is None:
        raise GGUFImportError(
            f"{path}: {ARCHITECTURE} = {architecture!r} is not a Tidal model family; "
            f"supported: {sorted(GGUF_FAMILIES)}"
        )
    if _string_field(reader, TOKENIZER_MODEL) is None:
        raise GGUFImportError(
            f"{path} has no {TOKENIZER_MODEL}: it carries no tokenizer, and a model folder "
            "needs one"
        )
    types: Counter[str] = Counter()
    for tensor in reader.tensors:
        if not dequantizable(tensor.tensor_type):
            raise GGUFImportError(
                f"{path}: tensor {tensor.name} has type {tensor.tensor_type.name}, which gguf "
                f"{_version()} cannot dequantize; re-quantize the model to a supported type "
                "(F32, F16, BF16, Q8_0, Q4_K, …)"
            )
        types[tensor.tensor_type.name] += 1
    if not types:
        raise GGUFImportError(f"{path} holds no tensors")
    name = _string_field(reader, "general.name")
    return GGUFSummary(path, architecture, family, dict(types), name)


@functools.cache
def dequantizable(qtype: Any) -> bool:
    """Whether `gguf` dequantizes tensors of GGML type `qtype` (tried on one zero block)."""
    import numpy as np

    gguf = import_gguf_package()
    _, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    try:
        gguf.dequantize(np.zeros(block_bytes, dtype=np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def import_gguf_package() -> Any:
    try:
        import gguf
    except ImportError as exc:
        raise ImportError(f"reading GGUF needs the gguf package: {INSTALL_HINT}") from exc
    return gguf


def _string_field(reader: Any, key: str) -> str | None:
    field = reader.get_field(key)
    if field is None:
        return None
    value = field.contents()
    return value if isinstance(value, str) else None


def _version() -> str:
    from importlib.metadata import version

    return version("gguf")
