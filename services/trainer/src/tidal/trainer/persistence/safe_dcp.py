"""Loading torch.distributed.checkpoint (DCP) folders without running pickled code.

DCP reads `.metadata` with a plain `pickle.load` and non-tensor items with
`torch.load(weights_only=False)`, so a checkpoint folder written by someone else could run
code in the trainer. `SafeFileSystemReader` unpickles `.metadata` with an allowlist (DCP's
metadata classes, torch dtypes, `torch.Size`, the memory-format helper, `pathlib` paths,
and `getattr` only as the by-name form of an allowed enum's member, which Debian's Python
3.11 and Python 3.12+ write; any other global is `UnsafeCheckpoint` naming it) and
`SafeLoadPlanner` reads non-tensor items with `weights_only=True`; DCP already reads
tensors that way.
"""

from __future__ import annotations

import enum
import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

_ALLOWED = {
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}


class UnsafeCheckpoint(ValueError):
    """A checkpoint's metadata names code it has no business naming."""


def _enum_member(cls: Any, name: Any) -> Any:
    """`getattr(cls, name)` as an enum member pickled by name: `cls` came through the
    allowlist, and only one of its members is returned."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and name in cls.__members__:
        return cls[name]
    raise UnsafeCheckpoint(
        f"checkpoint metadata asks for attribute {name!r} of {cls!r}, which is no enum "
        "member; refusing to load it (was the checkpoint folder written by someone else?)"
    )


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if module == "torch.distributed.checkpoint.metadata" or name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpoint(
            f"checkpoint metadata refers to {module}.{name}, which a DCP checkpoint never "
            "holds; refusing to load it (was the checkpoint folder written by someone else?)"
        )


class SafeFileSystemReader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = _MetadataUnpickler(stream).load()
        if not isinstance(metadata, Metadata):
            raise UnsafeCheckpoint(f"{path} holds a {type(metadata).__name__}, not DCP Metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
