"""Our implementation equals transformers' on tiny random models of every family (fp32).

Both directions of the checkpoint round trip: a folder transformers saved loads into our
model with the same logits, and a folder we export loads into transformers with the same
logits.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tidal.models.hf_checkpoint import load_hf_folder
from tidal.models.layers import DecoderLM

from ...hf_folders import export_model
from .conftest import TINY, transformers

FAMILIES = sorted(TINY)


def inputs(vocab: int, batch: int = 2, length: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, length), generator=g)  # (B, T)
    return ids, torch.arange(length).expand(batch, length)


@pytest.mark.parametrize("name", FAMILIES)
def test_our_logits_equal_transformers(
    name: str, hf_model: Callable[..., Any], tmp_path: Path
) -> None:
    reference = hf_model(name)
    reference.save_pretrained(tmp_path)
    ours = load_hf_folder(tmp_path, impl="custom")
    assert isinstance(ours, DecoderLM)
    ids, pos = inputs(reference.config.vocab_size)
    with torch.no_grad():
        expected = reference(input_ids=ids).logits  # (B, T, V)
        got = ours(ids, pos)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_exported_folder_loads_in_transformers_with_the_same_logits(
    name: str, hf_model: Callable[..., Any], tmp_path: Path
) -> None:
    hf_model(name).save_pretrained(tmp_path / "reference")
    ours = load_hf_folder(tmp_path / "reference", impl="custom")
    export_model(ours, tmp_path / "exported")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "exported", attn_implementation="sdpa", dtype=torch.float32
    ).eval()
    assert type(reloaded).__name__ == TINY[name][0].replace("Config", "ForCausalLM")
    ids, pos = inputs(ours.args.vocab_size)
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(input_ids=ids).logits, ours(ids, pos), rtol=0, atol=1e-5
        )
