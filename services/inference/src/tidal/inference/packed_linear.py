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
- Siblings that read the same input (q, k, v of an attention; gate and up of a SwiGLU
  MLP) share one packed copy of their concatenated weights (`SiblingGroup`): the first
  sibling called with an input computes all their outputs in one wider GEMM and the
  others take their columns of it. At 32 rows one `(512, 1024)` or `(512, 3072)` GEMM is
  ~10-15% faster than the three or two narrower ones. The shared result is reused only
  for the same input tensor object and at most once per sibling (a second call on the
  same input recomputes), and dropped once every sibling took its part; callers must
  not modify the input in place between sibling calls (the model never does).
- Anything else (CUDA, autograd, weights created under inference mode, which have no
  version counter, a torch without oneDNN) takes plain `F.linear`, and
  `inference.packed_weights = false` turns the swap off.
"""

from __future__ import annotations

from typing import Any

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
        self.group: SiblingGroup | None = None  # set by `pack_linears` for siblings
        self.group_index = 0

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
        if self.group is not None:
            return self.group.output(self.group_index, x)
        flat = x.reshape(-1, self.in_features)  # (M, in)
        out = torch.ops.mkldnn._linear_pointwise(
            flat, self._current_packed(), self.bias, "none", [], ""
        )  # (M, out)
        return out.view(*x.shape[:-1], self.out_features)


def _same(a: tuple[torch.Tensor, int] | None, b: tuple[torch.Tensor, int]) -> bool:
    return a is not None and a[0] is b[0] and a[1] == b[1]


class SiblingGroup:
    """Packed linears reading one input, served by one GEMM over their stacked weights."""

    def __init__(self, members: list[PackedLinear], *, batch_hint: int) -> None:
        self.members, self.batch_hint = members, batch_hint
        self.splits = [m.out_features for m in members]
        self._packed: torch.Tensor | None = None
        self._bias: torch.Tensor | None = None
        self._packed_from: list[tuple[torch.Tensor, int]] = []
        self._input: torch.Tensor | None = None
        self._parts: list[torch.Tensor] = []
        self._served: set[int] = set()

    def _current_packed(self) -> torch.Tensor:
        sources = [(m.weight, m.weight._version) for m in self.members]
        fresh = len(sources) == len(self._packed_from) and all(
            _same(a, b) for a, b in zip(self._packed_from, sources, strict=True)
        )
        if self._packed is None or not fresh:
            stacked = torch.cat([m.weight.detach() for m in self.members])  # (ΣN, in)
            self._packed = torch.ops.mkldnn._reorder_linear_weight(stacked, self.batch_hint)
            biases = [m.bias for m in self.members]
            self._bias = (
                None
                if all(b is None for b in biases)
                else torch.cat(
                    [
                        b.detach() if b is not None else m.weight.new_zeros(m.out_features)
                        for b, m in zip(biases, self.members, strict=True)
                    ]
                )
            )  # (ΣN,)
            self._packed_from = sources
        return self._packed

    def output(self, index: int, x: torch.Tensor) -> torch.Tensor:  # (..., in) → (..., N_index)
        if self._input is not x or index in self._served:
            flat = x.reshape(-1, self.members[0].in_features)  # (M, in)
            out = torch.ops.mkldnn._linear_pointwise(
                flat, self._current_packed(), self._bias, "none", [], ""
            )  # (M, ΣN)
            self._parts = list(out.split(self.splits, dim=-1))  # column views, (M, N_i) each
            self._input, self._served = x, set()
        self._served.add(index)
        part = self._parts[index].view(*x.shape[:-1], self.splits[index])
        if len(self._served) == len(self.members):  # every sibling served: let go of both
            self._input, self._parts = None, []
        return part


# Children of one module that read the same input, fused when all are plain linears.
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


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
        for names in SIBLINGS:
            members = [getattr(parent, n, None) for n in names]
            if all(type(m) is PackedLinear for m in members) and _same_input(members):
                group = SiblingGroup(members, batch_hint=batch_hint)  # type: ignore[arg-type]
                for i, member in enumerate(members):
                    member.group, member.group_index = group, i  # type: ignore[union-attr]
    return swapped


def _same_input(members: list[Any]) -> bool:
    return len({(m.in_features, m.weight.dtype, m.weight.device) for m in members}) == 1
