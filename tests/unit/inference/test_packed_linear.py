"""oneDNN-prepacked linears equal `F.linear` and follow every weight change."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tidal.inference.packed_linear import PackedLinear, pack_linears, packing_available
from tidal.trainer.models.llama.model import LlamaArgs, LlamaForCausalLM

pytestmark = pytest.mark.skipif(
    not packing_available(torch.device("cpu")), reason="torch built without oneDNN"
)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_equals_f_linear_for_any_row_count(bias: bool, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(48, 80, bias=bias).to(dtype).requires_grad_(False)
    packed = PackedLinear(linear, batch_hint=8)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    with torch.inference_mode():
        for shape in [(1, 48), (8, 48), (3, 5, 48), (2, 33, 48)]:
            x = torch.randn(shape, dtype=dtype)
            expected = F.linear(x, linear.weight, linear.bias)
            torch.testing.assert_close(packed(x), expected, atol=tol, rtol=tol)
    assert packed._packed is not None  # the packed kernel ran, not the fallback


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
    assert packed._packed is None


def test_pack_linears_keeps_parameters_names_and_the_tied_head() -> None:
    args = LlamaArgs(
        vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16
    )
    model = LlamaForCausalLM(args)
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
    assert linear.weight.grad is not None and packed._packed is None
