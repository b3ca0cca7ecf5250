"""Activation offloading: saved tensors round-trip through host copies without changing results."""

from __future__ import annotations

import functools

import pytest
import torch

import tidal.trainer.train_step as train_step
from tidal.trainer.memory.activation_offload import ActivationOffloader, activation_offloading

from .conftest import FULL_LOSS, assert_same, loss_and_grads, make_trainer


@pytest.fixture
def copy_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the trainer's offloader really copy on CPU (on a CPU device it keeps tensors)."""
    monkeypatch.setattr(
        train_step,
        "activation_offloading",
        functools.partial(activation_offloading, copy_on_cpu=True),
    )


@pytest.mark.parametrize("inflight", [1, 3])
def test_offloading_gives_the_same_loss_and_gradients(batches, copy_on_cpu, inflight) -> None:
    off = loss_and_grads(make_trainer(FULL_LOSS), batches)
    lever = {"max_inflight_activations": inflight, "min_offload_bytes": 0}
    on = loss_and_grads(make_trainer(FULL_LOSS, ac_offloading=lever), batches)
    assert_same(on, off)


def test_offloading_combined_with_checkpointing(batches, copy_on_cpu) -> None:
    off = loss_and_grads(make_trainer(FULL_LOSS), batches)
    on = loss_and_grads(
        make_trainer(FULL_LOSS, ac={"freq": 2}, ac_offloading={"min_offload_bytes": 0}), batches
    )
    assert_same(on, off)


def test_activations_are_copied_parameters_and_small_tensors_are_not() -> None:
    linear = torch.nn.Linear(64, 64)
    x = torch.randn(8, 64, requires_grad=True)
    resident = {p.untyped_storage().data_ptr() for p in linear.parameters()}
    offloader = ActivationOffloader(
        max_inflight=2, min_bytes=1024, copy_on_cpu=True, resident=resident
    )
    with offloader.hooks():
        y = torch.relu(linear(x)).sum() + (x[:1, :1] * 2).sum()  # x[:1,:1] is 4 bytes
    # linear saves x (2 KiB) and relu its output (2 KiB); the weight (a transposed view of
    # the parameter) and the tiny slice stay.
    assert len(offloader.handles) == 2
    assert offloader.offloaded_bytes == 2 * 8 * 64 * 4
    y.backward()
    expected = torch.func.grad(lambda x: torch.relu(linear(x)).sum() + (x[:1, :1] * 2).sum())(
        x.detach()
    )
    torch.testing.assert_close(x.grad, expected)


def test_copies_in_flight_stay_within_the_bound() -> None:
    offloader = ActivationOffloader(max_inflight=2, min_bytes=0, copy_on_cpu=True)
    x = torch.randn(16, 16, requires_grad=True)
    with offloader.hooks():
        for _ in range(6):
            x = torch.tanh(x)
            assert offloader.copies_in_flight <= 2
    assert len(offloader.handles) == 6


def test_a_bound_below_one_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="max_inflight_activations"):
        ActivationOffloader(max_inflight=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_offloading_matches_and_lowers_peak_memory() -> None:
    device = torch.device("cuda")
    layers = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(16)]).to(device)
    x = torch.randn(4096, 1024, device=device)

    def run(offload: bool) -> tuple[torch.Tensor, int]:
        layers.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        resident = {p.untyped_storage().data_ptr() for p in layers.parameters()}
        offloader = ActivationOffloader(max_inflight=2, resident=resident)
        with (
            offloader.hooks()
            if offload
            else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
        ):
            out = layers(x).square().mean()
        peak_forward = torch.cuda.max_memory_allocated() - base
        out.backward()
        torch.cuda.synchronize()
        return layers[0].weight.grad.clone(), peak_forward

    grad_off, peak_off = run(False)
    grad_on, peak_on = run(True)
    torch.testing.assert_close(grad_on, grad_off)
    # Plain: 16 saved 16 MiB activations at once; offloaded: the 2 copies in flight and
    # the layer at work.
    assert peak_on < peak_off / 2
