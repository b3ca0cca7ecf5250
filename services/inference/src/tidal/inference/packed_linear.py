"""CPU linear layers served from oneDNN-prepacked weights: the decode step's matmuls, faster.

Decisions:
- Profiled at batch 32 on CPU, a decode step is ~75% `aten::mm` (the layers' projections
  and the LM head), and `F.linear` re-lays the weight out for the GEMM kernel on every
  call. oneDNN can reorder a weight once into its blocked layout and then run each call on
  it; measured on this machine's AVX-512 cores that makes the `(32, 512) @ (512, N)`
  matmuls of the benchmark model 1.3-2x faster in fp32 (the 32000-wide LM head most) and
  ~1.4x in bf16. It is the same kernel `torch.compile` uses for frozen CPU linears
  (`torch.ops.mkldnn._linear_pointwise`), called directly, so there is no compile time and
  no recompile on a new weight version or a new batch size.
- The modules swap in place of `nn.Linear` and keep its parameters (same objects, same
  names), so loading weights, the tied LM head and the state dict are untouched. The
  packed copy is rebuilt lazily when the weight changed: a different tensor, or an
  in-place copy (its version counter moved, which every `load_state_dict` does). No
  caller has to remember to repack after a hot reload.
- Cost: one packed copy of every linear weight (about the model's size again). Results
  differ from `F.linear` by float rounding only (another summation order): the engine's
  equivalence tests (tokens alone vs batched, logprobs vs the trainer's recompute) hold.
- Anything else (CUDA, autograd, weights created under inference mode, which have no
  version counter, a torch without oneDNN) takes plain `F.linear`, and
  `inference.packed_weights = false` turns the swap off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def packing_available(device: torch.device) -> bool:
    """Whether oneDNN weight packing can serve linears on `device` (CPU with oneDNN only)."""
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class PackedLinear(nn.Linear):
    """An `nn.Linear` whose no-grad CPU forward runs on a oneDNN-prepacked weight copy."""

    def __init__(self, linear: nn.Linear, *, batch_hint: int) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter: ties and loading are unchanged
        self.bias = linear.bias
        self.batch_hint = batch_hint
        self._packed: torch.Tensor | None = None
        self._packed_from: tuple[torch.Tensor, int] | None = None  # (weight, its _version)

    def _current_packed(self) -> torch.Tensor:
        source = (self.weight, self.weight._version)
        if self._packed is None or not _same(self._packed_from, source):
            self._packed = torch.ops.mkldnn._reorder_linear_weight(
                self.weight.detach(), self.batch_hint
            )
            self._packed_from = source
        return self._packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) → (..., out)
        if (
            x.device.type != "cpu"
            or (torch.is_grad_enabled() and self.weight.requires_grad)
            or self.weight.is_inference()  # no version counter: a reload could go unseen
        ):
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, self.in_features)  # (M, in)
        out = torch.ops.mkldnn._linear_pointwise(
            flat, self._current_packed(), self.bias, "none", [], ""
        )  # (M, out)
        return out.view(*x.shape[:-1], self.out_features)


def _same(a: tuple[torch.Tensor, int] | None, b: tuple[torch.Tensor, int]) -> bool:
    return a is not None and a[0] is b[0] and a[1] == b[1]


def pack_linears(model: nn.Module, *, batch_hint: int) -> int:
    """Swap every `nn.Linear` of `model` for a `PackedLinear` in place; returns how many.

    `batch_hint` is the row count the packed layout is tuned for (any count works).
    """
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PackedLinear(child, batch_hint=batch_hint))
                swapped += 1
    return swapped
