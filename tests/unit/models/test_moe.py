"""The mixture-of-experts block: grouped compute, load-balancing loss and load metrics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tidal.models import moe
from tidal.models.args import DecoderArgs
from tidal.models.hf_checkpoint import load_hf_folder
from tidal.models.layers import DecoderLM
from tidal.models.moe import MoEFeedForward, grouped_mm

ARGS = DecoderArgs(
    vocab_size=64, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=32,
    family="qwen3_moe", n_experts=4, n_experts_per_tok=2, moe_ffn_dim=16,
)  # fmt: skip


def reference_moe(block: MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    """Token by token, expert by expert: the obviously-correct definition. x (N, H)."""
    probs = torch.softmax(x @ block.gate.weight.T, dim=-1)  # (N, E)
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        w, idx = torch.topk(probs[n], block.gate.top_k)
        w = w / w.sum() if block.gate.norm_topk_prob else w
        for weight, e in zip(w, idx.tolist(), strict=True):
            gate, up = (block.experts.gate_up_proj[e] @ x[n]).chunk(2)
            out[n] += weight * (block.experts.down_proj[e] @ (F.silu(gate) * up))
    return out


def random_block(seed: int = 0) -> MoEFeedForward:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = MoEFeedForward(ARGS)
        for p in block.parameters():
            torch.nn.init.normal_(p, std=0.3)
    return block


def test_grouped_experts_equal_the_per_token_reference() -> None:
    block = random_block()
    x = torch.randn(24, ARGS.dim, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(block(x[None])[0], reference_moe(block, x), rtol=0, atol=1e-5)


def test_grouped_mm_fallback_equals_the_kernel_with_empty_groups() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(10, 16, generator=g)  # (M, K)
    w = torch.randn(4, 16, 8, generator=g)  # (E, K, N)
    counts = torch.tensor([3, 0, 7, 0])
    expected = torch.cat([x[:3] @ w[0], x[3:10] @ w[2]])
    torch.testing.assert_close(grouped_mm(x, w, counts), expected)
    odd = torch.randn(10, 5, generator=g)  # K not a 16-byte multiple: per-expert fallback
    w_odd = torch.randn(4, 5, 8, generator=g)
    torch.testing.assert_close(
        grouped_mm(odd, w_odd, counts), torch.cat([odd[:3] @ w_odd[0], odd[3:] @ w_odd[2]])
    )


def test_aux_loss_and_routing_logits_match_transformers(
    hf_model: Callable[..., Any], tmp_path: Path
) -> None:
    reference = hf_model("qwen3_moe")
    reference.save_pretrained(tmp_path)
    ours = load_hf_folder(tmp_path, impl="custom")
    assert isinstance(ours, DecoderLM)
    ids = torch.randint(
        0, ours.args.vocab_size, (2, 12), generator=torch.Generator().manual_seed(3)
    )
    with torch.no_grad():
        out = reference(input_ids=ids, output_router_logits=True)
        ours(ids, torch.arange(12).expand(2, 12))
    torch.testing.assert_close(ours.aux_loss(), out.aux_loss.float(), rtol=0, atol=1e-6)


def test_aux_loss_has_a_gradient_into_the_router() -> None:
    model = DecoderLM(ARGS)
    model.init_weights(0.2)
    ids = torch.randint(0, ARGS.vocab_size, (1, 16), generator=torch.Generator().manual_seed(4))
    model(ids, torch.arange(16)[None])
    model.aux_loss().backward()
    router = model.model.layers[0].mlp.gate.weight
    assert router.grad is not None and router.grad.abs().sum() > 0


def test_expert_load_counts_every_routed_slot() -> None:
    model = DecoderLM(ARGS)
    model.init_weights(0.2)
    ids = torch.randint(0, ARGS.vocab_size, (2, 10), generator=torch.Generator().manual_seed(5))
    model(ids, torch.arange(10).expand(2, 10))
    (stats,) = model.router_stats()
    assert stats.n_tokens == 20 and int(stats.tokens_per_expert.sum()) == 20 * 2
    load = model.expert_load()  # (1, E)
    assert load.shape == (1, 4)
    torch.testing.assert_close(load.sum(dim=-1), torch.ones(1))


def test_balanced_routing_gives_aux_loss_top_k() -> None:
    """Each expert gets N·k/E slots and mean probability 1/E: E·Σ (k/E)(1/E) = k."""
    stats = [
        moe.RouterStats(
            tokens_per_expert=torch.tensor([5.0, 5.0, 5.0, 5.0]),
            prob_per_expert=torch.full((4,), 10 / 4),
            n_tokens=10,
        )
    ]
    assert float(moe.load_balancing_loss(stats, top_k=2)) == pytest.approx(2.0)
