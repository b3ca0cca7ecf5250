"""The tiny peaked Llama the native-engine tests run on, its engines and cache-free references,
and the Qwen3-style Hugging Face folder (tests/hf_folders.py) for tests of text.

Shared by the engine's test modules through the `tiny` fixture (test modules cannot import
each other, nor this file, under pytest's importlib mode).

The model's weights are drawn with a large std so its distributions are peaked: greedy
argmaxes and inverse-CDF draws then have clear margins, and float differences between
batched and reference forwards (or batch composition) cannot flip a token.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tidal.inference.config import InferenceConfig
from tidal.inference.engine import Completion
from tidal.inference.native import NativeEngine
from tidal.inference.sampling import (
    SamplingParams,
    draw_uniforms,
    greedy_tokens,
    row_seed,
    sample_tokens,
)
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM, token_logprobs
from tidal.text.hf_tokenizer import HFTokenizer

from ...helpers.sampled_distribution import filtered_logprobs
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
        tokenizer (the model's 64 ids fit none), so ids only."""
        defaults = InferenceConfig()
        options = {
            "max_batch_size": 128,
            "max_queue": 64,
            "max_step_tokens": defaults.max_step_tokens,
            "kv_cache_mb": defaults.kv_cache_mb,
            "dtype": torch.float32,
            **kwargs,
        }
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
        engine: NativeEngine, prompt: list[int], params: SamplingParams, *, stream: bool = False
    ) -> list[Completion]:
        """Every completion (streaming: every piece, each sample's in order) of one request,
        in sample order."""
        out = [c async for c in engine.generate(prompt, params, stream=stream)]
        return sorted(out, key=lambda c: c.index)

    @staticmethod
    async def wait_for_tokens(engine: NativeEngine, count: int) -> None:
        """Until the engine has generated `count` tokens in all."""
        while engine.status().generated_tokens < count:
            await asyncio.sleep(0.001)

    @staticmethod
    def assert_same(a: list[Completion], b: list[Completion]) -> None:
        """The same tokens, and logprobs equal to float rounding, sample by sample."""
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs))

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

    @torch.no_grad()
    def reference_completions(
        self, model: DecoderLM, prompt: list[int], params: SamplingParams
    ) -> list[Completion]:
        """What the engine must answer for `params` (seeded unless greedy): each sample drawn
        from a full recomputation per step (no cache, no batch) at the uniforms of its seed,
        with the logprob of each token under the distribution it was drawn from."""
        budget = min(params.max_tokens, self.args.max_seq_len - len(prompt))
        temperature = torch.tensor([params.temperature])  # (1,): one row's parameters
        filters = (torch.tensor([params.top_k]), torch.tensor([params.top_p]))
        min_p = torch.tensor([params.min_p])
        out = []
        for index in range(params.n):
            seed = row_seed(params.seed or 0, index)
            uniforms = draw_uniforms(seed, budget)  # (budget,), unused when greedy
            ids, logprobs = list(prompt), []
            for step in range(budget):
                logits = model(torch.tensor([ids]), torch.arange(len(ids))[None])[0, -1:]  # (1, V)
                if params.greedy:
                    token, lp = greedy_tokens(logits)
                else:
                    dist = filtered_logprobs(logits, temperature, *filters, min_p)  # (1, V)
                    token, _ = sample_tokens(dist, temperature <= 0, uniforms[step : step + 1])
                    lp = dist.gather(-1, token[:, None])[:, 0]
                ids.append(int(token))
                logprobs.append(float(lp))
                if ids[-1] in params.stop_token_ids:
                    break
            tokens = ids[len(prompt) :]
            finish = "stop" if tokens[-1] in params.stop_token_ids else "length"
            out.append(Completion(index, prompt, tokens, logprobs, [0] * len(tokens), finish))
        return out


@pytest.fixture(scope="module")
def tok(qwen3_folder: Path) -> HFTokenizer:
    """The Qwen3-style folder's own BPE tokenizer."""
    return HFTokenizer.from_folder(qwen3_folder)


@pytest.fixture(scope="session")
def tiny() -> TinyLlama:
    return TinyLlama()


@pytest.fixture
async def engine(tiny: TinyLlama) -> AsyncIterator[NativeEngine]:
    """A started engine serving `tiny.model(0)` as version 0."""
    async with tiny.serving(0) as e:
        yield e
