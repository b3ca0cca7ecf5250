"""The generation-engine interface every backend implements, and its domain types.

One small async interface (`generate`, `update_weights`, `status`) is all the servicer,
the OpenAI endpoint and the weight watcher see, so the native engine and vLLM are
interchangeable. Completions are yielded as each finishes (or, streaming, in pieces as it
grows), so a caller can score early. Every token carries the policy version that produced
it: a weight swap can land between two decode steps, and the trainer's importance ratios
need to know which policy sampled each token. `score` is the same forward over tokens the
engine did not sample (a teacher scoring a student's completion): no sampling, the logprob
of each given token. Errors are `tidal.common.errors` exceptions.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from tidal.inference.sampling import SamplingParams

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class TokenScores:
    """Logprobs of given tokens under the served weights: entry i scores
    `token_ids[start + i]` given the tokens before it (unmodified model distribution)."""

    start: int
    logprobs: list[float]
    ranks: list[int]
    """Rank of each scored token in its position's distribution, 1 = most likely."""
    top_ids: list[list[int]]
    """The k most likely ids at each scored position, most likely first ([] when k is 0)."""
    top_logprobs: list[list[float]]
    policy_versions: list[int]
    """Weights version that scored each token."""


@dataclass(frozen=True)
class Completion:
    """One finished completion of a prompt, or (streaming) the next piece of one."""

    index: int
    """Which of the request's n samples this is, 0-based."""
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    """Log-probability of each token under the distribution it was sampled from."""
    policy_versions: list[int]
    """Weights version that produced each token."""
    finish_reason: FinishReason | None
    """Why the completion ended; None on a streamed piece that is not the last."""
    model_logprobs: list[float] = field(default_factory=list)
    """Each token's logprob under the unmodified model distribution (when requested)."""
    text: str = ""
    """The text these tokens added (streamed pieces concatenate to the decode of all the
    completion's ids; "" from an engine without a tokenizer)."""
    prompt_scores: TokenScores | None = None
    """With `SamplingParams.prompt_logprobs`: the prompt's own tokens scored, on a
    completion's last piece."""


@dataclass(frozen=True)
class EngineStatus:
    policy_version: int
    """Version being served; -1 before the first load."""
    running: int
    """Sequences in the batch being decoded that have not finished."""
    queued: int
    """Requests waiting for the next batch."""
    generated_tokens: int
    tokens_per_s: float
    """Generated tokens per second over the last few seconds."""
    model: str
    """The served architecture: family, shape, vocabulary, tied head, size, e.g.
    "qwen3-28x1024 (vocab 151,936, tied, 596M params)" (`loading.describe_model`)."""
    vocab_size: int
    max_seq_len: int
    kv_slots_used: int = 0
    """Sequences running (decoding or being prefilled)."""
    kv_slots_total: int = 0
    """Most sequences running together (`max_batch_size`)."""
    kv_usage: float = 0.0
    """Fraction of the KV cache's blocks held by running sequences."""
    kernels: str = ""
    """Which compute path the engine chose for this machine (dtype, kernel, and why)."""
    load_error: str = ""
    """Why the newest version offered was refused; "" once a version loads."""


class Engine(abc.ABC):
    """A generation backend. Call `start()` before use and `close()` at the end."""

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    def generate(
        self, prompt_ids: list[int], params: SamplingParams, *, stream: bool = False
    ) -> AsyncIterator[Completion]:
        """Yield each of the `params.n` completions as it finishes (any order).

        With `stream`, yield pieces of each completion as it grows instead.
        """

    @abc.abstractmethod
    async def score(self, token_ids: list[int], *, start: int, top_k: int) -> TokenScores:
        """Score `token_ids[start:]` (1 <= start < len) given the tokens before each, with
        the `top_k` most likely alternatives at each position; nothing is sampled.

        Batched with generation and served from the prefix cache for the first `start`
        positions (a group's completions after one prompt compute the prompt once)."""

    @abc.abstractmethod
    async def update_weights(
        self, version: int, hf_config: dict[str, Any], state_dict: dict[str, torch.Tensor]
    ) -> None:
        """Serve these weights as `version` from the next decode step on; returns once they do.

        The first call builds the model from `hf_config`; raises ValueError (and keeps
        serving the previous version) when the weights do not fit the model.
        """

    @abc.abstractmethod
    def status(self) -> EngineStatus: ...

    @property
    def policy_version(self) -> int:
        return self.status().policy_version

    @property
    def vocab_size(self) -> int:
        return self.status().vocab_size

    @property
    def max_seq_len(self) -> int:
        return self.status().max_seq_len
