"""The one-process checkpoint format: safetensors + JSON + a sha256 manifest, no pickle.

Decisions:
- Why not DCP for one process: measured on the default model (403K parameters, Adam),
  `dcp.save` took ~48 ms of a ~56 ms checkpoint, almost all of it planning and pickling
  overhead, not bytes; this format writes the same state in ~12 ms (incl. fsync). That
  is what lets checkpoints be on, at every step, by default (docs/training.md).
- Why not pickle: a checkpoint folder is data that someone else may have written. DCP
  reads its `.metadata` with a plain `pickle.load` (torch's `weights_only` does not
  cover it), so loading a planted checkpoint would run code. Here the tensors are one
  safetensors file and everything else (step, scheduler, optimizer hyper-parameters, the
  caller's `extra`) is JSON: nothing loaded can execute.
- Layout: one file, `state.<sha256>.safetensors`: every tensor of the state tree keyed
  by its path, and in the safetensors header the tree itself as JSON (each tensor
  replaced by `{"__tensor__": key}`, tuples by `{"__tuple__": [...]}`). The file is named
  after its own sha256, and `read_state` checks it before anything is parsed, so a torn
  or flipped file is refused, naming it. One file because fsync dominates a small
  save: the first version of this format (two files and a manifest) spent more time in
  its four fsyncs than in everything else together.
- Tensors that share memory (tied embedding and head) are stored once; the second path
  refers to the first.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from tidal.common.files.durable import write_hashed

PREFIX = "state."
SUFFIX = ".safetensors"
NAME = re.compile(r"^state\.([0-9a-f]{64})\.safetensors$")
FORMAT = "tidal-checkpoint-1"
FORMAT_KEY = "tidal.format"
TREE_KEY = "tidal.tree"


class CorruptCheckpoint(ValueError):
    """A checkpoint's files do not match its manifest (or it has none)."""


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
    existing, empty `folder` as one fsynced file named after its own sha256.

    Streamed: the safetensors header is built from the tensors' shapes, then every
    tensor's bytes go to the hash and the file straight from its memory, so a save reads
    the state twice (hash, write) instead of four times (safetensors' two copies into
    one buffer, hash, write), and allocates no buffer of the state's size: on the 33.6M
    model's ~400 MB of weights and AdamW moments that was most of a save's CPU time.
    The file is the one `encode_state` makes but for the order of the two metadata keys
    (safetensors' own order is a hash map's); a unit test holds them equivalent."""
    tensors: dict[str, torch.Tensor] = {}
    tree = _flatten(state, "", tensors, {})
    header, ordered = _header(tensors, {FORMAT_KEY: FORMAT, TREE_KEY: json.dumps(tree)})
    partial = folder / PARTIAL
    digest = write_hashed(partial, [header, *(_raw(t) for t in ordered)])  # hash ‖ write
    # The folder is a hidden temp until the caller renames it, so the rename is enough.
    os.replace(partial, folder / f"{PREFIX}{digest}{SUFFIX}")


PARTIAL = "state.partial"
_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip


def _header(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> tuple[bytes, list[torch.Tensor]]:
    """The safetensors header (8-byte length + JSON, space-padded to 8 bytes) and the
    tensors in the order their bytes follow it: safetensors' own order (larger elements
    first, then by name, which keeps every tensor aligned to its element size)."""
    names = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    entries: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name in names:
        t = tensors[name]
        if t.dtype not in _DTYPES:
            raise TypeError(f"checkpoint tensor {name} has dtype {t.dtype}, not one we write")
        size = t.numel() * t.element_size()
        entries[name] = {
            "dtype": _DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, [tensors[n] for n in names]


def _raw(t: torch.Tensor) -> memoryview:
    """A contiguous CPU tensor's bytes, without a copy."""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


def encode_state(state: dict[str, Any]) -> bytes:
    """`state` as the bytes of one state file: the only step that reads its tensors (the
    rest of a save works on these bytes, so the tensors may change once this returns)."""
    tensors: dict[str, torch.Tensor] = {}
    tree = _flatten(state, "", tensors, {})
    return save_safetensors(tensors, metadata={FORMAT_KEY: FORMAT, TREE_KEY: json.dumps(tree)})


def write_encoded(folder: Path, data: bytes) -> None:
    """Write `encode_state`'s bytes into the existing, empty `folder`: one fsynced file
    named after its own sha256."""
    path = folder / f"{PREFIX}{hashlib.sha256(data).hexdigest()}{SUFFIX}"
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


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
