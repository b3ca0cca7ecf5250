"""oneDNN-prepacked linears equal `F.linear` and follow every weight change."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tidal.inference.packed_linear import (
    PackedLinear,
    choose_linear_kernel,
    pack_linears,
    packing_available,
)
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM

pytestmark = pytest.mark.skipif(
    not packing_available(torch.device("cpu")), reason="torch built without oneDNN"
)


SHAPES = [(1, 48), (8, 48), (3, 5, 48), (2, 33, 48)]


@pytest.mark.parametrize("bias", [False, True])
def test_packed_fp32_linear_equals_f_linear_for_any_row_count(bias: bool) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(48, 80, bias=bias).requires_grad_(False)
    packed = PackedLinear(linear, batch_hint=8)
    with torch.inference_mode():
        for shape in SHAPES:
            x = torch.randn(shape)
            # A 48-term fp32 dot product in another order: rounding ~1e-7 relative.
            torch.testing.assert_close(
                packed(x), F.linear(x, linear.weight, linear.bias), atol=1e-5, rtol=1e-5
            )
    assert packed.packed_dtype == torch.float32  # the packed kernel ran, not the fallback


@pytest.mark.parametrize("bias", [False, True])
def test_packed_bf16_linear_equals_an_fp32_matmul_of_the_same_bf16_values(
    bias: bool, bf16_path: str
) -> None:
    """Both bf16 paths: native kernels where the CPU has them, fp32 compute everywhere."""
    torch.manual_seed(0)
    linear = nn.Linear(48, 80, bias=bias).to(torch.bfloat16).requires_grad_(False)
    packed = PackedLinear(linear, batch_hint=8)
    expected_dtype = torch.bfloat16 if bf16_path == "native" else torch.float32
    assert packed.compute_dtype == expected_dtype
    weight = linear.weight.float()
    bias_ = None if linear.bias is None else linear.bias.float()
    with torch.inference_mode():
        for shape in SHAPES:
            x = torch.randn(shape).to(torch.bfloat16)
            out = packed(x)
            assert out.dtype == torch.bfloat16
            # The exact product of bf16 values, rounded once to bf16 (2^-8 relative), or
            # (native) accumulated in fp32 and rounded: within two bf16 ulps either way.
            expected = F.linear(x.float(), weight, bias_)
            torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2**-7)
    assert packed.packed_dtype == expected_dtype


def test_kernel_choice_names_the_path_for_each_dtype(bf16_path: str) -> None:
    cpu = torch.device("cpu")
    fp32 = choose_linear_kernel(cpu, torch.float32, packed=True)
    assert (fp32.packed, fp32.compute_dtype) == (True, torch.float32)
    assert fp32.name == "cpu onednn-packed fp32"
    bf16 = choose_linear_kernel(cpu, torch.bfloat16, packed=True)
    if bf16_path == "native":
        assert (bf16.compute_dtype, bf16.name) == (torch.bfloat16, "cpu onednn-packed bf16")
    else:
        assert bf16.compute_dtype == torch.float32
        assert "fp32 from bf16 weights" in bf16.name and "TIDAL_CPU_BF16" in bf16.name
    off = choose_linear_kernel(cpu, torch.bfloat16, packed=False)
    assert (off.packed, off.name) == (False, "cpu F.linear bf16")


def test_packed_copy_follows_in_place_loads_and_new_tensors() -> None:
    linear = nn.Linear(16, 24, bias=False).requires_grad_(False)
    packed = PackedLinear(linear, batch_hint=4)
    x = torch.randn(4, 16)
    with torch.inference_mode():
        packed(x)  # packs the initial weight
    with torch.no_grad():
        packed.weight.copy_(torch.randn(24, 16))  # what load_state_dict does
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), x @ packed.weight.T)
    packed.weight = nn.Parameter(torch.randn(24, 16), requires_grad=False)  # a re-tie
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), x @ packed.weight.T)


def test_weights_made_under_inference_mode_take_f_linear() -> None:
    with torch.inference_mode():
        linear = nn.Linear(8, 4)
        packed = PackedLinear(linear, batch_hint=2)
        x = torch.randn(2, 8)
        torch.testing.assert_close(packed(x), F.linear(x, linear.weight, linear.bias))
    assert packed.packed_dtype is None


def test_pack_linears_keeps_parameters_names_and_the_tied_head() -> None:
    args = DecoderArgs(
        vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16
    )
    model = DecoderLM(args)
    before = model.state_dict()
    assert pack_linears(model, batch_hint=4) == 2 * 7 + 1  # q k v o gate up down, per layer; head
    layer = model.model.layers[0]
    assert all(isinstance(m, PackedLinear) for m in (model.lm_head, layer.mlp.up_proj))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(after[k].data_ptr() == before[k].data_ptr() for k in before)  # same storage


def test_training_mode_autograd_takes_f_linear() -> None:
    linear = nn.Linear(8, 4)
    packed = PackedLinear(linear, batch_hint=2)
    x = torch.randn(2, 8)
    packed(x).sum().backward()
    assert linear.weight.grad is not None and packed.packed_dtype is None
