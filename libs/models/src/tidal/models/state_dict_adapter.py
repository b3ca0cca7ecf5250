"""State-dict adapters: our state dict (HF in-memory names, experts stacked) ⇄ the HF
*checkpoint* layout (what safetensors files on disk hold).

Dense families use the identity (our parameter names are HF's); MoE families split and
stack experts: ours are `mlp.experts.gate_up_proj` `(E, 2I, H)` (gate rows first) and
`mlp.experts.down_proj` `(E, H, I)`, checkpoints hold `mlp.experts.{e}.{gate,up,down}_proj.weight`.
`adapter_for` picks by the family record's `moe`. Every tensor touched is checked and a
wrong one raises `WeightMismatch` naming it; `from_hf` also accepts stacked names.
"""

from __future__ import annotations

import re

import torch

from tidal.models.args import DecoderArgs
from tidal.models.families import FAMILIES

StateDict = dict[str, torch.Tensor]

_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


class WeightMismatch(ValueError):
    """Weights do not fit the architecture: a missing, unexpected or mis-shaped tensor."""


class StateDictAdapter:
    """Identity adapter: our names are already HF checkpoint names (dense families)."""

    def to_hf(self, state: StateDict, args: DecoderArgs) -> StateDict:
        return dict(state)

    def from_hf(self, state: StateDict, args: DecoderArgs) -> StateDict:
        return dict(state)


class MoEStateDictAdapter(StateDictAdapter):
    def to_hf(self, state: StateDict, args: DecoderArgs) -> StateDict:
        out: StateDict = {}
        for name, t in state.items():
            if name.endswith(".experts.gate_up_proj"):
                prefix = name.removesuffix(".gate_up_proj")
                gate, up = t.chunk(2, dim=1)  # (E, I, H) each
                for e in range(t.shape[0]):
                    out[f"{prefix}.{e}.gate_proj.weight"] = gate[e]
                    out[f"{prefix}.{e}.up_proj.weight"] = up[e]
            elif name.endswith(".experts.down_proj"):
                prefix = name.removesuffix(".down_proj")
                for e in range(t.shape[0]):
                    out[f"{prefix}.{e}.down_proj.weight"] = t[e]
            else:
                out[name] = t
        return out

    def from_hf(self, state: StateDict, args: DecoderArgs) -> StateDict:
        out: StateDict = {}
        per_expert: dict[str, dict[tuple[str, int], torch.Tensor]] = {}
        for name, t in state.items():
            match = _EXPERT.match(name)
            if match is None:
                out[name] = t
                continue
            prefix, expert, proj = match.group(1), int(match.group(2)), match.group(3)
            if expert >= args.n_experts:
                raise WeightMismatch(
                    f"unexpected tensor {name}: the config has {args.n_experts} experts"
                )
            per_expert.setdefault(prefix, {})[(proj, expert)] = t
        for prefix, tensors in per_expert.items():
            gate = self._stack(prefix, "gate", tensors, (args.moe_ffn_dim, args.dim), args)
            up = self._stack(prefix, "up", tensors, (args.moe_ffn_dim, args.dim), args)
            out[f"{prefix}.gate_up_proj"] = torch.cat([gate, up], dim=1)  # (E, 2I, H)
            out[f"{prefix}.down_proj"] = self._stack(
                prefix, "down", tensors, (args.dim, args.moe_ffn_dim), args
            )
        return out

    @staticmethod
    def _stack(
        prefix: str,
        proj: str,
        tensors: dict[tuple[str, int], torch.Tensor],
        shape: tuple[int, int],
        args: DecoderArgs,
    ) -> torch.Tensor:
        stacked = []
        for e in range(args.n_experts):
            name = f"{prefix}.{e}.{proj}_proj.weight"
            t = tensors.get((proj, e))
            if t is None:
                raise WeightMismatch(f"missing tensor {name}")
            if tuple(t.shape) != shape:
                raise WeightMismatch(
                    f"tensor {name} has shape {tuple(t.shape)}, the config expects {shape}"
                )
            stacked.append(t)
        return torch.stack(stacked)  # (E, *shape)


def adapter_for(family: str) -> StateDictAdapter:
    """The adapter of a family by name (the identity for one we do not implement)."""
    known = FAMILIES.get(family)
    return MoEStateDictAdapter() if known is not None and known.moe else StateDictAdapter()
