"""Samples that continue a parent sample (a group's prompt held once): the padded backend
equals the dense reference mask, values and gradients; and a model's logprobs of each
completion after a shared prompt equal those of the completion after its own copy of the
prompt, on every family, with the MoE routers counting the prompt once per completion."""

from __future__ import annotations

import pytest
import torch

from tidal.models.attention import (
    PackedCausalAttention,
    PaddedCausalAttention,
    packed_attention,
    packed_causal_mask,
    token_multiplicity,
)
from tidal.models.moe import load_balancing_loss

from .test_model_packing import FAMILIES, next_token_logprobs, random_model

# (lengths, parents): one prompt and four completions; prompts with one and with several
# children between parentless samples; children long and short (several buckets).
LAYOUTS = [
    ([6, 3, 5, 1, 4], [-1, 0, 0, 0, 0]),
    ([4, 6, 3, 9, 1, 5, 2, 7], [-1, -1, 1, 1, 1, -1, 5, -1]),
    ([3, 30, 1, 2, 2, 14, 1], [-1, -1, 1, 1, 1, 1, 1]),
]


def test_the_mask_shows_a_child_its_parent_and_its_own_past_only() -> None:
    mask = packed_causal_mask(torch.tensor([2, 2, 1]), 5, torch.tensor([-1, 0, 0]))[0, 0]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0],
            [1, 1, 0, 0, 1],  # the second child: the prompt and itself, not its sibling
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)


@pytest.mark.parametrize(("lengths", "parents"), LAYOUTS)
def test_padded_buckets_with_parents_equal_the_dense_mask(
    lengths: list[int], parents: list[int]
) -> None:
    g = torch.Generator().manual_seed(5)
    total = sum(lengths)
    q0 = torch.randn(1, total, 4, 8, generator=g).transpose(1, 2)  # (1, H, T, D)
    k0, v0 = (torch.randn(1, total, 2, 8, generator=g).transpose(1, 2) for _ in range(2))
    upstream = torch.randn(1, 4, total, 8, generator=g)
    results = []
    for backend in (PackedCausalAttention, PaddedCausalAttention):
        q, k, v = (t.detach().clone().requires_grad_(True) for t in (q0, k0, v0))
        attention = backend(torch.tensor(lengths), total, sample_parents=torch.tensor(parents))
        out = attention(0, q, k, v)  # (1, H, T, D)
        (out * upstream).sum().backward()
        results.append((out.detach(), q.grad, k.grad, v.grad))
    # The two kernels sum in different orders: equal to a few fp32 ulps, not bit for bit.
    for dense, padded in zip(*results, strict=True):
        torch.testing.assert_close(padded, dense, rtol=1.3e-6, atol=1e-6)


@pytest.mark.parametrize("parents", [[-1, 1], [-1, 0, 1], [0, -1]])
def test_a_parent_must_precede_and_have_no_parent(parents: list[int]) -> None:
    lengths = torch.tensor([2] * len(parents))
    with pytest.raises(ValueError, match="parent"):
        PaddedCausalAttention(lengths, int(lengths.sum()), sample_parents=torch.tensor(parents))


def test_flash_attention_refuses_parents() -> None:
    with pytest.raises(ValueError, match="share a prefix"):
        packed_attention("flash_attention_2", torch.tensor([2, 2]), 4, torch.tensor([-1, 0]))


def test_token_multiplicity_counts_a_prompt_once_per_child() -> None:
    counts = token_multiplicity(torch.tensor([2, 1, 1, 1, 3]), torch.tensor([-1, 0, 0, 0, -1]))
    assert counts.tolist() == [3, 3, 1, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_completions_after_a_shared_prompt_score_as_after_their_own_copy(family: str) -> None:
    model = random_model(family)
    g = torch.Generator().manual_seed(6)
    prompt = torch.randint(0, model.args.vocab_size, (7,), generator=g)
    completions = [torch.randint(0, model.args.vocab_size, (n,), generator=g) for n in (4, 1, 6)]
    n_prompt = len(prompt)
    with torch.no_grad():
        separate, aux = [], []
        ids = torch.cat([torch.cat([prompt, c]) for c in completions])[None]
        lengths = torch.tensor([n_prompt + len(c) for c in completions])
        positions = torch.cat([torch.arange(int(n)) for n in lengths])[None]
        logits = model(ids, positions, sample_lengths=lengths)[0]  # (T, V)
        aux.append(model.aux_loss())
        start = 0
        for c in completions:
            row = ids[0, start : start + n_prompt + len(c)]
            separate.append(next_token_logprobs(logits[start : start + len(row)], row)[-len(c) :])
            start += len(row)

        ids = torch.cat([prompt, *completions])[None]
        lengths = torch.tensor([n_prompt, *(len(c) for c in completions)])
        parents = torch.tensor([-1, 0, 0, 0])
        positions = torch.cat(
            [torch.arange(n_prompt)] + [n_prompt + torch.arange(len(c)) for c in completions]
        )[None]
        logits = model(ids, positions, sample_lengths=lengths, sample_parents=parents)[0]
        aux.append(model.aux_loss())
        log_all = torch.log_softmax(logits, dim=-1)  # (T, V)
        shared, start = [], n_prompt
        for c in completions:
            scoring = torch.cat(
                [log_all[n_prompt - 1 : n_prompt], log_all[start : start + len(c) - 1]]
            )
            shared.append(scoring.gather(-1, c[:, None]).squeeze(-1))
            start += len(c)
    torch.testing.assert_close(torch.cat(shared), torch.cat(separate), rtol=0, atol=1e-5)
    torch.testing.assert_close(aux[1], aux[0], rtol=1e-5, atol=0)  # dense: both 0


def test_load_balancing_loss_is_unchanged_without_parents() -> None:
    model = random_model("qwen3_moe")
    ids = torch.randint(0, 264, (1, 9), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        model(ids, torch.arange(9)[None], sample_lengths=torch.tensor([9]))
        stats = model.router_stats()
    assert stats and all(s.n_tokens == 9 for s in stats)
    assert float(load_balancing_loss(stats, top_k=2)) > 0
