"""Convert a GGUF file into a complete Hugging Face model folder, once, so a run starts from it.

transformers reads and dequantizes the file (with `gguf`); we keep only plain tensors
from it, never its quantizer. The config.json is our family's own mapping of the file's
architecture plus every token id it declares, so Tidal and transformers read one model;
the weights are checked against our model's names and shapes before anything is written,
and `hf_folder.write_folder` writes the folder atomically with the tokenizer files, the
chat template and generation_config.json.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tidal.models.args import DecoderArgs
from tidal.models.families import UnsupportedArchitecture
from tidal.models.gguf_file import DEFAULT_DTYPE, DTYPES, GGUFImportError, read_gguf
from tidal.models.hf_checkpoint import TIED_HEAD, hf_to_native_state_dict
from tidal.models.hf_config import UnsupportedConfig
from tidal.models.hf_folder import check_replaceable, check_weights, write_folder
from tidal.models.layers import DecoderLM
from tidal.models.state_dict_adapter import StateDict, WeightMismatch

GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
LOAD_TIME_KEYS = ("is_local", "local_files_only")
"""tokenizer_config.json keys that describe how transformers loaded the file, not the tokenizer."""


@dataclass(frozen=True)
class ImportedModel:
    folder: Path
    family: str
    dtype: str
    parameters: int
    tensor_types: dict[str, int]  # of the GGUF file: GGML type → tensor count
    token_ids: dict[str, int]  # bos_token_id, eos_token_id, pad_token_id, … in config.json
    files: tuple[str, ...]  # what the folder holds


def import_gguf(path: Path, out: Path, *, dtype: str = DEFAULT_DTYPE) -> ImportedModel:
    """Write the model of the GGUF file `path` as an HF folder `out` (weights in `dtype`).

    Raises GGUFImportError naming the field Tidal cannot carry; `out`, when it exists, must
    be a model folder (replaced) or empty."""
    if dtype not in DTYPES:
        raise GGUFImportError(f"dtype {dtype!r} is not one of {list(DTYPES)}")
    path, out = Path(path), Path(out)
    summary = read_gguf(path)
    check_replaceable(out)
    transformers = _import_transformers()
    try:
        hf = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        config = _our_config(hf.to_dict(), path, dtype)
        tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model, loading = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32, output_loading_info=True
        )
    except ValueError as exc:  # what transformers' GGUF reader does not support
        if isinstance(exc, GGUFImportError):
            raise
        raise GGUFImportError(f"{path}: transformers cannot read it: {exc}") from None
    # transformers initializes a weight the file lacks at random and says so only here.
    missing = sorted(set(loading["missing_keys"]) - {TIED_HEAD})
    if missing:
        raise GGUFImportError(f"{path} lacks weights of its architecture: {missing[:8]}")
    state = _checked_state(model, config, getattr(torch, dtype))
    files = _tokenizer_files(tokenizer) | {GENERATION_CONFIG: _generation_config(config)}
    write_folder(out, config, state, extra_files=files)
    return ImportedModel(
        folder=out,
        family=summary.family,
        dtype=dtype,
        parameters=sum(t.numel() for t in state.values()),
        tensor_types=summary.tensor_types,
        token_ids=_token_ids(config),
        files=tuple(sorted(p.name for p in out.iterdir())),
    )


def _our_config(hf: dict[str, Any], path: Path, dtype: str) -> dict[str, Any]:
    """Our family's config.json of transformers' reading of the file, with its token ids."""
    try:
        args = DecoderArgs.from_hf_config(hf)
    except (UnsupportedArchitecture, UnsupportedConfig) as exc:
        raise GGUFImportError(f"{path}: {exc}") from None
    token_ids = {k: v for k, v in hf.items() if k.endswith("_token_id") and v is not None}
    return {**args.to_hf_config(), **token_ids, "torch_dtype": dtype}


def _checked_state(model: Any, config: dict[str, Any], dtype: torch.dtype) -> StateDict:
    """The model's tensors under checkpoint names, in `dtype`, checked against our model's
    names and shapes (a meta-device build: no memory)."""
    args = DecoderArgs.from_hf_config(config)
    state = {n: t.detach().to(dtype) for n, t in model.state_dict().items()}
    if args.tie_embeddings:
        state.pop(TIED_HEAD, None)
    with torch.device("meta"):
        ours = DecoderLM(args)
    expected = {name: t.shape for name, t in ours.state_dict().items()}
    optional = {TIED_HEAD} if args.tie_embeddings else set()
    try:
        check_weights(expected, hf_to_native_state_dict(ours, state), optional=optional)
    except WeightMismatch as exc:
        raise GGUFImportError(f"the file's weights do not fit its architecture: {exc}") from None
    return state


def _token_ids(config: dict[str, Any]) -> dict[str, int]:
    return {k: v for k, v in config.items() if k.endswith("_token_id")}


def _generation_config(config: dict[str, Any]) -> bytes:
    keys = ("bos_token_id", "eos_token_id", "pad_token_id")
    return json.dumps({k: config[k] for k in keys if k in config}, indent=2).encode()


def _tokenizer_files(tokenizer: Any) -> dict[str, bytes]:
    """What `save_pretrained` writes (tokenizer.json, tokenizer_config.json, the chat
    template), as bytes, without the keys that only say how it was loaded."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        files = {p.name: p.read_bytes() for p in Path(tmp).iterdir() if p.is_file()}
    settings = json.loads(files[TOKENIZER_CONFIG])
    settings = {k: v for k, v in settings.items() if k not in LOAD_TIME_KEYS}
    files[TOKENIZER_CONFIG] = json.dumps(settings, indent=2).encode()
    return files


def _import_transformers() -> Any:
    try:
        import accelerate  # noqa: F401  (transformers' GGUF loading needs it)
        import transformers
    except ImportError as exc:
        raise ImportError(
            "converting GGUF needs transformers and accelerate: pip install 'tidal-models[gguf]'"
        ) from exc
    return transformers
