"""Extend (chunked, prefix-cached prefill) and decode forwards over the paged KV cache.

Decisions:
- The scheduler (`paged_engine.PagedEngine`) owns admission: it allocates every block a
  sequence will write before the forward, so this module never allocates and never runs
  out. It only computes, then records what is now cached: `Sequence.computed`, and the
  newly full blocks registered in the prefix cache (prompt blocks after an extend,
  completion blocks as decode fills them, so turn k+1 of an episode finds turn k's).
- An extend computes positions `[start, end)` of one sequence: a whole prompt, a chunk of
  a long one (chunked prefill), or the tokens of a preempted sequence being recomputed.
  Only the chunk that completes a fresh prompt samples, and its logits also serve the
  group's other samples (`followers`), whose full blocks are the leader's blocks, shared,
  and whose partial last block is a copy made here after the leader's forward wrote it.
- Sampling is the slot batcher's (`Batcher._sample`): the same logits and the same seeded
  uniforms give the same tokens and logprobs whichever cache held the keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tidal.inference.batching import Batcher, build_served_model
from tidal.inference.kv_cache import kv_budget_bytes, served_length
from tidal.inference.packed_linear import LinearKernel
from tidal.inference.paged_kv import PagedKVCache, blocks_within
from tidal.inference.sequence import Sequence
from tidal.models.layers import DecoderLM


@dataclass(eq=False)
class Extend:
    """One sequence's positions `[start, end)` to compute in the next extend forward."""

    leader: Sequence
    start: int
    end: int
    sample: bool
    """Whether `end` completes a fresh prompt: sample the first token of leader and followers."""
    followers: list[Sequence] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    """(leader's partial block, follower's own block) to copy once the prompt is computed."""


class PagedBatcher(Batcher):
    """Runs extend and decode steps of sequences holding blocks of a `PagedKVCache`."""

    def __init__(self, model: DecoderLM, cache: PagedKVCache, *, max_model_len: int) -> None:
        super().__init__(model, cache)  # type: ignore[arg-type]
        self.paged = cache
        self.max_model_len = max_model_len

    @classmethod
    def build_paged(
        cls,
        hf_config: dict[str, Any],
        state_dict: dict[str, torch.Tensor],
        *,
        device: torch.device,
        dtype: torch.dtype,
        kernel: LinearKernel,
        batch_hint: int,
        block_size: int,
        memory_mb: float,
        memory_fraction: float | None,
        max_model_len: int | None,
    ) -> PagedBatcher:
        """The model of the first version and a block cache of `memory_mb`, or of
        `memory_fraction` of the memory left free once the weights are loaded."""
        model = build_served_model(
            hf_config, state_dict, device=device, dtype=dtype, kernel=kernel, batch_hint=batch_hint
        )
        memory_bytes = kv_budget_bytes(device, memory_mb=memory_mb, fraction=memory_fraction)
        cap = served_length(model.args.max_seq_len, max_model_len)
        num_blocks = blocks_within(
            model.args, dtype, block_size=block_size, memory_bytes=memory_bytes, max_model_len=cap
        )
        cache = PagedKVCache(
            model.args, num_blocks=num_blocks, block_size=block_size, dtype=dtype, device=device
        )
        return cls(model, cache, max_model_len=cap)

    @property
    def max_seq_len(self) -> int:
        return self.max_model_len

    @torch.inference_mode()
    def extend(self, work: list[Extend], version: int) -> None:
        """Compute each item's positions; sample where a fresh prompt completes."""
        ids = [w.leader.all_ids[w.start : w.end] for w in work]
        inputs = torch.tensor([[t for chunk in ids for t in chunk]])  # (1, T)
        positions = torch.cat([torch.arange(w.start, w.end) for w in work])[None]  # (1, T)
        attention = self.paged.extend(
            [w.leader.blocks for w in work], [w.start for w in work], [len(c) for c in ids]
        )
        hidden = self.model.hidden_states(
            inputs.to(self.device), positions.to(self.device), attention=attention
        )  # (1, T, dim)
        manager, bs = self.paged.blocks, self.paged.block_size
        for w in work:
            w.leader.computed = w.end
            if w.leader.prefix_cacheable:
                manager.register(w.leader.blocks, w.leader.all_ids, w.start // bs, w.end // bs)
        sampling = [i for i, w in enumerate(work) if w.sample]
        if not sampling:
            return
        last = (torch.tensor([w.end - w.start for w in work]).cumsum(0) - 1)[sampling]  # (G,)
        next_logits = self.model.lm_head(hidden[0, last.to(self.device)]).float()  # (G, V)
        for i in sampling:
            for source, target in work[i].copies:
                self.paged.copy_block(source, target)
            for f in work[i].followers:
                f.computed = work[i].end
        groups = [[work[i].leader, *work[i].followers] for i in sampling]
        owner = torch.tensor(
            [g for g, members in enumerate(groups) for _ in members], device=self.device
        )
        self._sample([s for members in groups for s in members], next_logits[owner], version)

    @torch.inference_mode()
    def decode(self, sequences: list[Sequence], version: int) -> None:
        """Feed each sequence's last token (its block already allocated) and sample the next."""
        inputs = torch.tensor([[s.token_ids[-1]] for s in sequences], device=self.device)  # (B, 1)
        pos = torch.tensor([s.position for s in sequences], device=self.device)  # (B,)
        attention = self.paged.decode([s.blocks for s in sequences], pos)
        logits = self.model(inputs, pos[:, None], attention=attention)[:, -1]  # (B, V)
        manager, bs = self.paged.blocks, self.paged.block_size
        for s in sequences:
            s.computed = s.position + 1
            if s.computed % bs == 0 and s.prefix_cacheable:  # it just filled its block
                full = s.computed // bs
                manager.register(s.blocks, s.all_ids, full - 1, full)
        self._sample(sequences, logits, version)
