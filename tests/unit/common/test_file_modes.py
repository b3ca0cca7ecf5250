"""The run's file policy (tidal.common.files.modes): what a process of the run creates is
its user's only unless `run.shared_readable`, and folders made for keys are 0700 without
ever changing a folder that already exists."""

from __future__ import annotations

import stat
from pathlib import Path

from tidal.common.files.modes import apply_file_policy, make_private_dirs


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def make_some(root: Path) -> tuple[Path, Path]:
    folder = root / "weights" / "v1"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w")
    return folder, folder / "model.safetensors"


def test_by_default_what_the_run_creates_is_its_users_only(tmp_path: Path) -> None:
    apply_file_policy(shared_readable=False)
    folder, file = make_some(tmp_path)
    assert (mode(folder.parent), mode(folder), mode(file)) == (0o700, 0o700, 0o600)


def test_shared_readable_lets_others_read_but_not_write(tmp_path: Path) -> None:
    apply_file_policy(shared_readable=True)
    folder, file = make_some(tmp_path)
    assert (mode(folder.parent), mode(folder), mode(file)) == (0o755, 0o755, 0o644)


def test_apply_returns_the_umask_it_replaced() -> None:
    apply_file_policy(shared_readable=True)
    assert apply_file_policy(shared_readable=False) == 0o022
    assert apply_file_policy(shared_readable=False) == 0o077


def test_private_dirs_are_0700_even_under_a_shared_umask(tmp_path: Path) -> None:
    apply_file_policy(shared_readable=True)
    make_private_dirs(tmp_path / "a" / "b")
    assert mode(tmp_path / "a") == mode(tmp_path / "a" / "b") == 0o700


def test_private_dirs_leave_an_existing_shared_folder_as_it_is(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    make_private_dirs(shared)
    make_private_dirs(shared / "tls")
    assert mode(shared) == 0o1777
    assert mode(shared / "tls") == 0o700
