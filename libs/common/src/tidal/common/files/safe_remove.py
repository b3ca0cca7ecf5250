"""Deletes folders only where they belong: `remove_inside(path, root)`.

Every `shutil.rmtree` of a path from configuration or a request goes through it: both paths
are resolved (symlinks and `..` included) and anything not strictly inside `root` is
refused with `UnsafeRemoval`, a plain RuntimeError rather than a gRPC-mapped error, since
callers validate user input first and reaching it means a validation is missing. A
symlink inside `root` that points outside is unlinked, never followed.
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
