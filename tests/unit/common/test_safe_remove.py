"""`remove_inside`: folders are deleted only strictly inside the folder they belong to."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.common.files.safe_remove import UnsafeRemoval, remove_inside


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "root" / "run" / "sub").mkdir(parents=True)
    (tmp_path / "root" / "run" / "sub" / "f.txt").write_text("inside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "sentinel.txt").write_text("outside")
    return tmp_path / "root"


def test_a_folder_inside_the_root_is_removed(root: Path) -> None:
    remove_inside(root / "run", root)
    assert not (root / "run").exists() and root.is_dir()


@pytest.mark.parametrize("target", [".", "..", "../outside", "run/../../outside"])
def test_the_root_its_parents_and_siblings_are_refused(root: Path, target: str) -> None:
    with pytest.raises(UnsafeRemoval, match="not inside"):
        remove_inside(root / target, root)
    assert (root.parent / "outside" / "sentinel.txt").read_text() == "outside"
    assert (root / "run" / "sub" / "f.txt").is_file()


def test_a_symlink_inside_pointing_outside_is_unlinked_not_followed(root: Path) -> None:
    (root / "link").symlink_to(root.parent / "outside")
    remove_inside(root / "link", root)
    assert not (root / "link").exists()
    assert (root.parent / "outside" / "sentinel.txt").read_text() == "outside"


def test_a_root_reached_through_a_symlinked_parent_is_refused(root: Path) -> None:
    (root / "run" / "up").symlink_to(root.parent)
    with pytest.raises(UnsafeRemoval):
        remove_inside(root / "run" / "up" / "outside", root)
    assert (root.parent / "outside" / "sentinel.txt").is_file()
