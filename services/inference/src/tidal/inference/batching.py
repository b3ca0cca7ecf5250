"""The two forwards of continuous batching, prefill and decode, over a slot KV cache.

Decisions:
- The engine's scheduler decides *which* sequences run; this module only runs them: a
  prefill forward for newly admitted prompts and a decode forward for running sequences,
  each followed by one sampling step. Both are synchronous torch code the scheduler runs
  in a worker thread; only the scheduler calls them, so they never overlap.
- Prefill runs once per prompt, however many of its n samples were admitted: the prompt
  goes into the first sample's slot, the others get a copy of its cache (`fork`) and
  sample their first token from the same logits with their own uniforms. So sharing
  gives exactly the tokens that prefilling each sample separately would.
- Prompts of one prefill are packed into one `(1, T)` row without padding (positions
  restart per prompt; the cache's prefill attention keeps prompts apart); the LM head runs
  only on each prompt's last position (`model.hidden_states`, then `lm_head`), the one
  logit row sampling needs.
- A row's sampling parameters are gathered into small `(B,)` tensors per step, so rows
  with different temperatures, filters and seeds share one vectorised sampling step.
"""

from __future__ import annotations

from typing import Any

import torch

from tidal.inference.kv_cache import (
    SlotKVCache,
    kv_budget_bytes,
    served_length,
    slots_within,
)
from tidal.inference.loading import build_model, load_weights
from tidal.inference.packed_linear import LinearKernel, pack_linears
from tidal.inference.sampling import filtered_logprobs, greedy_tokens, sample_tokens
from tidal.inference.sequence import Sequence
from tidal.models.layers import DecoderLM


def build_served_model(
    hf_config: dict[str, Any],
    state_dict: dict[str, torch.Tensor],
    *,
    device: torch.device,
    dtype: torch.dtype,
    kernel: LinearKernel,
    batch_hint: int,
) -> DecoderLM:
    """The model of the first version, its linears packed if `kernel` asks, weights loaded."""
    model = build_model(hf_config, device=device, dtype=dtype)
    if kernel.packed:  # before loading: the packed copies follow every later load
        pack_linears(model, batch_hint=batch_hint, compute_dtype=kernel.compute_dtype)
    load_weights(model, state_dict)
    return model


class Batcher:
    """Runs prefill and decode steps of sequences that own slots of `cache`."""

    def __init__(self, model: DecoderLM, cache: SlotKVCache) -> None:
        self.model = model
        self.cache = cache
        self.device = model.lm_head.weight.device

    @classmethod
    def build(
        cls,
        hf_config: dict[str, Any],
        state_dict: dict[str, torch.Tensor],
        *,
        device: torch.device,
        dtype: torch.dtype,
        kernel: LinearKernel,
        max_slots: int,
        kv_cache_mb: float,
        memory_fraction: float | None = None,
        max_model_len: int | None = None,
    ) -> Batcher:
        """The model of the first version, its weights loaded, and a KV cache of slots
        `max_model_len` long within `kv_cache_mb` (or `memory_fraction` of the memory free
        once the weights are loaded)."""
        model = build_served_model(
            hf_config, state_dict, device=device, dtype=dtype, kernel=kernel, batch_hint=max_slots
        )
        length = served_length(model.args.max_seq_len, max_model_len)
        budget = kv_budget_bytes(device, memory_mb=kv_cache_mb, fraction=memory_fraction)
        slots = slots_within(
            model.args, dtype, memory_bytes=budget, max_len=length, max_slots=max_slots
        )
        cache = SlotKVCache(model.args, slots=slots, dtype=dtype, device=device, max_len=length)
        return cls(model, cache)

    @property
    def max_seq_len(self) -> int:
        """Longest sequence (prompt plus completion) this batcher serves (`max_model_len`)."""
        return self.cache.max_len

    @torch.inference_mode()
    def prefill(self, groups: list[list[Sequence]], version: int) -> None:
        """Prefill each group's shared prompt once and sample every sequence's first token."""
        lengths = [len(g[0].prompt_ids) for g in groups]
        inputs = torch.tensor([[t for g in groups for t in g[0].prompt_ids]])  # (1, T)
        positions = torch.cat([torch.arange(n) for n in lengths])[None]  # (1, T)
        attention = self.cache.prefill([g[0].slot for g in groups], lengths)
        hidden = self.model.hidden_states(
            inputs.to(self.device), positions.to(self.device), attention=attention
        )  # (1, T, dim)
        last = torch.tensor(lengths).cumsum(0) - 1  # (G,): each prompt's last position
        # The LM head on each prompt's last position only: the model's forward would compute
        # (T, V) logits, ~5% of a batch-32 generation at vocab 32000, to use G rows.
        next_logits = self.model.lm_head(hidden[0, last.to(self.device)]).float()  # (G, V)
        for g, length in zip(groups, lengths, strict=True):
            self.cache.fork(g[0].slot, [s.slot for s in g[1:]], length)
        owner = torch.tensor([i for i, g in enumerate(groups) for _ in g], device=self.device)
        self._sample([s for g in groups for s in g], next_logits[owner], version)  # (B, V)

    @torch.inference_mode()
    def decode(self, sequences: list[Sequence], version: int) -> None:
        """Feed each sequence's last token and sample its next one."""
        inputs = torch.tensor([[s.token_ids[-1]] for s in sequences], device=self.device)  # (B, 1)
        pos = torch.tensor([s.position for s in sequences], device=self.device)  # (B,)
        slots = torch.tensor([s.slot for s in sequences], device=self.device)  # (B,)
        attention = self.cache.decode(slots, pos)
        logits = self.model(inputs, pos[:, None], attention=attention)[:, -1]  # (B, V)
        self._sample(sequences, logits, version)

    def _sample(self, sequences: list[Sequence], logits: torch.Tensor, version: int) -> None:
        """One token per sequence from `logits` (B, V), recorded with its logprobs."""
        params = [s.params for s in sequences]
        if all(p.greedy for p in params):  # the model's own logprob is the sampled one
            tokens, greedy_lp = greedy_tokens(logits)  # (B,), (B,)
            chosen = greedy_lp.tolist()
            model_lp = [
                lp if p.model_logprobs else None for lp, p in zip(chosen, params, strict=True)
            ]
        else:
            tokens, chosen, model_lp = self._draw(sequences, logits)
        for s, token, lp, mlp in zip(sequences, tokens.tolist(), chosen, model_lp, strict=True):
            s.append(token, lp, mlp, version)

    def _draw(
        self, sequences: list[Sequence], logits: torch.Tensor
    ) -> tuple[torch.Tensor, list[float], list[float | None]]:
        """Filtered, seeded draws: tokens (B,), their logprobs and (on request) model logprobs."""
        params = [s.params for s in sequences]
        device = logits.device
        temperature = torch.tensor([p.temperature for p in params], device=device)  # (B,)
        top_k = torch.tensor([p.top_k for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device)
        min_p = torch.tensor([p.min_p for p in params], device=device)
        logprobs = filtered_logprobs(logits, temperature, top_k, top_p, min_p)  # (B, V)
        uniforms = torch.stack([s.uniforms[len(s.token_ids)] for s in sequences])  # (B,)
        tokens = sample_tokens(logprobs, temperature <= 0, uniforms)  # (B,)
        chosen = logprobs.gather(-1, tokens[:, None]).squeeze(-1).tolist()
        model_lp: list[float | None] = [None] * len(sequences)
        if any(p.model_logprobs for p in params):
            raw = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
            model_lp = [
                lp if p.model_logprobs else None for lp, p in zip(raw.tolist(), params, strict=True)
            ]
        return tokens, chosen, model_lp
