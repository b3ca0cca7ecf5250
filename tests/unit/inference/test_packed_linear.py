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
    assert layer_groups(model) == 2 * 2  # (q, k, v) and (gate, up), per layer
    layer = model.model.layers[0]
    assert all(isinstance(m, PackedLinear) for m in (model.lm_head, layer.mlp.up_proj))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(after[k].data_ptr() == before[k].data_ptr() for k in before)  # same storage


def layer_groups(model: nn.Module) -> int:
    return len({id(m.group) for m in model.modules() if getattr(m, "group", None) is not None})


def test_training_mode_autograd_takes_f_linear() -> None:
    linear = nn.Linear(8, 4)
    packed = PackedLinear(linear, batch_hint=2)
    x = torch.randn(2, 8)
    packed(x).sum().backward()
    assert linear.weight.grad is not None and packed._packed is None


def _attention_with_bias() -> nn.Module:
    torch.manual_seed(0)
    block = nn.Module()
    block.q_proj = nn.Linear(16, 32, bias=True)
    block.k_proj = nn.Linear(16, 8, bias=False)  # a mix: the missing bias counts as zeros
    block.v_proj = nn.Linear(16, 8, bias=True)
    return block.requires_grad_(False)


def test_siblings_share_one_gemm_and_equal_their_own_linears() -> None:
    block = _attention_with_bias()
    plain = {n: (m.weight.clone(), m.bias) for n, m in block.named_children()}
    assert pack_linears(block, batch_hint=4) == 3
    assert block.q_proj.group is block.v_proj.group is not None
    x = torch.randn(2, 3, 16)
    with torch.inference_mode():
        for _ in range(2):  # the second round recomputes: a new input tensor
            for name in ("q_proj", "k_proj", "v_proj"):
                weight, bias = plain[name]
                got = getattr(block, name)(x)
                torch.testing.assert_close(got, F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
            x = x + 1
        q_again = block.q_proj(x)  # the same sibling twice on one input: computed afresh
        torch.testing.assert_close(q_again, block.q_proj(x))


def test_sibling_group_follows_an_in_place_load_of_one_member() -> None:
    block = _attention_with_bias()
    pack_linears(block, batch_hint=4)
    x = torch.randn(4, 16)
    with torch.inference_mode():
        block.q_proj(x), block.k_proj(x), block.v_proj(x)
    with torch.no_grad():
        block.k_proj.weight.copy_(torch.randn(8, 16))  # what load_state_dict does
    y = torch.randn(4, 16)
    with torch.inference_mode():
        block.q_proj(y)
        torch.testing.assert_close(block.k_proj(y), y @ block.k_proj.weight.T)
