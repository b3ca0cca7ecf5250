"""Build a model from an HF config or folder, and move its weights to and from the Hugging
Face checkpoint layout (loading, exporting, publishing); shared by trainer and inference.

`impl`: "custom" is ours (`DecoderLM`), "hf" is transformers' behind the same forward
(`hf_model.py`), "auto" is ours where we implement the architecture. Written state dicts
use HF checkpoint names (experts one tensor each, through the family's adapter) and omit
a tied `lm_head.weight`; loading goes back through the adapter and checks every name and
shape before the first copy (all or nothing). Building never touches the global RNG.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tidal.models.args import DecoderArgs
from tidal.models.dtensors import whole
from tidal.models.families import UnsupportedArchitecture, family_for_hf_config
from tidal.models.hf_folder import check_weights, read_config, read_weights
from tidal.models.hf_model import HFCausalLM
from tidal.models.layers import DecoderLM
from tidal.models.lora import merged_state_dict
from tidal.models.state_dict_adapter import StateDict, StateDictAdapter, adapter_for

TIED_HEAD = "lm_head.weight"


_BUILD_LOCK = threading.Lock()


def model_from_hf_config(
    hf_config: dict[str, Any],
    *,
    impl: str = "auto",
    device: Any = "cpu",
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """A model of the architecture an HF `config.json` describes (weights uninitialized)."""
    # One build at a time per process: fork_rng saves and restores the process-wide RNG,
    # so two threads building at once (two in-process engines loading a version, as the
    # replica tests run them) would interleave their get/set of that one state.
    with _BUILD_LOCK, torch.random.fork_rng(devices=[]):  # the init is overwritten
        if _use_custom(hf_config, impl):
            model: nn.Module = DecoderLM(DecoderArgs.from_hf_config(hf_config))
        else:
            model = HFCausalLM(hf_config)
    return model.to(device=device, dtype=dtype)


def _use_custom(hf_config: dict[str, Any], impl: str) -> bool:
    if impl == "hf":
        return False
    try:
        family_for_hf_config(hf_config)
    except UnsupportedArchitecture:
        if impl == "custom":
            raise
        return False
    return True


def load_hf_folder(folder: Path, *, impl: str = "auto", device: Any = "cpu") -> nn.Module:
    """A model with the weights of a local HF folder (fp32)."""
    config = read_config(folder)
    model = model_from_hf_config(config, impl=impl, device="cpu")
    load_published_state_dict(model, read_weights(folder))
    return model.to(device=device)


def _adapter_args(model: nn.Module) -> tuple[StateDictAdapter, DecoderArgs]:
    args: DecoderArgs = model.args
    return adapter_for(args.family), args


def publishable_state_dict(model: nn.Module, dtype: torch.dtype | None = None) -> StateDict:
    """Detached CPU copies of the weights in HF checkpoint naming (no tied `lm_head.weight`);
    floating-point ones cast to `dtype` in the same copy when given."""
    state = merged_state_dict(model)  # LoRA adapters folded in (plain state dict without)
    # FSDP-sharded weights are gathered whole (a collective: every rank calls this).
    state = {n: whole(t) for n, t in state.items()}
    if model.args.tie_embeddings:
        state.pop(TIED_HEAD, None)
    adapter, args = _adapter_args(model)
    return {
        n: t.detach().to("cpu", dtype=dtype if t.is_floating_point() else None, copy=True)
        for n, t in adapter.to_hf(state, args).items()
    }


def hf_to_native_state_dict(model: nn.Module, state_dict: StateDict) -> StateDict:
    """HF checkpoint names → `model`'s own names (its family's adapter; no copies)."""
    adapter, args = _adapter_args(model)
    return adapter.from_hf(state_dict, args)


def load_published_state_dict(model: nn.Module, state_dict: StateDict) -> None:
    """Load HF-checkpoint-named weights, all or nothing; raises WeightMismatch naming a tensor."""
    args = model.args
    native = hf_to_native_state_dict(model, state_dict)
    expected = {name: t.shape for name, t in model.state_dict().items()}
    check_weights(expected, native, optional={TIED_HEAD} if args.tie_embeddings else set())
    with torch.no_grad():
        model.load_state_dict(native, strict=False)
    if args.tie_embeddings:
        head, embed = model.get_output_embeddings(), model.get_input_embeddings()
        # load_state_dict copies in place, so the tie survives; guard against a broken tie.
        assert head.weight is embed.weight, "tied lm_head lost its tie to the embedding"
