"""Serving published LoRA adapters: merged onto a kept copy of their base version's weights.

With `lora.publish = "adapters"` the trainer publishes full weights once and then only
PEFT-named adapters (manifest format "lora-adapters", `adapter_config` in config.json).
Each adapter version is merged at load, W' = W + (alpha / r) · B A with the trainer's own
`merge_update`, so a replica serves exactly what a merged publish would have sent, decoding
costs nothing extra, and every engine takes it through its ordinary `update_weights`. The
base is fetched on demand and kept in host memory once adapters arrive. Adapters that do
not fit their base are refused with ValueError (the watcher skips the version).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tidal.models.lora import PEFT_PREFIX, merge_update
from tidal.weights.manifest import LORA_ADAPTERS, WeightManifest

ADAPTER_KEY = "adapter_config"
_PARTS = (".lora_A.weight", ".lora_B.weight")


@dataclass(frozen=True)
class AdapterSpec:
    """What config.json's `adapter_config` says about a version's adapters."""

    base_version: int
    rank: int
    alpha: float
    targets: frozenset[str]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def adapter_spec(hf_config: dict[str, Any]) -> AdapterSpec | None:
    """The adapters a version's config describes, or None for full weights."""
    raw = hf_config.get(ADAPTER_KEY)
    if raw is None:
        return None
    try:
        spec = AdapterSpec(
            base_version=int(raw["base_version"]),
            rank=int(raw["r"]),
            alpha=float(raw["lora_alpha"]),
            targets=frozenset(raw["target_modules"]),
        )
    except KeyError as exc:
        raise ValueError(f"{ADAPTER_KEY}.{exc.args[0]} is missing in the version's config") from exc
    if spec.rank <= 0:
        raise ValueError(f"{ADAPTER_KEY}.r must be > 0, got {spec.rank}")
    return spec


def base_config(hf_config: dict[str, Any]) -> dict[str, Any]:
    """The model's config without the adapter description."""
    return {k: v for k, v in hf_config.items() if k != ADAPTER_KEY}


def check_described(manifest: WeightManifest, hf_config: dict[str, Any]) -> None:
    """Raise ValueError when the manifest and config.json disagree about adapters."""
    spec = adapter_spec(hf_config)
    says_adapters = manifest.format == LORA_ADAPTERS
    if (spec is not None) != says_adapters:
        raise ValueError(
            f"version {manifest.version}: manifest format is {manifest.format!r} but "
            f"config.json {'has' if spec is not None else 'has no'} {ADAPTER_KEY}"
        )
    if spec is not None and spec.base_version != manifest.base_version:
        raise ValueError(
            f"version {manifest.version}: manifest says base_version {manifest.base_version}, "
            f"config.json's {ADAPTER_KEY} says {spec.base_version}"
        )


class AdapterMerger:
    """Holds one base version's full weights and turns adapter versions into full weights."""

    def __init__(self) -> None:
        self.base_version: int | None = None
        self._config: dict[str, Any] = {}
        self._state: dict[str, torch.Tensor] = {}

    def holds(self, version: int) -> bool:
        return self.base_version == version

    def keep_base(
        self, version: int, hf_config: dict[str, Any], state: dict[str, torch.Tensor]
    ) -> None:
        """Remember `state` (full weights of `version`) as the base adapters apply to."""
        if adapter_spec(hf_config) is not None:
            raise ValueError(f"base version {version} holds adapters, not full weights")
        self.base_version, self._config, self._state = version, hf_config, state

    def merge(
        self, version: int, hf_config: dict[str, Any], adapters: dict[str, torch.Tensor]
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(config, full state dict) of adapter version `version` on the kept base."""
        spec = adapter_spec(hf_config)
        if spec is None:
            raise ValueError(f"version {version} holds full weights, not adapters")
        if not self.holds(spec.base_version):
            raise ValueError(
                f"adapters of version {version} apply to base version {spec.base_version}; "
                f"this replica holds base version {self.base_version}"
            )
        config = base_config(hf_config)
        if config != self._config:
            changed = sorted(
                k
                for k in config.keys() | self._config.keys()
                if config.get(k) != self._config.get(k)
            )
            raise ValueError(
                f"adapters of version {version} describe another model than base version "
                f"{spec.base_version} (config fields differ: {changed})"
            )
        merged = dict(self._state)  # untouched weights are shared with the base, not copied
        for layer, (lora_a, lora_b) in _pairs(version, adapters, spec).items():
            name = f"{layer}.weight"
            weight = self._state.get(name)
            if weight is None:
                raise ValueError(f"version {version}: adapters for {layer}, which the base lacks")
            _check_shapes(version, layer, weight, lora_a, lora_b, spec.rank)
            merged[name] = merge_update(
                weight, lora_a.to(weight.dtype), lora_b.to(weight.dtype), spec.scale
            )
        return config, merged


def _pairs(
    version: int, adapters: dict[str, torch.Tensor], spec: AdapterSpec
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """PEFT-named tensors grouped by layer: {layer: (A (r, in), B (out, r))}."""
    layers: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in adapters.items():
        part = next((p for p in _PARTS if name.endswith(p)), None)
        if not name.startswith(PEFT_PREFIX) or part is None:
            raise ValueError(f"version {version}: {name!r} is not a PEFT-named LoRA tensor")
        layer = name[len(PEFT_PREFIX) : -len(part)]
        if layer.rsplit(".", 1)[-1] not in spec.targets:
            raise ValueError(
                f"version {version}: {name!r} is not in {ADAPTER_KEY}.target_modules "
                f"{sorted(spec.targets)}"
            )
        layers.setdefault(layer, {})[part] = tensor
    if not layers:
        raise ValueError(f"version {version}: the adapter version holds no tensors")
    pairs = {}
    for layer, parts in layers.items():
        if len(parts) != 2:
            raise ValueError(f"version {version}: {layer} has only {sorted(parts)}")
        pairs[layer] = (parts[_PARTS[0]], parts[_PARTS[1]])
    return pairs


def _check_shapes(
    version: int,
    layer: str,
    weight: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    rank: int,
) -> None:
    out_features, in_features = weight.shape
    if lora_a.shape != (rank, in_features) or lora_b.shape != (out_features, rank):
        raise ValueError(
            f"version {version}: {layer} adapters A {tuple(lora_a.shape)}, B "
            f"{tuple(lora_b.shape)} do not fit its base weight {tuple(weight.shape)} at rank "
            f"{rank} (want A {(rank, in_features)}, B {(out_features, rank)})"
        )
