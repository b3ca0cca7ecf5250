"""The optional vLLM backend: its absence breaks nothing; with vLLM and a GPU, it serves.

The GPU case runs only where vLLM and CUDA are installed (marked `gpu`); it checks the
same contract as the native engine: n completions, version tags, and behaviour logprobs
equal to the trainer's recomputation at temperature 1.
"""

from __future__ import annotations

import pytest
import torch

from tidal.common.config.shared import RunSection
from tidal.common.errors import InvalidArgument
from tidal.inference.config import InferenceConfig, InferenceRunConfig
from tidal.inference.main import build_engine
from tidal.inference.native import NativeEngine
from tidal.inference.sampling import SamplingParams
from tidal.inference.vllm_engine import INSTALL_HINT, unprocessed, vllm_available
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM, token_logprobs
from tidal.text.byte import ByteTokenizer


def run_config(engine: str, tmp_path) -> InferenceRunConfig:  # type: ignore[no-untyped-def]
    return InferenceRunConfig(
        run=RunSection(output_dir=tmp_path), inference=InferenceConfig(engine=engine)
    )


def test_native_is_the_default_and_needs_no_vllm(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = build_engine(run_config("native", tmp_path), ByteTokenizer())
    assert isinstance(engine, NativeEngine)


def test_auto_dtype_is_bf16_exactly_where_the_cpu_computes_it_natively(
    tmp_path, bf16_path: str
) -> None:  # type: ignore[no-untyped-def]
    config = run_config("native", tmp_path)
    assert config.inference.dtype == "auto"  # the default
    config.inference.device = "cpu"
    engine = build_engine(config, ByteTokenizer())
    expected = torch.bfloat16 if bf16_path == "native" else torch.float32
    assert engine.dtype == expected
    config.inference.dtype = "float32"  # an explicit dtype is kept as given
    assert build_engine(config, ByteTokenizer()).dtype == torch.float32


@pytest.mark.skipif(vllm_available(), reason="vLLM is installed here")
def test_choosing_vllm_without_it_says_what_to_install(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RuntimeError, match=r"tidal-inference\[vllm\]") as err:
        build_engine(run_config("vllm", tmp_path), ByteTokenizer())
    assert str(err.value) == INSTALL_HINT


@pytest.mark.gpu
@pytest.mark.skipif(not vllm_available(), reason="needs vLLM and a CUDA GPU")
async def test_vllm_engine_generates_with_exact_logprobs_and_versions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = DecoderArgs(
        vocab_size=512, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=128
    )
    torch.manual_seed(0)
    model = DecoderLM(args)
    model.init_weights(std=0.1)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    engine = build_engine(run_config("vllm", tmp_path), ByteTokenizer())
    await engine.start()
    await engine.update_weights(0, {**args.to_hf_config(), "torch_dtype": "float32"}, state)
    prompt = [1, 2, 3, 4]
    params = SamplingParams(max_tokens=16, temperature=1.0, n=2, seed=0)
    completions = [c async for c in engine.generate(prompt, params)]
    await engine.close()
    assert sorted(c.index for c in completions) == [0, 1]
    for c in completions:
        assert c.policy_versions == [0] * len(c.token_ids)
        ids = torch.tensor([prompt + c.token_ids])
        with torch.no_grad():
            logits = model(ids, torch.arange(ids.shape[1])[None])[0, len(prompt) - 1 : -1]
        expected = token_logprobs(logits, torch.tensor(c.token_ids))
        torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=2e-3, rtol=0)


def test_model_logprobs_are_served_by_vllm_only_where_they_equal_the_sampled_ones() -> None:
    assert unprocessed(SamplingParams(max_tokens=4, temperature=1.0))
    for other in (
        SamplingParams(max_tokens=4, temperature=0.7),
        SamplingParams(max_tokens=4, temperature=1.0, top_k=5),
        SamplingParams(max_tokens=4, temperature=1.0, top_p=0.9),
        SamplingParams(max_tokens=4, temperature=1.0, min_p=0.1),
    ):
        assert not unprocessed(other)


def gpu_model() -> tuple[DecoderArgs, DecoderLM, dict[str, torch.Tensor]]:
    args = DecoderArgs(
        vocab_size=512, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=128
    )
    torch.manual_seed(0)
    model = DecoderLM(args)
    model.init_weights(std=0.1)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    return args, model, state


@pytest.mark.gpu
@pytest.mark.skipif(not vllm_available(), reason="needs vLLM and a CUDA GPU")
async def test_vllm_engine_keeps_the_native_contract(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Stop strings, model logprobs, the max_model_len cap and hot reload, as the native
    engine's tests check them (test_engine.py, test_text_engine.py, test_kv_capacity.py)."""
    args, model, state = gpu_model()
    config = run_config("vllm", tmp_path)
    config.inference.max_model_len = 32
    engine = build_engine(config, ByteTokenizer())
    await engine.start()
    hf = {**args.to_hf_config(), "torch_dtype": "float32"}
    try:
        await engine.update_weights(0, hf, state)
        assert engine.status().max_seq_len == 32
        prompt = [1, 2, 3, 4]
        greedy = SamplingParams(max_tokens=100, temperature=0.0, seed=0)
        (full,) = [c async for c in engine.generate(prompt, greedy)]
        assert len(full.token_ids) == 28 and full.finish_reason == "length"  # 32 - 4
        # A stop string made of generated text ends the sample at the token completing it.
        tok = ByteTokenizer()
        stop = tok.decode(full.token_ids[3:5])
        if stop and stop not in tok.decode(full.token_ids[:4]):
            stopped_params = SamplingParams(max_tokens=100, temperature=0.0, stop=(stop,))
            (stopped,) = [c async for c in engine.generate(prompt, stopped_params)]
            assert stopped.finish_reason == "stop"
            assert stopped.token_ids == full.token_ids[: len(stopped.token_ids)]
            assert len(stopped.token_ids) <= 5
        # Model logprobs at temperature 1 equal the trainer's recomputation.
        sampled = SamplingParams(max_tokens=8, temperature=1.0, seed=3, model_logprobs=True)
        (c,) = [c async for c in engine.generate(prompt, sampled)]
        ids = torch.tensor([prompt + c.token_ids])
        with torch.no_grad():
            logits = model(ids, torch.arange(ids.shape[1])[None])[0, len(prompt) - 1 : -1]
        expected = token_logprobs(logits, torch.tensor(c.token_ids))
        torch.testing.assert_close(torch.tensor(c.model_logprobs), expected, atol=2e-3, rtol=0)
        with pytest.raises(InvalidArgument, match="return_model_logprobs"):
            cold = SamplingParams(max_tokens=4, temperature=0.5, model_logprobs=True)
            async for _ in engine.generate(prompt, cold):
                pass
        with pytest.raises(InvalidArgument, match=r"inference\.max_model_len"):
            async for _ in engine.generate([1] * 32, greedy):
                pass
        # Hot reload: version 1's tokens are tagged 1.
        await engine.update_weights(1, hf, {k: v * 0.5 for k, v in state.items()})
        (after,) = [c async for c in engine.generate(prompt, greedy)]
        assert set(after.policy_versions) == {1}
    finally:
        await engine.close()
