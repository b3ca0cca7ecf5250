"""Context parallelism: one packed sequence split along tokens over the CP ranks.

Rank r keeps the zigzag chunks r and 2·cp-1-r of the row, so every rank does the same
causal work. Which keys a query sees follows from global indices and sample ids (the
packed block-diagonal causal mask, evaluated block by block). Both styles are
`AttentionBackend`s, so the model does not change: `UlyssesAttention` all-to-alls heads
for tokens; `RingAttention` passes key/value blocks round the ring and merges partial
results by their log-sum-exp, which CPU SDPA does not return, hence written-out math.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_to_all_single

from tidal.models.attention import sdpa


def shard_indices(total: int, cp: int, rank: int) -> torch.Tensor:
    """Global token indices rank `rank` holds: zigzag chunks r and 2·cp-1-r. `(T/cp,)`"""
    if total % (2 * cp):
        raise ValueError(
            f"a CP-sharded row needs a length divisible by 2·cp = {2 * cp}, got {total}"
        )
    size = total // (2 * cp)
    first = torch.arange(rank * size, (rank + 1) * size)
    last_chunk = 2 * cp - 1 - rank
    second = torch.arange(last_chunk * size, (last_chunk + 1) * size)
    return torch.cat([first, second])


def block_mask(
    q_index: torch.Tensor, q_seg: torch.Tensor, k_index: torch.Tensor, k_seg: torch.Tensor
) -> torch.Tensor:
    """Packed causal mask `(Tq, Tk)` between tokens given by global index and sample id."""
    return (q_seg[:, None] == k_seg[None, :]) & (k_index[None, :] <= q_index[:, None])


class UlyssesAttention:
    """All-to-all over heads: every rank attends over all tokens for `H / cp` heads."""

    def __init__(self, group: Any, index: torch.Tensor, segments: torch.Tensor) -> None:
        """`index`: global index of every token in rank order (all ranks' shards
        concatenated), `segments`: sample id per global index."""
        self.group = group
        self.cp = dist.get_world_size(group)
        order = index
        seg = segments[order]
        self.mask = block_mask(order, seg, order, seg)[None, None]  # (1, 1, T, T)

    def _scatter_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, T/cp, D) on each rank → (B, H/cp, T, D): my heads, everyone's tokens."""
        b, h, t, d = x.shape
        if h % self.cp:
            raise ValueError(
                f"Ulysses CP needs the attention heads ({h}) divisible by cp ({self.cp}); "
                "use trainer.parallel.cp_style = 'ring' or another cp"
            )
        send = x.reshape(b, self.cp, h // self.cp, t, d).transpose(0, 1).contiguous()
        recv = all_to_all_single(torch.empty_like(send), send, group=self.group)
        # recv[j] = rank j's tokens of my heads: (cp, B, H/cp, T/cp, D)
        return recv.permute(1, 2, 0, 3, 4).reshape(b, h // self.cp, self.cp * t, d)

    def _gather_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H/cp, T, D) → (B, H, T/cp, D): all heads of my tokens."""
        b, hl, t, d = x.shape
        send = x.reshape(b, hl, self.cp, t // self.cp, d).permute(2, 0, 1, 3, 4).contiguous()
        recv = all_to_all_single(torch.empty_like(send), send, group=self.group)
        # recv[j] = my tokens of rank j's heads: (cp, B, H/cp, T/cp, D)
        return recv.transpose(0, 1).reshape(b, self.cp * hl, t // self.cp, d)

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        if k.shape[1] % self.cp:  # fewer KV heads than ranks: give every rank its copies
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        q, k, v = self._scatter_heads(q), self._scatter_heads(k), self._scatter_heads(v)
        out = sdpa(q, k, v, mask=self.mask, causal=False)  # (B, H/cp, T, D)
        return self._gather_heads(out)


def _exchange(tensors: list[torch.Tensor], group: Any) -> list[torch.Tensor]:
    """Send each tensor to the next rank of the ring, receive the previous rank's."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    to = dist.get_global_rank(group, (rank + 1) % size)
    frm = dist.get_global_rank(group, (rank - 1) % size)
    received = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), to, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, r, frm, group) for r in received]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return received


def _block_scores(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Masked scores `(B, H, Tq, Tk)`; masked entries are -inf."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    return scores.masked_fill(~mask, float("-inf"))


class _RingAttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,  # (B, H, Tq, D)
        k: torch.Tensor,  # (B, H, Tk, D), GQA already expanded
        v: torch.Tensor,
        ring: RingAttention,
    ) -> torch.Tensor:
        scale = 1.0 / math.sqrt(q.shape[-1])
        out = torch.zeros_like(q, dtype=torch.float32)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        kv, owner = [k, v], ring.rank
        for step in range(ring.size):
            scores = _block_scores(q.float(), kv[0].float(), ring.mask_with(owner), scale)
            block_lse = torch.logsumexp(scores, dim=-1)  # (B, H, Tq), -inf where all masked
            new_lse = torch.logaddexp(lse, block_lse)
            safe = torch.where(torch.isinf(new_lse), torch.zeros_like(new_lse), new_lse)
            probs = torch.exp(scores - safe[..., None])  # (B, H, Tq, Tk)
            out = out * torch.exp(lse - safe)[..., None] + torch.matmul(probs, kv[1].float())
            lse = new_lse
            if step < ring.size - 1:
                kv, owner = _exchange(kv, ring.group), (owner - 1) % ring.size
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        ring: RingAttention = ctx.ring
        scale = 1.0 / math.sqrt(q.shape[-1])
        grad_out = grad_out.float()
        delta = (grad_out * out).sum(-1)  # (B, H, Tq)
        safe_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        grad_q = torch.zeros_like(q, dtype=torch.float32)
        blocks = [
            k,
            v,
            torch.zeros_like(k, dtype=torch.float32),
            torch.zeros_like(v, dtype=torch.float32),
        ]
        owner = ring.rank
        for step in range(ring.size):
            kb, vb, grad_k, grad_v = blocks
            scores = _block_scores(q.float(), kb.float(), ring.mask_with(owner), scale)
            probs = torch.exp(scores - safe_lse[..., None])  # (B, H, Tq, Tk), 0 where masked
            grad_v = grad_v + torch.matmul(probs.transpose(-1, -2), grad_out)
            grad_probs = torch.matmul(grad_out, vb.float().transpose(-1, -2))
            grad_scores = probs * (grad_probs - delta[..., None]) * scale
            grad_q = grad_q + torch.matmul(grad_scores, kb.float())
            grad_k = grad_k + torch.matmul(grad_scores.transpose(-1, -2), q.float())
            blocks = [kb, vb, grad_k, grad_v]
            if step < ring.size - 1:
                blocks = _exchange(blocks, ring.group)
                owner = (owner - 1) % ring.size
        # The block we hold now belongs to the next rank: one more hop takes its
        # accumulated gradients home (and brings ours back).
        grad_k, grad_v = _exchange(blocks[2:], ring.group) if ring.size > 1 else blocks[2:]
        return grad_q.to(q.dtype), grad_k.to(k.dtype), grad_v.to(v.dtype), None


class RingAttention:
    """Ring attention over the CP group; each rank holds the zigzag shard of the row."""

    def __init__(self, group: Any, index: torch.Tensor, segments: torch.Tensor) -> None:
        """`index`: global indices of every rank's tokens, in rank order (rank r's shard
        is `index[r·n:(r+1)·n]`); `segments`: sample id per global index."""
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.shards = index.view(self.size, -1)  # (cp, T/cp)
        self.segments = segments
        self._masks: dict[int, torch.Tensor] = {}

    def mask_with(self, owner: int) -> torch.Tensor:
        """Mask `(1, 1, Tq, Tk)` between my queries and rank `owner`'s keys."""
        if owner not in self._masks:
            mine, theirs = self.shards[self.rank], self.shards[owner]
            mask = block_mask(mine, self.segments[mine], theirs, self.segments[theirs])
            self._masks[owner] = mask[None, None]
        return self._masks[owner]

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        groups = q.shape[1] // k.shape[1]
        if groups > 1:  # GQA: expand here so the ring carries plain per-head blocks
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return _RingAttentionFn.apply(q, k, v, self)
