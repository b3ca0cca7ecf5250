"""A real model's KV cache fits: `max_model_len` caps what a sequence's blocks may take,
the budget is bytes or a fraction of free memory, and a budget that holds not one sequence
is refused naming the keys.

Sizing is checked on the published Qwen3-0.6B shape (no weights needed); the engines run on
a Qwen3-shaped model with one tiny layer but the real 40,960-position context.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tidal.common.errors import InvalidArgument
from tidal.inference.config import InferenceConfig
from tidal.inference.kv_cache import (
    DEFAULT_MAX_MODEL_LEN,
    blocks_within,
    served_length,
    token_bytes,
)
from tidal.inference.native import NativeEngine
from tidal.inference.sampling import SamplingParams
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM

# The shape keys of Qwen3-0.6B's published config.json.
QWEN3_0_6B: dict[str, Any] = {
    "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": 128,
    "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000, "tie_word_embeddings": True,
    "vocab_size": 151936,
}  # fmt: skip
# The same context and family, one tiny layer: 256 bytes of KV per token in fp32.
TINY_QWEN3 = QWEN3_0_6B | {
    "head_dim": 16, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
    "num_hidden_layers": 1, "num_key_value_heads": 2, "vocab_size": 64,
}  # fmt: skip


def budget_bytes() -> int:
    return int(InferenceConfig().kv_cache_mb * 2**20)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_default_cache_holds_qwen3_0_6b_sequences(dtype: torch.dtype) -> None:
    args = DecoderArgs.from_hf_config(QWEN3_0_6B)
    # The model's whole context, 4.4 GiB in bf16, does not fit the default budget.
    assert token_bytes(args, dtype) * args.max_seq_len > budget_bytes()
    with pytest.raises(ValueError, match=r"inference\.max_model_len"):
        blocks_within(args, dtype, block_size=16, memory_bytes=budget_bytes(), max_model_len=40960)
    length = served_length(args.max_seq_len, InferenceConfig().max_model_len)
    assert length == DEFAULT_MAX_MODEL_LEN == 4096
    blocks = blocks_within(
        args, dtype, block_size=16, memory_bytes=budget_bytes(), max_model_len=length
    )
    # The paged cache holds at least one full-length sequence, and more short ones.
    assert blocks * 16 >= length
    assert blocks * 16 * token_bytes(args, dtype) <= budget_bytes()


def test_max_model_len_above_the_models_context_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"inference\.max_model_len = 50000 .* at most 40960"):
        served_length(40960, 50000)
    assert served_length(40960, 8192) == 8192
    assert served_length(48, None) == 48  # a short context is served whole


def make(**options: Any) -> NativeEngine:
    return NativeEngine(
        device=torch.device("cpu"),
        dtype=torch.float32,
        max_batch_size=8,
        max_queue=8,
        max_step_tokens=256,
        **options,
    )


def weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = DecoderLM(DecoderArgs.from_hf_config(TINY_QWEN3))
    model.init_weights(std=0.3)
    return {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}


async def test_a_long_context_model_is_served_within_a_small_budget() -> None:
    args = DecoderArgs.from_hf_config(TINY_QWEN3)
    # 2 MiB: five sequences of 4096 positions would not fit, one of 40,960 even less.
    assert token_bytes(args, torch.float32) * args.max_seq_len > 2 * 2**20
    engine = make(kv_cache_mb=2.0)
    await engine.start()
    try:
        await engine.update_weights(0, TINY_QWEN3, weights())
        assert engine.status().max_seq_len == DEFAULT_MAX_MODEL_LEN
        params = SamplingParams(max_tokens=6, temperature=0.0, n=2)
        done = [c async for c in engine.generate([1, 2, 3], params)]
        assert sorted(len(c.token_ids) for c in done) == [6, 6]
        with pytest.raises(InvalidArgument, match=r"inference\.max_model_len") as refused:
            async for _ in engine.generate([1] * DEFAULT_MAX_MODEL_LEN, params):
                pass
        assert refused.value.field == "prompt_ids"
    finally:
        await engine.close()


async def test_max_model_len_caps_generation() -> None:
    engine = make(kv_cache_mb=1.0, max_model_len=12, block_size=4)
    await engine.start()
    try:
        await engine.update_weights(0, TINY_QWEN3, weights())
        assert engine.status().max_seq_len == 12
        params = SamplingParams(max_tokens=50, temperature=0.0)
        (completion,) = [c async for c in engine.generate([1, 2, 3, 4, 5], params)]
        assert len(completion.token_ids) == 7 and completion.finish_reason == "length"
    finally:
        await engine.close()


async def test_a_budget_holding_no_sequence_is_refused_naming_the_keys() -> None:
    engine = make(kv_cache_mb=1024.0, kv_cache_memory_fraction=1e-12)
    await engine.start()
    try:
        with pytest.raises(ValueError, match=r"inference\.kv_cache_mb") as refused:
            await engine.update_weights(0, TINY_QWEN3, weights())
        assert "kv_cache_memory_fraction" in str(refused.value)
        assert "inference.max_model_len" in str(refused.value)
        assert "refused" in engine.status().load_error  # reported, health stays NOT_SERVING
    finally:
        await engine.close()
