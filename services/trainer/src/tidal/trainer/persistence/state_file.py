"""One-process state on disk: one safetensors file named after its own sha256, holding a
tree of tensors and JSON (no pickle), in `step_XXXXXXXX` folders written atomically.

One-process checkpoints and step-journal entries are such folders. The file name's sha256
is checked before anything is parsed, so a torn or altered file is refused naming it;
tensors that share memory (a tied embedding and head) are stored once. A folder is
written under a hidden temp name, fsynced and renamed, so a crash leaves nothing that
looks complete. docs/training.md ("Checkpoint files") says why this format and not DCP.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load as load_safetensors

from tidal.common.files.durable import fsync_path, removed_on_failure, space_for
from tidal.common.files.safe_remove import remove_inside
from tidal.models.safetensors_format import write_safetensors

log = logging.getLogger(__name__)

PREFIX = "state."
SUFFIX = ".safetensors"
NAME = re.compile(r"^state\.([0-9a-f]{64})\.safetensors$")
FORMAT = "tidal-checkpoint-1"
FORMAT_KEY = "tidal.format"
TREE_KEY = "tidal.tree"
STEP_NAME = re.compile(r"^step_(\d{8})$")
TMP_PREFIX = ".tmp-"


class CorruptCheckpoint(ValueError):
    """A state file does not match the sha256 in its name (or there is none)."""


def _flatten(tree: Any, path: str, tensors: dict[str, torch.Tensor], seen: dict[tuple, str]) -> Any:
    if isinstance(tree, torch.Tensor):
        t = tree.detach().cpu()
        if t.numel():
            identity = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
                        t.stride(), t.dtype)  # fmt: skip
            if identity in seen:
                return {"__tensor__": seen[identity]}
            seen[identity] = path
        tensors[path] = t.contiguous()
        return {"__tensor__": path}
    if isinstance(tree, dict):
        for key in tree:
            if not isinstance(key, str):
                raise TypeError(f"checkpoint state key {key!r} at {path or '/'} is not a string")
        return {k: _flatten(v, f"{path}/{k}", tensors, seen) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return {
            "__tuple__": [_flatten(v, f"{path}/{i}", tensors, seen) for i, v in enumerate(tree)]
        }
    if isinstance(tree, list):
        return [_flatten(v, f"{path}/{i}", tensors, seen) for i, v in enumerate(tree)]
    if tree is None or isinstance(tree, bool | int | float | str):
        return tree
    raise TypeError(f"checkpoint state at {path or '/'} has type {type(tree).__name__}")


def _unflatten(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(tree, dict):
        if set(tree) == {"__tensor__"}:
            return tensors[tree["__tensor__"]]
        if set(tree) == {"__tuple__"}:
            return tuple(_unflatten(v, tensors) for v in tree["__tuple__"])
        return {k: _unflatten(v, tensors) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_unflatten(v, tensors) for v in tree]
    return tree


def write_state(folder: Path, state: dict[str, Any]) -> None:
    """Write `state` (a tree of dicts, lists, tuples, tensors and JSON scalars) into the
    existing, empty `folder` as one fsynced file named after its own sha256, streamed from
    the tensors' memory (`write_safetensors`: no buffer of the state's size)."""
    tensors: dict[str, torch.Tensor] = {}
    tree = _flatten(state, "", tensors, {})
    partial = folder / PARTIAL
    digest = write_safetensors(
        partial, tensors, metadata={FORMAT_KEY: FORMAT, TREE_KEY: json.dumps(tree)}
    )
    # The folder is a hidden temp until the caller renames it, so the rename is enough.
    os.replace(partial, folder / f"{PREFIX}{digest}{SUFFIX}")


PARTIAL = "state.partial"


def state_file(folder: Path) -> Path | None:
    """The folder's state file, or None when it holds none (not a checkpoint of ours)."""
    found = [p for p in folder.glob(f"{PREFIX}*{SUFFIX}") if NAME.match(p.name)]
    return found[0] if len(found) == 1 else None


def is_complete(folder: Path) -> bool:
    return state_file(folder) is not None


def read_state(folder: Path) -> dict[str, Any]:
    """The state tree saved in `folder`, after checking the file's sha256 against its name."""
    path = state_file(folder)
    if path is None:
        raise CorruptCheckpoint(f"{folder} holds no single {PREFIX}<sha256>{SUFFIX} file")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    expected = NAME.match(path.name).group(1)  # type: ignore[union-attr]
    if digest != expected:
        raise CorruptCheckpoint(
            f"{path} is damaged: its sha256 is {digest[:12]}…, its name says {expected[:12]}…"
        )
    with safe_open(path, framework="pt") as f:  # header only; the bytes are verified above
        metadata = f.metadata() or {}
    if metadata.get(FORMAT_KEY) != FORMAT or TREE_KEY not in metadata:
        raise CorruptCheckpoint(f"{path} is not a {FORMAT} checkpoint")
    return _unflatten(json.loads(metadata[TREE_KEY]), load_safetensors(data))


def step_folders(
    root: Path, complete: Callable[[Path], bool] = is_complete
) -> list[tuple[int, Path]]:
    """(step, folder) of every `step_XXXXXXXX` folder under `root` that `complete` accepts,
    oldest first."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = STEP_NAME.match(path.name)
        if match and path.is_dir() and complete(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def temp_folder(root: Path, step: int, nonce: str | None = None) -> Path:
    """A hidden folder name for step `step`'s write; `step_folders` never lists it."""
    return root / f"{TMP_PREFIX}step_{step:08d}-{nonce or uuid.uuid4().hex[:8]}"


def commit_folder(tmp: Path, root: Path, step: int) -> Path:
    """Rename the complete, fsynced `tmp` to step `step`'s folder under `root` (replacing
    an older write of the same step) and make the rename durable; returns the folder."""
    final = root / f"step_{step:08d}"
    if final.exists():  # the same step written again (after a resume)
        remove_inside(final, root)
    os.replace(tmp, final)
    fsync_path(root)
    return final


def write_step_folder(root: Path, step: int, state: dict[str, Any]) -> Path:
    """Write `state` as step `step`'s folder under `root`, atomically; returns it."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = temp_folder(root, step)
    with space_for(tmp, None), removed_on_failure(tmp):  # a failed write leaks no space
        tmp.mkdir()
        write_state(tmp, state)  # fsyncs its one file
        fsync_path(tmp)
    return commit_folder(tmp, root, step)


def remove_temps(root: Path) -> None:
    """Delete the hidden folders of interrupted writes under `root`."""
    for path in root.iterdir() if root.is_dir() else ():
        if path.name.startswith(TMP_PREFIX):
            log.warning("removing %s, left by an interrupted write", path)
            remove_inside(path, root, ignore_errors=True)
