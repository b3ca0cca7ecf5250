"""The tiny peaked Llama the native-engine tests run on, its engines and cache-free references,
and the Qwen3-style Hugging Face folder (tests/hf_folders.py) for tests of text.

Shared by test_engine.py and test_continuous_batching.py through the `tiny` fixture (test
modules cannot import each other, nor this file, under pytest's importlib mode).

The model's weights are drawn with a large std so its distributions are peaked: greedy
argmaxes and inverse-CDF draws then have clear margins, and float differences between
batched and reference forwards (or batch composition) cannot flip a token.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import torch

from tidal.inference.config import InferenceConfig
from tidal.inference.engine import Completion
from tidal.inference.native import NativeEngine
from tidal.inference.paged_engine import PagedEngine
from tidal.inference.sampling import SamplingParams
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM, token_logprobs

from ...hf_folders import qwen3_folder

__all__ = ["qwen3_folder"]


class TinyLlama:
    """A dim-32 Llama by seed, engines serving it, and what the trainer would compute."""

    args = DecoderArgs(
        vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=48
    )

    def model(self, seed: int) -> DecoderLM:
        torch.manual_seed(seed)
        model = DecoderLM(self.args)
        model.init_weights(std=0.3)
        return model.eval()

    def published(self, seed: int) -> dict[str, torch.Tensor]:
        """What the trainer publishes for the model of `seed`: tied head left out."""
        state = self.model(seed).state_dict()
        return {k: v.clone() for k, v in state.items() if k != "lm_head.weight"}

    def make_engine(self, **kwargs: Any) -> NativeEngine:
        """A native engine (not started) with the service's defaults, overridable; no
        tokenizer (the model's 64 ids fit none), so ids only. `kv_cache="paged"` gives the
        paged engine (its options, e.g. `block_size`, then apply)."""
        defaults = InferenceConfig()
        options = {
            "max_batch_size": 128,
            "max_queue": 64,
            "max_step_tokens": defaults.max_step_tokens,
            "kv_cache_mb": defaults.kv_cache_mb,
            "dtype": torch.float32,
            **kwargs,
        }
        if options.pop("kv_cache", "slots") == "paged":
            return PagedEngine(device=torch.device("cpu"), seed=0, **options)
        return NativeEngine(device=torch.device("cpu"), seed=0, **options)

    @contextlib.asynccontextmanager
    async def serving(self, seed: int = 0, **kwargs: Any) -> AsyncIterator[NativeEngine]:
        """A started engine serving the model of `seed` as version 0; closed on exit."""
        engine = self.make_engine(**kwargs)
        await engine.start()
        try:
            await engine.update_weights(0, self.args.to_hf_config(), self.published(seed))
            yield engine
        finally:
            await engine.close()

    @staticmethod
    async def collect(
        engine: NativeEngine, prompt: list[int], params: SamplingParams
    ) -> list[Completion]:
        """Every completion of one request, in sample order."""
        out = [c async for c in engine.generate(prompt, params)]
        return sorted(out, key=lambda c: c.index)

    @staticmethod
    @torch.no_grad()
    def reference_greedy(model: DecoderLM, prompt: list[int], steps: int) -> list[int]:
        """Recompute the whole sequence each step: no cache, no batch, no padding."""
        ids = list(prompt)
        for _ in range(steps):
            logits = model(torch.tensor([ids]), torch.arange(len(ids))[None])  # (1, T, V)
            ids.append(int(logits[0, -1].argmax()))
        return ids[len(prompt) :]

    @staticmethod
    @torch.no_grad()
    def reference_logits(model: DecoderLM, prompt: list[int], tokens: list[int]) -> torch.Tensor:
        """The trainer's view: one forward over prompt + completion, logits `(T, V)` of tokens."""
        ids = torch.tensor([prompt + tokens])
        return model(ids, torch.arange(ids.shape[1])[None])[0, len(prompt) - 1 : -1]

    def reference_logprobs(
        self, model: DecoderLM, prompt: list[int], tokens: list[int]
    ) -> torch.Tensor:
        """The trainer's recomputed logprobs `(T,)` of `tokens` after `prompt`."""
        return token_logprobs(self.reference_logits(model, prompt, tokens), torch.tensor(tokens))


@pytest.fixture(scope="session")
def tiny() -> TinyLlama:
    return TinyLlama()


@pytest.fixture
async def engine(tiny: TinyLlama) -> AsyncIterator[NativeEngine]:
    """A started engine serving `tiny.model(0)` as version 0."""
    async with tiny.serving(0) as e:
        yield e
