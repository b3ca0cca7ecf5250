"""Mesh-aware clipping: on plain tensors (one group) it is torch's clip_grad_norm_."""

from __future__ import annotations

import torch

from tidal.trainer.parallel.grad_norm import clip_grad_norm


def params_with_grads(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in [(4, 3), (5,), (2, 2, 2)]]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    params.append(torch.nn.Parameter(torch.zeros(3)))  # no gradient: skipped
    return params


def test_one_group_clips_exactly_like_torch() -> None:
    ours, theirs = params_with_grads(0), params_with_grads(0)
    norm = clip_grad_norm(ours, 0.5)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    assert torch.equal(norm, expected) and norm > 0.5
    for a, b in zip(ours, theirs, strict=True):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            assert torch.equal(a.grad, b.grad)


def test_a_norm_under_the_bound_leaves_gradients_alone() -> None:
    params = params_with_grads(1)
    before = [p.grad.clone() for p in params if p.grad is not None]
    norm = clip_grad_norm(params, 1e6)
    flat = torch.cat([b.flatten() for b in before])
    torch.testing.assert_close(norm, torch.linalg.vector_norm(flat))
    assert all(torch.equal(p.grad, b) for p, b in zip(params, before, strict=False))


def test_no_gradients_gives_zero() -> None:
    assert clip_grad_norm([torch.nn.Parameter(torch.ones(2))], 1.0) == 0
