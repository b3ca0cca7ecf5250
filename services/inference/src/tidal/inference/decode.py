"""One static decode batch: left-padded prompts, a KV cache, one sampled token per step.

Decisions:
- Static batching: the batch's rows are fixed when it starts and it runs until every row
  has finished; finished rows ride along (their outputs are ignored) and new requests
  wait for the next batch. Continuous batching is a later step.
- Prompts are left-padded to the longest one, so every row writes its next token at the
  same cache slot and one `cache_start` serves the batch. Each row's positions start at
  0 at its first real token; padding keys are masked out. A padding query may attend
  only to itself, so no mask row is all-False (SDPA would return NaN for it).
- `step()` is one forward (the prompts on the first call, the last sampled tokens after)
  plus one sampling step, with the weights current at the call. The engine calls it in
  a worker thread and swaps weights only between calls, so every token is tagged with
  the one version whose forward produced its logits.
- A row's budget is min(max_tokens, max_seq_len - prompt length): prompt + completion
  never exceeds the model's context, which is also what the trainer can train on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tidal.inference.engine import FinishReason
from tidal.inference.sampling import SamplingParams, filtered_logprobs, sample_tokens
from tidal.trainer.models.attention import sdpa
from tidal.trainer.models.llama.model import LlamaArgs, LlamaForCausalLM


class StaticKVCache:
    """Attention backend over a preallocated cache `[L, B, H_kv, S_max, D]`.

    Before each forward the batch sets `start` (the slot of the first fed token) and
    `mask` (bool `(B, 1, T, S)`, True = attend); each layer writes its new keys/values at
    slots `[start, start + T)` of every row and attends over slots `[0, start + T)`.
    """

    def __init__(
        self, args: LlamaArgs, batch: int, max_len: int, *, dtype: torch.dtype, device: Any
    ) -> None:
        shape = (args.n_layers, batch, args.n_kv_heads, max_len, args.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, Hkv, S, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.start = 0
        self.mask: torch.Tensor | None = None

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        end = self.start + k.shape[2]
        self.k[layer, :, :, self.start : end] = k
        self.v[layer, :, :, self.start : end] = v
        return sdpa(
            q, self.k[layer, :, :, :end], self.v[layer, :, :, :end], mask=self.mask, causal=False
        )


@dataclass
class Row:
    """One sequence of a batch and what it has produced so far."""

    prompt_ids: list[int]
    params: SamplingParams
    uniforms: torch.Tensor  # (budget,) float64: one per step (unused by greedy rows)
    budget: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


def row_budget(prompt_len: int, max_tokens: int, max_seq_len: int) -> int:
    return max(0, min(max_tokens, max_seq_len - prompt_len))


class DecodeBatch:
    """Tensors of one batch; `step()` until `done`. Not thread-safe: one caller at a time."""

    def __init__(self, model: LlamaForCausalLM, rows: list[Row]) -> None:
        self.model = model
        self.rows = rows
        device = model.lm_head.weight.device
        args = model.args
        lengths = torch.tensor([len(r.prompt_ids) for r in rows], device=device)  # (B,)
        self.prompt_len = int(lengths.max())
        self.pad = self.prompt_len - lengths  # (B,) left padding per row
        steps = max(r.budget for r in rows)
        self.cache = StaticKVCache(
            args,
            len(rows),
            self.prompt_len + steps,
            dtype=model.lm_head.weight.dtype,
            device=device,
        )
        # (B, P): 0 is a harmless filler id; padded positions are masked out as keys.
        self.inputs = torch.zeros(len(rows), self.prompt_len, dtype=torch.long, device=device)
        for i, r in enumerate(rows):
            self.inputs[i, int(self.pad[i]) :] = torch.tensor(r.prompt_ids, device=device)
        self.max_seq_len = args.max_seq_len
        self.steps_done = 0
        self.temperature = torch.tensor([r.params.temperature for r in rows], device=device)
        self.top_k = torch.tensor([r.params.top_k for r in rows], device=device)
        self.top_p = torch.tensor([r.params.top_p for r in rows], device=device)
        self.greedy = self.temperature <= 0  # (B,)
        self.uniforms = torch.zeros(len(rows), steps, dtype=torch.float64)  # (B, steps) on CPU
        for i, r in enumerate(rows):
            self.uniforms[i, : r.budget] = r.uniforms[: r.budget]
        for r in rows:
            if r.budget == 0:
                r.finish_reason = "length"

    @property
    def done(self) -> bool:
        return all(r.done for r in self.rows)

    def drop(self, index: int) -> None:
        """Stop producing for a row whose caller went away (it still rides along)."""
        if not self.rows[index].done:
            self.rows[index].finish_reason = "length"

    def _positions_and_mask(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """position_ids (B, T), attn_mask (B, 1, T, S) and cache_start of the next forward."""
        p = self.prompt_len
        device = self.inputs.device
        if self.steps_done == 0:  # prefill: the whole padded prompt
            t = torch.arange(p, device=device)
            positions = (t[None, :] - self.pad[:, None]).clamp(min=0)  # (B, P)
            real_key = t[None, None, :] >= self.pad[:, None, None]  # (B, 1, P)
            causal = t[None, :, None] >= t[None, None, :]  # (1, P, P)
            self_only = torch.eye(p, dtype=torch.bool, device=device)[None]  # (1, P, P)
            mask = (real_key | self_only) & causal  # (B, P, P)
            return positions, mask[:, None], 0
        start = p + self.steps_done - 1  # slot of the token being fed
        positions = (start - self.pad)[:, None].clamp(max=self.max_seq_len - 1)  # (B, 1)
        keys = torch.arange(start + 1, device=device)
        mask = keys[None, :] >= self.pad[:, None]  # (B, S)
        return positions, mask[:, None, None, :], start

    def step(self, version: int) -> list[int]:
        """Forward, sample one token per unfinished row; return the rows that just finished."""
        with torch.inference_mode():
            positions, mask, start = self._positions_and_mask()
            self.cache.start, self.cache.mask = start, mask
            logits = self.model(self.inputs, positions, attention=self.cache)[:, -1]  # (B, V)
            logprobs = filtered_logprobs(logits, self.temperature, self.top_k, self.top_p)
            uniforms = self.uniforms[:, self.steps_done]  # (B,)
            tokens = sample_tokens(logprobs, self.greedy, uniforms)  # (B,)
            chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1)  # (B,)
            self.inputs = tokens[:, None]  # (B, 1) fed by the next step
        self.steps_done += 1
        finished: list[int] = []
        for i, (row, token, logprob) in enumerate(
            zip(self.rows, tokens.tolist(), chosen.tolist(), strict=True)
        ):
            if row.done:
                continue
            row.token_ids.append(token)
            row.logprobs.append(logprob)
            row.policy_versions.append(version)
            if token in row.params.stop_token_ids:
                row.finish_reason = "stop"
            elif len(row.token_ids) >= row.budget:
                row.finish_reason = "length"
            if row.done:
                finished.append(i)
        return finished
