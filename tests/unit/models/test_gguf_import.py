"""A real GGUF (SmolLM2-135M-Instruct, Q4_1) imported as a Hugging Face folder is one model
to Tidal and to transformers: the folder is complete (token ids, generation config,
tokenizer, ChatML template), our loader and `AutoModelForCausalLM` give the same logits,
and Tidal's tokenizer equals transformers' on text and on the rendered chat.

The conversion is cached across sessions (`tests/smollm2.py`); these tests are `slow`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tidal.models.hf_checkpoint import load_hf_folder
from tidal.models.hf_folder import read_weights
from tidal.models.layers import DecoderLM
from tidal.text.loader import load_tokenizer

from ...smollm2 import IM_END, IM_START, smollm2_folder

__all__ = ["smollm2_folder"]

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

CHAT = [
    {"role": "system", "content": "You are a calculator."},
    {"role": "user", "content": "What is 12+30? Café, 😀."},
]
TEXT = "The answer is 42. Café, naïve, 東京, 😀 → ok\n  def f(x): return x+1"


def test_the_folder_is_complete_with_every_token_id(smollm2_folder: Path) -> None:
    names = {p.name for p in smollm2_folder.iterdir()}
    assert names == {
        "config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
        "tokenizer_config.json", "chat_template.jinja",
    }  # fmt: skip
    config = json.loads((smollm2_folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["torch_dtype"] == "float32"
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (
        30, 576, 49152,
    )  # fmt: skip
    assert config["tie_word_embeddings"] is True and "quantization_config" not in config
    ids = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")}
    assert ids == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "unk_token_id": 0}
    generation = json.loads((smollm2_folder / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    weights = read_weights(smollm2_folder)
    assert "lm_head.weight" not in weights and len(weights) == 272
    assert {t.dtype for t in weights.values()} == {torch.float32}


def test_our_logits_equal_transformers_on_the_folder(smollm2_folder: Path) -> None:
    ours = load_hf_folder(smollm2_folder, impl="custom").eval()
    assert isinstance(ours, DecoderLM)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_folder, attn_implementation="sdpa", dtype=torch.float32
    ).eval()
    prompt = (
        load_tokenizer("model", model_path=smollm2_folder)
        .chat_template()
        .render(CHAT, add_generation_prompt=True)
    )
    chat_ids = reference_tokenizer(smollm2_folder)(prompt).input_ids
    g = torch.Generator().manual_seed(1)
    random_ids = torch.randint(0, 49152, (len(chat_ids),), generator=g).tolist()
    ids = torch.tensor([chat_ids, random_ids])  # (2, T)
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        expected = reference(input_ids=ids).logits  # (2, T, V)
        got = ours(ids, positions)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    # A pretrained chat model, not noise: it answers the prompt's question with a number.
    assert reference_tokenizer(smollm2_folder).decode(expected[0, -1].argmax()).strip()


def reference_tokenizer(folder: Path):  # type: ignore[no-untyped-def]
    return transformers.AutoTokenizer.from_pretrained(folder)


def test_our_tokenizer_equals_transformers_and_round_trips(smollm2_folder: Path) -> None:
    ours = load_tokenizer("model", model_path=smollm2_folder)
    theirs = reference_tokenizer(smollm2_folder)
    assert ours.encode(TEXT) == theirs(TEXT).input_ids
    assert ours.decode(ours.encode(TEXT)) == TEXT
    assert (ours.bos_id, ours.eos_id, ours.pad_id) == (1, 2, 2)
    assert ours.token_to_id(IM_START) == 1 and ours.token_to_id(IM_END) == 2


def test_the_chat_template_is_chatml_and_equals_transformers(smollm2_folder: Path) -> None:
    ours = load_tokenizer("model", model_path=smollm2_folder).chat_template()
    rendered = ours.render(CHAT, add_generation_prompt=True)
    assert rendered == (
        f"{IM_START}system\nYou are a calculator.{IM_END}\n"
        f"{IM_START}user\nWhat is 12+30? Café, 😀.{IM_END}\n{IM_START}assistant\n"
    )
    theirs = reference_tokenizer(smollm2_folder).apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True
    )
    assert rendered == theirs
    # Without a system message the template adds SmolLM's own.
    default = ours.render(CHAT[1:], add_generation_prompt=False)
    assert default.startswith(f"{IM_START}system\nYou are a helpful AI assistant named SmolLM")
