"""Deleting folders only where they belong: `remove_inside(path, root)`.

Decisions:
- Every `shutil.rmtree` of a path derived from configuration or a request (run folders,
  checkpoints, weight versions, upload temps) goes through `remove_inside`, which
  resolves both paths (symlinks and `..` included) and refuses, with `UnsafeRemoval`,
  anything that is not strictly inside `root`: the root itself, a parent of it, or a
  sibling. An operator's `--run.name ../x` or a `Publish` whose location is the weights
  root then fails loudly instead of deleting what it names.
- The check is a programming-error guard (callers validate user input first, naming the
  key), so `UnsafeRemoval` is a plain `RuntimeError` subclass, not a gRPC-mapped error:
  reaching it means a validation upstream is missing.
- A symlink inside `root` that points outside it is unlinked, never followed.
"""

from __future__ import annotations

import shutil
from pathlib import Path


class UnsafeRemoval(RuntimeError):
    """Refused to delete a path outside the folder it must be inside."""


def is_strictly_inside(path: Path, root: Path) -> bool:
    """True when `path` resolves to a location under `root` (and is not `root` itself)."""
    resolved, base = path.resolve(), root.resolve()
    return resolved != base and resolved.is_relative_to(base)


def remove_inside(path: Path, root: Path, *, ignore_errors: bool = False) -> None:
    """`shutil.rmtree(path)` after checking that `path` lies strictly inside `root`."""
    if path.is_symlink():
        link_parent = path.parent.resolve()
        if link_parent != root.resolve() and not is_strictly_inside(link_parent, root):
            raise UnsafeRemoval(f"refusing to delete {path}: it is not inside {root}")
        path.unlink()
        return
    if not is_strictly_inside(path, root):
        raise UnsafeRemoval(
            f"refusing to delete {path} (resolves to {path.resolve()}): it is not inside "
            f"{root.resolve()}"
        )
    shutil.rmtree(path, ignore_errors=ignore_errors)
