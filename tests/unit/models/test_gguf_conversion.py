"""A whole GGUF conversion in seconds, on a tiny Llama written with `gguf`'s writer (Q8_0
and F32 tensors, grouped-query attention, tied head, byte-level BPE, ChatML): the folder
gives our model the logits transformers computes from the GGUF file itself (so the
dequantization and llama.cpp's q/k row order survive), bfloat16 is float32 rounded, and
the tokenizer and template are the file's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tidal.models.gguf_import import import_gguf
from tidal.models.hf_checkpoint import load_hf_folder
from tidal.models.hf_folder import read_weights
from tidal.text.loader import load_tokenizer

from .tiny_gguf import TOKENS, tiny_llama

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_our_logits_equal_transformers_reading_the_gguf(tiny: Path, tmp_path: Path) -> None:
    imported = import_gguf(tiny, tmp_path / "out")
    assert imported.tensor_types == {"Q8_0": 9, "F32": 11} and imported.family == "llama"
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        tiny.parent, gguf_file=tiny.name, dtype=torch.float32
    ).eval()
    ours = load_hf_folder(tmp_path / "out", impl="custom").eval()
    ids = torch.randint(0, len(TOKENS), (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(
            ours(ids, torch.arange(24).expand(2, 24)),
            reference(input_ids=ids).logits,
            rtol=0,
            atol=1e-5,
        )


def test_the_folder_carries_token_ids_tokenizer_and_template(tiny: Path, tmp_path: Path) -> None:
    import_gguf(tiny, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 2)
    assert config["num_key_value_heads"] == 2 and config["tie_word_embeddings"] is True
    generation = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    ours = load_tokenizer("model", model_path=tmp_path / "out")
    theirs = transformers.AutoTokenizer.from_pretrained(tiny.parent, gguf_file=tiny.name)
    assert ours.encode("ab a") == theirs("ab a").input_ids
    assert ours.decode(ours.encode("ab a")) == "ab a"
    rendered = ours.chat_template().render(
        [{"role": "user", "content": "ab"}], add_generation_prompt=True
    )
    assert rendered == "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"
    assert ours.eos_id == 2 and ours.token_to_id("<|im_start|>") == 1


def test_bfloat16_holds_the_float32_weights_rounded(tiny: Path, tmp_path: Path) -> None:
    import_gguf(tiny, tmp_path / "fp32")
    import_gguf(tiny, tmp_path / "bf16", dtype="bfloat16")
    exact, rounded = read_weights(tmp_path / "fp32"), read_weights(tmp_path / "bf16")
    assert rounded.keys() == exact.keys()
    for name, tensor in rounded.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, exact[name].bfloat16())
    config = json.loads((tmp_path / "bf16" / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"


def test_a_second_import_replaces_the_model_folder(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    import_gguf(tiny, out, dtype="bfloat16")
    import_gguf(tiny, out)
    assert {t.dtype for t in read_weights(out).values()} == {torch.float32}
    assert not list(tmp_path.glob(".out.tmp-*"))
