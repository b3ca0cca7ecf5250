"""Reading and writing Hugging Face model folders (config.json + safetensors), the one
writer of them: published versions, `tidal export`, `tidal sft`'s final weights and
converted models all take their files from `folder_files` or `write_folder`.

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

from tidal.common.files.durable import commit_dir, removed_on_failure, space_for, write_hashed
from tidal.models.hf_config import CONFIG, ModelFolderError, read_config
from tidal.models.safetensors_format import encode_safetensors, write_safetensors
from tidal.models.state_dict_adapter import StateDict, WeightMismatch

__all__ = ["CONFIG", "INDEX", "SINGLE", "ModelFolderError", "read_config", "write_folder"]

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PT = {"format": "pt"}
"""The weights files' metadata, as transformers writes it."""


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


def folder_files(
    config: dict[str, Any],
    state: Mapping[str, torch.Tensor],
    *,
    extra_files: Mapping[str, bytes] | None = None,
    reuse: bytearray | None = None,
) -> dict[str, bytes | bytearray]:
    """The files of a model folder in memory, by name: `config.json`, `state` (checkpoint
    names) as one weights file (written into `reuse` when it fits, as `encode_safetensors`)
    and `extra_files` (name → bytes: tokenizer files, generation_config.json). What a
    published version holds; `write_folder` writes the same files to disk."""
    return {
        SINGLE: encode_safetensors(state, metadata=PT, reuse=reuse),
        **_files(config, extra_files),
    }


def write_folder(
    folder: Path,
    config: dict[str, Any],
    state: StateDict,
    *,
    max_shard_bytes: int | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> None:
    """Write a complete model folder at `folder`, atomically and durably: `folder_files`'
    files, the weights in shards of at most `max_shard_bytes` (with their index) when given.
    Each file is fsynced as it is written under a temporary sibling, which one rename makes
    visible; an existing model folder there is replaced, anything else refused."""
    folder = Path(folder)
    check_replaceable(folder)
    files = _files(config, extra_files)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with space_for(tmp, None), removed_on_failure(tmp):  # a failed write leaks no space
        shards = _shards(state, max_shard_bytes)
        if len(shards) > 1:
            weight_map = {t: name for name, shard in shards.items() for t in shard}
            total = sum(t.numel() * t.element_size() for t in state.values())
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            files[INDEX] = json.dumps(index, indent=2, sort_keys=True).encode()
        for name, shard in shards.items():
            write_safetensors(tmp / name, shard, metadata=PT)
        for name, data in files.items():
            write_hashed(tmp / name, [data])
        if folder.exists():
            shutil.rmtree(folder)
        commit_dir(tmp, folder)


def write_config(folder: Path, config: dict[str, Any]) -> None:
    """`config.json` alone into the existing `folder`: an architecture without weights, as
    vLLM's dummy load reads it before the weights come by another path."""
    write_hashed(Path(folder) / CONFIG, [_files(config, None)[CONFIG]])


def _files(config: dict[str, Any], extra_files: Mapping[str, bytes] | None) -> dict[str, bytes]:
    """`config.json` and the extra files, whose names may not be the folder's own."""
    extra = dict(extra_files or {})
    if extra.keys() & {CONFIG, SINGLE, INDEX} or any("/" in n or n.startswith(".") for n in extra):
        raise ValueError(f"companion file names {sorted(extra)} must be plain, new names")
    return {CONFIG: json.dumps(config, indent=2, sort_keys=True).encode(), **extra}


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


def _shards(state: StateDict, max_shard_bytes: int | None) -> dict[str, StateDict]:
    """The weights files by name: `model.safetensors`, or shards of at most `max_shard_bytes`."""
    shards: list[StateDict] = [{}]
    size = 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        return {SINGLE: shards[0]}
    return {f"model-{i:05d}-of-{len(shards):05d}.safetensors": s for i, s in enumerate(shards, 1)}


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
