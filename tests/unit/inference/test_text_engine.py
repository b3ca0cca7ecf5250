"""The native engine serving a Hugging Face folder with its own tokenizer (the Qwen3-style
folder of tests/hf_folders.py): text prompts, text of streamed and whole completions,
EOS ids from generation_config.json, the vocabulary check and the served model's name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tidal.inference.engine import Completion
from tidal.inference.native import NativeEngine
from tidal.inference.sampling import SamplingParams
from tidal.inference.servicer import sampling_from_proto
from tidal.models.hf_checkpoint import load_hf_folder, publishable_state_dict
from tidal.models.layers import DecoderLM
from tidal.rpc.v1 import inference_pb2 as pb
from tidal.text.hf_tokenizer import HFTokenizer


@pytest.fixture(scope="module")
def folder_model(qwen3_folder: Path) -> tuple[dict[str, Any], DecoderLM]:
    model = load_hf_folder(qwen3_folder, impl="custom")
    assert isinstance(model, DecoderLM)
    return json.loads((qwen3_folder / "config.json").read_text()), model.eval()


def joined(pieces: list[Completion], index: int) -> tuple[list[int], str]:
    mine = [p for p in pieces if p.index == index]
    return [t for p in mine for t in p.token_ids], "".join(p.text for p in mine)


async def test_text_prompt_streamed_and_whole_text_equal_the_full_decode(
    tiny: Any, tok: HFTokenizer, folder_model: tuple[dict[str, Any], DecoderLM]
) -> None:
    config, model = folder_model
    prompt = tok.encode("Hello, world! 東京は", add_special_tokens=True)
    params = SamplingParams(max_tokens=24, temperature=1.0, n=4, seed=3)
    engine = tiny.make_engine(tokenizer=tok)
    await engine.start()
    try:
        await engine.update_weights(0, config, publishable_state_dict(model))
        whole = await tiny.collect(engine, prompt, params)
        streamed = await tiny.collect(engine, prompt, params, stream=True)
        status = engine.status()
    finally:
        await engine.close()
    for c in whole:
        assert c.text == tok.decode(c.token_ids)
        ids, text = joined(streamed, c.index)
        assert ids == c.token_ids and text == c.text
    assert status.model == "qwen3-2x32 (vocab 485, tied, 37.2K params)"  # 2 layers, 485 x 32
    assert status.vocab_size == tok.vocab_size


async def test_eos_from_generation_config_ends_a_completion_unless_ignored(
    tiny: Any, tok: HFTokenizer, folder_model: tuple[dict[str, Any], DecoderLM]
) -> None:
    config, model = folder_model
    eos = tok.encode_template_text("<|endoftext|>")[0]  # generation_config's, not the tokenizer's
    assert eos in tok.eos_ids and eos != tok.eos_id
    prompt = tok.encode("The answer is", add_special_tokens=True)
    with torch.no_grad():  # make `eos` the greedy next token: its (tied) row along the state
        hidden = model.hidden_states(torch.tensor([prompt]), torch.arange(len(prompt))[None])
        state = publishable_state_dict(model)
        embed = state["model.embed_tokens.weight"].clone()
        embed[eos] = 50 * hidden[0, -1] / hidden[0, -1].norm()
        state["model.embed_tokens.weight"] = embed
    stopping = sampling_from_proto(pb.SamplingParams(max_tokens=6), eos_ids=tok.eos_ids)
    ignoring = sampling_from_proto(
        pb.SamplingParams(max_tokens=6, ignore_eos=True), eos_ids=tok.eos_ids
    )
    assert set(tok.eos_ids) <= set(stopping.stop_token_ids) and not ignoring.stop_token_ids
    engine = tiny.make_engine(tokenizer=tok)
    await engine.start()
    try:
        await engine.update_weights(0, config, state)
        (stopped,) = await tiny.collect(engine, prompt, stopping)
        (ran_on,) = await tiny.collect(engine, prompt, ignoring)
    finally:
        await engine.close()
    assert stopped.token_ids == [eos] and stopped.finish_reason == "stop"
    assert stopped.text == ""  # a special token: skipped in text, kept in the ids
    assert ran_on.token_ids[0] == eos and len(ran_on.token_ids) == 6
    assert ran_on.finish_reason == "length"


async def test_a_tokenizer_larger_than_the_embedding_is_refused_naming_both_sizes(
    tiny: Any, tok: HFTokenizer, folder_model: tuple[dict[str, Any], DecoderLM]
) -> None:
    engine = tiny.make_engine(tokenizer=tok)
    await engine.start()
    try:
        with pytest.raises(ValueError, match=rf"has {tok.vocab_size} ids .* only 64 rows"):
            await engine.update_weights(0, tiny.args.to_hf_config(), tiny.published(0))
        refused = engine.status()
        config, model = folder_model  # a version that fits is served after the refusal
        await engine.update_weights(1, config, publishable_state_dict(model))
        served = engine.status()
    finally:
        await engine.close()
    assert refused.policy_version == -1
    assert refused.load_error.startswith("version 0 refused: tokenizer ")
    assert f"{tok.vocab_size} ids" in refused.load_error and "64 rows" in refused.load_error
    assert served.policy_version == 1 and served.load_error == ""


async def test_stop_strings_need_a_tokenizer(engine: NativeEngine, tiny: Any) -> None:
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        await tiny.collect(engine, [1, 2, 3], SamplingParams(max_tokens=4, stop=("x",)))
