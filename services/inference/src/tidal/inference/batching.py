"""The native engine's two forwards over the paged KV cache, extend and decode, and sampling.

The scheduler decides which sequences run and has allocated every block they write; this
module only computes, then records what is now cached (`Sequence.computed`, and newly
full blocks registered in the prefix cache, completions' included, so a later turn finds
them). An extend packs its sequences' new positions into one unpadded row and runs the LM
head on each sampling prompt's last position only (and on the positions that score a
prompt's tokens, when a request asks, `prompt_scoring`). A group's samples draw their first
token from the leader's logits with their own uniforms, so sharing one prefill gives the
tokens separate prefills would. Rows with different sampling parameters share one
vectorised sampling step.
"""

from __future__ import annotations

from typing import Any

import torch

from tidal.inference.decode_attention import DecodeKernel
from tidal.inference.kv_cache import PagedKVCache, blocks_within, kv_budget_bytes, served_length
from tidal.inference.loading import build_model, load_weights
from tidal.inference.packed_linear import LinearKernel, pack_linears
from tidal.inference.prompt_scoring import fill_scores
from tidal.inference.sampling import filtered_logits, greedy_tokens, sample_tokens
from tidal.inference.scheduler import Extend
from tidal.inference.sequence import Sequence
from tidal.models.layers import DecoderLM


class Batcher:
    """Runs extend and decode steps of sequences holding blocks of `cache`."""

    def __init__(self, model: DecoderLM, cache: PagedKVCache, *, max_seq_len: int) -> None:
        self.model = model
        self.cache = cache
        self.max_seq_len = max_seq_len
        """Longest sequence (prompt plus completion) served (`max_model_len`)."""
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
        batch_hint: int,
        block_size: int,
        prefix_caching: bool,
        memory_mb: float,
        memory_fraction: float | None,
        max_model_len: int | None,
        decode_kernel: DecodeKernel,
    ) -> Batcher:
        """The model of the first version, its weights loaded, and a block cache of
        `memory_mb` (or `memory_fraction` of the memory free once the weights are loaded)."""
        model = build_model(hf_config, device=device, dtype=dtype)
        if kernel.packed:  # before loading: the packed copies follow every later load
            pack_linears(model, batch_hint=batch_hint, compute_dtype=kernel.compute_dtype)
        load_weights(model, state_dict)
        memory_bytes = kv_budget_bytes(device, memory_mb=memory_mb, fraction=memory_fraction)
        cap = served_length(model.args.max_seq_len, max_model_len)
        num_blocks = blocks_within(
            model.args, dtype, block_size=block_size, memory_bytes=memory_bytes, max_model_len=cap
        )
        cache = PagedKVCache(
            model.args,
            num_blocks=num_blocks,
            block_size=block_size,
            dtype=dtype,
            device=device,
            prefix_caching=prefix_caching,
            decode_kernel=decode_kernel,
        )
        args = model.args
        decode_kernel.warm_up(
            heads=args.n_heads, kv_heads=args.n_kv_heads, head_dim=args.head_dim, dtype=dtype
        )
        return cls(model, cache, max_seq_len=cap)

    @torch.inference_mode()
    def extend(self, work: list[Extend], version: int) -> None:
        """Compute each item's positions; sample where a fresh prompt completes."""
        ids = [w.leader.all_ids[w.start : w.end] for w in work]
        inputs = torch.tensor([[t for chunk in ids for t in chunk]])  # (1, T)
        positions = torch.cat([torch.arange(w.start, w.end) for w in work])[None]  # (1, T)
        attention = self.cache.extend(
            [w.leader.blocks for w in work], [w.start for w in work], [len(c) for c in ids]
        )
        hidden = self.model.hidden_states(
            inputs.to(self.device), positions.to(self.device), attention=attention
        )  # (1, T, dim)
        manager, bs = self.cache.blocks, self.cache.block_size
        for w in work:
            w.leader.computed = w.end
            if w.leader.prefix_cacheable:
                first, end = w.start // bs, w.end // bs
                manager.register(
                    w.leader.blocks, w.leader.all_ids, first, end, w.leader.block_hashes
                )
        ends = torch.tensor([w.end - w.start for w in work]).cumsum(0)  # (W,) row offsets
        self._score_prompts(work, hidden[0], ends.tolist(), version)
        for w in work:
            if w.sample and w.leader.budget == 0:  # scoring only: nothing to generate
                w.leader.finish_reason = "length"
        sampling = [i for i, w in enumerate(work) if w.sample and w.leader.budget > 0]
        if not sampling:
            return
        last = (ends - 1)[sampling]  # (G,)
        # The LM head on the sampled positions only: (T, V) logits would be mostly unused.
        next_logits = self.model.lm_head(hidden[0, last.to(self.device)]).float()  # (G, V)
        self.cache.copy_blocks([pair for i in sampling for pair in work[i].copies])
        for i in sampling:
            for f in work[i].followers:
                f.computed = work[i].end
        groups = [[work[i].leader, *work[i].followers] for i in sampling]
        owner = torch.tensor(
            [g for g, members in enumerate(groups) for _ in members], device=self.device
        )
        self._sample([s for members in groups for s in members], next_logits[owner], version)

    def _score_prompts(
        self, work: list[Extend], hidden: torch.Tensor, ends: list[int], version: int
    ) -> None:
        """Fill the score slots of prompts whose scored positions this extend computed;
        `hidden` (T, dim) is the packed row, `ends` each item's end offset in it."""
        for w, end in zip(work, ends, strict=True):
            buffer, leader = w.leader.owner.scores, w.leader
            if buffer is None or leader.token_ids:
                continue
            positions = buffer.positions(w.start, w.end, len(leader.prompt_ids))
            if not positions:
                continue
            offset = end - (w.end - w.start) - w.start  # row of position p is offset + p
            rows = hidden[offset + positions.start : offset + positions.stop]  # (R, dim)
            targets = torch.tensor(
                leader.prompt_ids[positions.start + 1 : positions.stop + 1], device=self.device
            )  # (R,)
            fill_scores(buffer, self.model.lm_head, rows, positions, targets, version)

    @torch.inference_mode()
    def decode(self, sequences: list[Sequence], version: int) -> None:
        """Feed each sequence's last token (its block already allocated) and sample the next."""
        inputs = torch.tensor([[s.token_ids[-1]] for s in sequences], device=self.device)  # (B, 1)
        positions = [s.position for s in sequences]
        attention = self.cache.decode([s.blocks for s in sequences], positions)
        logits = self.model(inputs, attention.reads.positions[:, None], attention=attention)[:, -1]
        manager, bs = self.cache.blocks, self.cache.block_size
        for s, position in zip(sequences, positions, strict=True):
            s.computed = position + 1
            if s.computed % bs == 0 and s.prefix_cacheable:  # it just filled its block
                full = s.computed // bs
                manager.register(s.blocks, s.all_ids, full - 1, full, s.block_hashes)
        self._sample(sequences, logits, version)  # logits (B, V)

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
        """Filtered, seeded draws: tokens (B,), their logprobs and (on request) model logprobs.

        A parameter no row uses stays None, so the common step (plain temperature-1
        sampling) builds no per-row tensors beyond the uniforms."""
        params = [s.params for s in sequences]
        device = logits.device

        def column(values: list[Any], used: bool) -> torch.Tensor | None:
            return torch.tensor(values, device=device) if used else None

        temperatures = [p.temperature for p in params]
        temperature = column(temperatures, any(t != 1 for t in temperatures))  # (B,)
        top_k = column([p.top_k for p in params], any(p.top_k > 0 for p in params))
        top_p = column([p.top_p for p in params], any(0 < p.top_p < 1 for p in params))
        min_p = column([p.min_p for p in params], any(p.min_p > 0 for p in params))
        weights = filtered_logits(logits, temperature, top_k, top_p, min_p)  # (B, V)
        uniforms = torch.tensor(
            [s.uniforms[len(s.token_ids)] for s in sequences], dtype=torch.float64
        )  # (B,)
        greedy = None if temperature is None else temperature <= 0
        tokens, chosen = sample_tokens(weights, greedy, uniforms)  # (B,), (B,)
        model_lp: list[float | None] = [None] * len(sequences)
        if any(p.model_logprobs for p in params):
            # Unscaled and unfiltered rows were drawn from the model's own distribution.
            raw = (
                chosen
                if weights is logits
                else torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
            )
            model_lp = [
                lp if p.model_logprobs else None for lp, p in zip(raw.tolist(), params, strict=True)
            ]
        return tokens, chosen.tolist(), model_lp
