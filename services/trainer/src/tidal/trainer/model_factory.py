"""Build the policy model from `[trainer.model]`: a local HF folder, or fresh from the config.

Fresh weights are drawn under a fixed seed inside `fork_rng` (neither depending on nor
disturbing the global RNG), in fp32: the trainer keeps fp32 master weights and lower
precision is applied later. The model, HF loading and adapters are `tidal.models`'
(inference uses them too); this module only maps the trainer's config onto them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tidal.models.attention import PackedKind, check_packed_kind
from tidal.models.hf_checkpoint import load_hf_folder
from tidal.models.hf_model import HFCausalLM
from tidal.models.layers import DecoderLM
from tidal.trainer.config import ModelConfig


def build_model(config: ModelConfig, *, seed: int, device: Any = "cpu") -> nn.Module:
    """The policy in fp32: loaded from `config.path`, else freshly initialized.

    The same (config, seed) gives the same weights.
    """
    check_packed_kind(config.attn, device)
    if config.path is not None:
        model = load_hf_folder(config.path, impl=config.impl, device=device)
        return with_packed_kind(model, config.attn)
    args = config.decoder_args()
    if config.impl == "hf":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model: nn.Module = HFCausalLM(args.to_hf_config())
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = DecoderLM(args)
            model.init_weights(config.init_std)
    return with_packed_kind(model, config.attn).to(device=device, dtype=torch.float32)


def with_packed_kind(model: nn.Module, kind: PackedKind) -> nn.Module:
    """`model` set to run packed rows with `kind`; only our implementation takes flash-attn."""
    if not isinstance(model, DecoderLM) and kind != "sdpa":
        raise ValueError(
            f'model.attn = "{kind}" needs our implementation, but the model runs on '
            'transformers (model.impl = "hf", or "auto" for an architecture we do not '
            'implement); use model.attn = "sdpa"'
        )
    model.packed_kind = kind
    return model
