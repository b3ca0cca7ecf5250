"""Reading and writing Hugging Face model folders (config.json + safetensors).

Reads a sharded folder (`model.safetensors.index.json`) or a single file, naming the file
or tensor at fault in every error. Writes what `from_pretrained` reads, into a temporary
sibling folder renamed into place, so a crash never leaves a folder that looks complete;
an existing folder is replaced only when it looks like one this module wrote, so a
mistyped output path fails instead of deleting a home directory.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tidal.models.hf_config import CONFIG, ModelFolderError, read_config
from tidal.models.state_dict_adapter import StateDict, WeightMismatch

__all__ = ["CONFIG", "INDEX", "SINGLE", "ModelFolderError", "read_config", "write_folder"]

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def read_weights(folder: Path) -> StateDict:
    """Every tensor of the folder's safetensors file(s), by checkpoint name, on CPU."""
    folder = Path(folder)
    if (folder / INDEX).is_file():
        weight_map: dict[str, str] = json.loads((folder / INDEX).read_text())["weight_map"]
        by_file: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            by_file.setdefault(file, []).append(name)
        state: StateDict = {}
        for file, names in sorted(by_file.items()):
            if not (folder / file).is_file():
                raise ModelFolderError(f"{INDEX} names shard {file}, which is not in {folder}")
            with safe_open(folder / file, framework="pt") as f:
                present = set(f.keys())
                for name in names:
                    if name not in present:
                        raise WeightMismatch(f"missing tensor {name} (the index puts it in {file})")
                    state[name] = f.get_tensor(name)
        return state
    if (folder / SINGLE).is_file():
        with safe_open(folder / SINGLE, framework="pt") as f:
            return {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    raise ModelFolderError(f"{folder} has neither {SINGLE} nor {INDEX}")


def write_folder(
    folder: Path,
    config: dict[str, Any],
    state: StateDict,
    *,
    max_shard_bytes: int | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> None:
    """Write `config.json` and `state` (checkpoint names) as an HF folder, atomically;
    `extra_files` (name → bytes: tokenizer files, generation_config.json) go in with them."""
    folder = Path(folder)
    check_replaceable(folder)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {name: t.detach().to("cpu").contiguous().clone() for name, t in state.items()}
    shards = _split(tensors, max_shard_bytes)
    if len(shards) == 1:
        save_file(shards[0], tmp / SINGLE, metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards, start=1):
            file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, tmp / file, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, file))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (tmp / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True))
    (tmp / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
    for name, data in (extra_files or {}).items():
        (tmp / name).write_bytes(data)
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)


def check_replaceable(folder: Path) -> None:
    """Raise ModelFolderError unless `folder` is absent, empty, or a model folder (a
    `config.json` and plain files only), the only kinds `write_folder` replaces."""
    if not folder.exists() and not folder.is_symlink():
        return
    if folder.is_symlink() or not folder.is_dir():
        raise ModelFolderError(f"{folder} exists and is not a folder; choose another output")
    children = list(folder.iterdir())
    if not children:
        return
    if not (folder / CONFIG).is_file() or any(c.is_dir() or c.is_symlink() for c in children):
        raise ModelFolderError(
            f"{folder} exists and is not a model folder (no {CONFIG}, or it holds folders); "
            "refusing to replace it: choose an empty or new output folder"
        )


def _split(tensors: StateDict, max_shard_bytes: int | None) -> list[StateDict]:
    if max_shard_bytes is None:
        return [tensors]
    shards: list[StateDict] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    return shards


def check_weights(expected: dict[str, torch.Size], state: StateDict, *, optional: set[str]) -> None:
    """Raise `WeightMismatch` naming the first missing, unexpected or mis-shaped tensor."""
    missing = sorted(set(expected) - set(state) - optional)
    if missing:
        raise WeightMismatch(f"missing tensor {missing[0]} (missing {missing[:8]})")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        raise WeightMismatch(f"unexpected tensor {unexpected[0]} (unexpected {unexpected[:8]})")
    for name, t in state.items():
        if tuple(t.shape) != tuple(expected[name]):
            raise WeightMismatch(
                f"tensor {name} has shape {tuple(t.shape)}, the model expects "
                f"{tuple(expected[name])}"
            )
