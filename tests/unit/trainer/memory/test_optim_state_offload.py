"""Optimizer-state offload: same parameters as the plain optimizer, states off the device."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from pydantic import ValidationError

from tidal.trainer.config import ModelConfig, OptimConfig, TrainerConfig
from tidal.trainer.memory.optim_state_offload import (
    DiskStateStore,
    HostStateStore,
    OffloadedStateOptimizer,
)
from tidal.trainer.model_factory import build_model
from tidal.trainer.optim import build_optimizer

TINY = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=32)


def _train(config: OptimConfig, steps: int = 4) -> list[torch.Tensor]:
    """Parameters after `steps` real forward/backward/optimizer steps of a tiny model."""
    model = build_model(TINY, seed=0, device=torch.device("cpu"))
    optimizer = build_optimizer(model.parameters(), config)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        ids = torch.randint(0, 259, (1, 24), generator=g)
        logits = model(ids, torch.arange(24)[None])  # (1, 24, V)
        loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "offload",
    [{"optim_cpu_offload": True}, {"optim_offload": "disk"}],
    ids=["cpu", "disk"],
)
@pytest.mark.parametrize(
    "optim",
    [
        {"type": "adamw", "weight_decay": 0.1, "lr": 3e-3},
        {"type": "sgd", "momentum": 0.9, "weight_decay": 0.01, "lr": 0.05},
    ],
    ids=["adamw", "sgd"],
)
def test_offloaded_update_equals_torch_optimizer(optim: dict, offload: dict) -> None:
    plain = _train(OptimConfig.model_validate(optim))
    # A 16 KiB pool splits every matrix into several slices.
    pool = {"optim_offload_buffer_mb": 1 / 64}
    offloaded = _train(OptimConfig.model_validate({**optim, **offload, **pool}))
    for a, b in zip(plain, offloaded, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_build_optimizer_picks_the_store_from_config() -> None:
    model = build_model(TINY, seed=0, device=torch.device("cpu"))
    host = build_optimizer(model.parameters(), OptimConfig(optim_cpu_offload=True))
    disk = build_optimizer(model.parameters(), OptimConfig(optim_offload="disk"))
    assert isinstance(host, OffloadedStateOptimizer) and isinstance(host.store, HostStateStore)
    assert isinstance(disk, OffloadedStateOptimizer) and isinstance(disk.store, DiskStateStore)
    disk.close()


def test_disk_states_live_in_files_in_the_given_folder(tmp_path) -> None:
    model = build_model(TINY, seed=0, device=torch.device("cpu"))
    config = OptimConfig(optim_offload="disk", optim_offload_dir=tmp_path)
    optimizer = build_optimizer(model.parameters(), config)
    model(torch.randint(0, 259, (1, 8)), torch.arange(8)[None]).sum().backward()
    optimizer.step()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp_avg.f32", "exp_avg_sq.f32"]
    exp_avg = optimizer.state_dict()["state"][0]["exp_avg"]
    assert exp_avg.abs().sum() > 0  # the first moment was written to the file and read back


def test_state_dict_round_trips_through_a_plain_adamw() -> None:
    """Checkpoint format is torch's: offloaded → plain AdamW → offloaded, same trajectory."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(40, 50))
    grads = [torch.randn(40, 50) for _ in range(4)]
    offloaded = OffloadedStateOptimizer([w], kind="adamw", store="disk", lr=0.01, buffer_mb=1 / 128)
    for grad in grads[:2]:
        w.grad = grad.clone()
        offloaded.step()
    reference = torch.nn.Parameter(w.detach().clone())
    plain = torch.optim.AdamW([reference], lr=0.01, weight_decay=0.0)
    plain.load_state_dict(offloaded.state_dict())
    resumed = OffloadedStateOptimizer([w], kind="adamw", store="host", lr=0.01, buffer_mb=1 / 128)
    resumed.load_state_dict(plain.state_dict())
    for grad in grads[2:]:
        w.grad, reference.grad = grad.clone(), grad.clone()
        resumed.step()
        plain.step()
    torch.testing.assert_close(w.detach(), reference.detach(), rtol=0, atol=1e-6)
    offloaded.close()


def test_parameters_without_gradient_are_not_updated() -> None:
    a, b = torch.nn.Parameter(torch.ones(10)), torch.nn.Parameter(torch.ones(10))
    optimizer = OffloadedStateOptimizer([a, b], kind="adamw", store="host", lr=0.1)
    a.grad = torch.ones(10)
    optimizer.step()
    assert torch.equal(b.detach(), torch.ones(10)) and b not in optimizer.state
    assert int(optimizer.state[a]["step"]) == 1


RSS_SCRIPT = textwrap.dedent(
    """
    import resource, sys, torch
    from tidal.trainer.config import OptimConfig
    from tidal.trainer.optim import build_optimizer
    torch.set_num_threads(1)
    config = OptimConfig.model_validate_json(sys.argv[1])
    warm = torch.nn.Parameter(torch.zeros(4096))  # loads the kernels' code pages first
    warm.grad = torch.ones_like(warm)
    build_optimizer([warm], config).step()
    w = torch.nn.Parameter(torch.zeros(12 * 2**20))  # 48 MiB of fp32 weights
    w.grad = torch.full_like(w, 1e-3)
    opt = build_optimizer([w], config)
    open("/proc/self/clear_refs", "w").write("5")  # peak := current resident size
    before = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
    for _ in range(2):
        opt.step()
    hwm = next(ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:"))
    print(int(hwm.split()[1]) * 1024 - before)
    """
)


def _peak_growth(config: OptimConfig) -> int:
    """Bytes the peak RSS grew by during two optimizer steps, in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", RSS_SCRIPT, config.model_dump_json()],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_disk_offload_bounds_host_memory_of_the_update() -> None:
    """Plain AdamW's two states (96 MiB) become resident; the disk store keeps ~its pool."""
    plain = _peak_growth(OptimConfig())
    disk = _peak_growth(OptimConfig(optim_offload="disk", optim_offload_buffer_mb=4))
    assert plain > 90 * 2**20
    assert disk < 32 * 2**20, f"disk offload grew peak RSS by {disk / 2**20:.0f} MiB"


def test_optim_cpu_offload_and_disk_are_alternatives() -> None:
    with pytest.raises(ValidationError, match=r"optim_cpu_offload.*optim_offload"):
        OptimConfig(optim_cpu_offload=True, optim_offload="disk")


@pytest.mark.parametrize("optim", [{"optim_cpu_offload": True}, {"optim_offload": "disk"}])
def test_fsdp_cpu_offload_excludes_optimizer_offload(optim: dict) -> None:
    with pytest.raises(ValidationError, match=r"fsdp_cpu_offload.*optim_cpu_offload"):
        TrainerConfig.model_validate({"model": {"fsdp_cpu_offload": True}, "optim": optim})


def test_fsdp_cpu_offload_alone_is_valid() -> None:
    config = TrainerConfig.model_validate({"model": {"fsdp_cpu_offload": True}})
    assert config.model.fsdp_cpu_offload
