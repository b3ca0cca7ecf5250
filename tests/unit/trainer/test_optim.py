"""The fused AdamW the trainer builds on plain parameters takes the same steps as torch's
default (for-loop) AdamW, and sharded or mixed parameters keep the default."""

from __future__ import annotations

import torch

from tidal.trainer.config import OptimConfig
from tidal.trainer.optim import build_optimizer, fusable


def test_fused_adamw_steps_like_the_default_implementation() -> None:
    g = torch.Generator().manual_seed(0)
    start = [torch.randn(16, 8, generator=g), torch.randn(8, generator=g)]
    grads = [[torch.randn_like(w) * 10.0**-k for w in start] for k in range(4)]  # shrinking
    config = OptimConfig(lr=1e-2, weight_decay=0.1)
    fused = [torch.nn.Parameter(w.clone()) for w in start]
    plain = [torch.nn.Parameter(w.clone()) for w in start]
    optim = build_optimizer(fused, config)
    assert optim.defaults["fused"] is True
    reference = torch.optim.AdamW(
        [
            {"params": [plain[0]], "weight_decay": 0.1},
            {"params": [plain[1]], "weight_decay": 0.0},
        ],
        lr=1e-2,
        betas=config.betas,
        eps=config.eps,
        foreach=False,
    )
    for step in grads:
        for p, q, grad in zip(fused, plain, step, strict=True):
            p.grad, q.grad = grad.clone(), grad.clone()
        optim.step()
        reference.step()
    for p, q in zip(fused, plain, strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=1e-6)


def test_only_plain_floating_parameters_on_one_device_are_fused() -> None:
    assert fusable([torch.nn.Parameter(torch.zeros(2))]) is True
    assert fusable([]) is None
    ints = torch.nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False)
    assert fusable([ints]) is None
