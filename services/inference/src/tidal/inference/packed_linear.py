"""CPU linear layers served from oneDNN-prepacked weights, for the decode step's matmuls.

A decode step is mostly matmuls, and `F.linear` hands oneDNN a plain weight to re-lay out
on every call; these modules keep a copy reordered once into oneDNN's blocked layout and
call `torch.ops.mkldnn._linear_pointwise` (the kernel `torch.compile` uses for frozen CPU
linears) with no compile step. They replace `nn.Linear` in place, keeping its parameters,
and repack lazily when the weight changed, so hot reload needs nothing. On a CPU without
native bf16 the packed copy is fp32 and the call computes in fp32. The kernel is chosen
once per engine (`choose_linear_kernel`); anything else takes plain `F.linear`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tidal.models.cpu_features import bf16_support


def packing_available(device: torch.device) -> bool:
    """Whether oneDNN weight packing can serve linears on `device` (CPU with oneDNN only)."""
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


@dataclass(frozen=True)
class LinearKernel:
    """How a served model's linear layers compute: chosen once per engine."""

    name: str
    """What runs, for the log and `GetStatus` (e.g. "onednn-packed fp32 from bf16 weights")."""
    packed: bool
    """Swap the linears for `PackedLinear`s."""
    compute_dtype: torch.dtype
    """dtype the packed matmul runs in (the weights' own, or fp32 where bf16 is not native)."""


def choose_linear_kernel(device: torch.device, dtype: torch.dtype, *, packed: bool) -> LinearKernel:
    """The linear kernel for a model of `dtype` on `device` (`packed`: the config allows it)."""
    if device.type != "cpu":
        return LinearKernel(f"{device.type} F.linear {_name(dtype)}", False, dtype)
    if not (packed and packing_available(device)):
        return LinearKernel(f"cpu F.linear {_name(dtype)}", False, dtype)
    compute = _native_or_fp32(dtype)
    if compute != dtype:
        reason = bf16_support().reason
        name = f"cpu onednn-packed fp32 from bf16 weights (no native bf16: {reason})"
        return LinearKernel(name, True, compute)
    return LinearKernel(f"cpu onednn-packed {_name(dtype)}", True, dtype)


def _native_or_fp32(dtype: torch.dtype) -> torch.dtype:
    """`dtype` where this CPU computes it natively, else fp32 (bf16 without native kernels)."""
    return torch.float32 if dtype == torch.bfloat16 and not bf16_support().native else dtype


def _name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(dtype, str(dtype))


class PackedLinear(nn.Linear):
    """An `nn.Linear` whose no-grad CPU forward runs on a oneDNN-prepacked weight copy.

    With `compute_dtype` wider than the weight (bf16 weights, no native bf16), the packed
    copy is the upcast weight and each call casts its input up and its output back.
    """

    def __init__(
        self, linear: nn.Linear, *, batch_hint: int, compute_dtype: torch.dtype | None = None
    ) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter: ties and loading are unchanged
        self.bias = linear.bias
        self.batch_hint = batch_hint
        self.compute_dtype = compute_dtype or _native_or_fp32(linear.weight.dtype)
        self._packed: torch.Tensor | None = None
        self._packed_from: tuple[torch.Tensor, int] | None = None  # (weight, its _version)

    @property
    def packed_dtype(self) -> torch.dtype | None:
        """Dtype of the prepacked weight copy; None until a forward took the packed kernel."""
        return None if self._packed is None else self._packed.dtype

    def _current_packed(self) -> torch.Tensor:
        source = (self.weight, self.weight._version)
        if self._packed is None or not _same(self._packed_from, source):
            self._packed = torch.ops.mkldnn._reorder_linear_weight(
                self.weight.detach().to(self.compute_dtype), self.batch_hint
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
        bias = self.bias
        # Casts only where needed: even a no-op `.to` costs a dispatch, and this runs per layer.
        if flat.dtype != self.compute_dtype:
            flat = flat.to(self.compute_dtype)
        if bias is not None and bias.dtype != self.compute_dtype:
            bias = bias.to(self.compute_dtype)
        out = torch.ops.mkldnn._linear_pointwise(
            flat, self._current_packed(), bias, "none", [], ""
        )  # (M, out)
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)


def _same(a: tuple[torch.Tensor, int] | None, b: tuple[torch.Tensor, int]) -> bool:
    return a is not None and a[0] is b[0] and a[1] == b[1]


def pack_linears(
    model: nn.Module, *, batch_hint: int, compute_dtype: torch.dtype | None = None
) -> int:
    """Swap every `nn.Linear` of `model` for a `PackedLinear` in place; returns how many.

    `batch_hint` is the row count the packed layout is tuned for (any count works);
    `compute_dtype` (default: each weight's own) is what the packed matmuls run in.
    """
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                packed = PackedLinear(child, batch_hint=batch_hint, compute_dtype=compute_dtype)
                setattr(parent, name, packed)
                swapped += 1
    return swapped
