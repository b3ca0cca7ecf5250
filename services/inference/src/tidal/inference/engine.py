"""The generation-engine interface every backend implements, and its domain types.

Decisions:
- One small async interface: `generate` (an async iterator of completions),
  `update_weights` (hot reload between decode steps), `status`. The servicer and the
  weight watcher see only this, so the native PyTorch engine (`tidal.inference.native`)
  and a later vLLM engine are interchangeable.
- Completions are yielded as each one finishes, not when all n of a prompt are done, so a
  caller (the orchestrator) can start scoring early. With `stream=True` each completion
  arrives in pieces as it grows: every piece carries the tokens since the previous piece
  of the same index, and the last piece has `finish_reason` set.
- A completion carries the policy version of every token: a weight swap can land between
  two decode steps of a running completion, and the trainer's importance ratios need to
  know which policy produced each token.
- Errors are `tidal.common.errors` exceptions: `Unavailable` before the first weights,
  `ResourceExhausted` when the queue is full.
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
    """The served architecture: family, shape, size, e.g. "qwen3-28x1024 (596M params)"."""
    vocab_size: int
    max_seq_len: int
    kv_slots_used: int = 0
    """KV-cache slots held by running sequences."""
    kv_slots_total: int = 0
    kv_usage: float = 0.0
    """Fraction of the KV cache's token positions holding a running sequence's tokens."""
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
