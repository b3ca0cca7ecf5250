"""The optional vLLM backend: its absence breaks nothing; with vLLM and a GPU, it serves.

The GPU case runs only where vLLM and CUDA are installed (marked `gpu`); it checks the
same contract as the native engine: n completions, version tags, and behaviour logprobs
equal to the trainer's recomputation at temperature 1.
"""

from __future__ import annotations

import pytest
import torch

from tidal.common.sections import RunSection
from tidal.inference.config import InferenceConfig, InferenceRunConfig
from tidal.inference.native import NativeEngine
from tidal.inference.sampling import SamplingParams
from tidal.inference.service import build_engine
from tidal.inference.vllm_engine import INSTALL_HINT, vllm_available
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM, token_logprobs
from tidal.text.byte import ByteTokenizer


def run_config(engine: str, tmp_path) -> InferenceRunConfig:  # type: ignore[no-untyped-def]
    return InferenceRunConfig(
        run=RunSection(output_dir=tmp_path), inference=InferenceConfig(engine=engine)
    )


def test_native_is_the_default_and_needs_no_vllm(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert isinstance(build_engine(run_config("native", tmp_path), ByteTokenizer()), NativeEngine)


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
