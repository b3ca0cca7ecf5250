"""Durable writes: the old or the new content, never a torn one; no temp file left over."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tidal.common.errors import DiskFull
from tidal.common.files.durable import (
    as_disk_full,
    commit_dir,
    fsync_tree,
    removed_on_failure,
    write_atomic,
    write_hashed,
)


def test_write_atomic_replaces_the_file_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "progress.json"
    write_atomic(path, "old")
    write_atomic(path, "new")
    assert path.read_text() == "new"
    assert [p.name for p in path.parent.iterdir()] == ["progress.json"]


def test_commit_dir_makes_a_written_folder_visible_under_its_final_name(tmp_path: Path) -> None:
    tmp = tmp_path / ".v1.tmp"
    (tmp / "inner").mkdir(parents=True)
    (tmp / "inner" / "weights.bin").write_bytes(b"\x01\x02")
    fsync_tree(tmp)
    commit_dir(tmp, tmp_path / "v1")
    assert not tmp.exists()
    assert (tmp_path / "v1" / "inner" / "weights.bin").read_bytes() == b"\x01\x02"


def test_commit_dir_never_replaces_an_existing_version(tmp_path: Path) -> None:
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "keep").write_text("published")
    tmp = tmp_path / ".v1.tmp"
    tmp.mkdir()
    with pytest.raises(FileExistsError, match="v1"):
        commit_dir(tmp, tmp_path / "v1")
    assert (tmp_path / "v1" / "keep").read_text() == "published"


def test_write_hashed_returns_the_sha256_of_exactly_the_bytes_written(tmp_path: Path) -> None:
    import hashlib

    from tidal.common.files.durable import IO_SLICE, write_hashed

    chunks = [b"header", bytearray(range(256)) * 7, memoryview(b"x" * (IO_SLICE + 3)), b""]
    path = tmp_path / "f.bin"
    path.write_bytes(b"an older, longer content" * 10)  # replaced, not appended to
    digest = write_hashed(path, chunks)
    data = path.read_bytes()
    assert data == b"".join(bytes(c) for c in chunks)
    assert digest == hashlib.sha256(data).hexdigest()


def test_write_hashed_raises_what_the_hashing_thread_raised(tmp_path: Path) -> None:
    from tidal.common.files.durable import write_hashed

    with pytest.raises(TypeError):
        write_hashed(tmp_path / "f.bin", [b"ok", "not bytes"])  # type: ignore[list-item]


FULL = Path("/dev/full")  # every write(2) to it fails with ENOSPC


@pytest.mark.skipif(not FULL.exists(), reason="no /dev/full")
def test_a_write_to_a_full_disk_raises_disk_full_naming_path_and_size(tmp_path: Path) -> None:
    path = tmp_path / "state.partial"
    path.symlink_to(FULL)
    with pytest.raises(DiskFull, match=r"disk full: .*state.partial could not be written") as err:
        write_hashed(path, [b"x" * (3 << 20), b"y" * (1 << 20)])
    assert err.value.needed_bytes == 4 << 20
    assert "at least 4.0 MiB needed" in str(err.value)
    assert not path.is_symlink() and FULL.exists()  # the partial file is gone, not its target


def test_a_failed_write_leaves_no_temp_file_or_folder(tmp_path: Path) -> None:
    folder = tmp_path / ".tmp-step_00000003"
    with pytest.raises(DiskFull), removed_on_failure(folder):
        folder.mkdir()
        (folder / "state.partial").write_bytes(b"half")
        raise DiskFull(folder / "state.partial", 10)
    assert list(tmp_path.iterdir()) == []


def test_a_wrapped_enospc_is_a_disk_full_and_other_errors_stay_themselves(
    tmp_path: Path,
) -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "v3"))
        except OSError as exc:
            raise RuntimeError("the publish failed") from exc
    except RuntimeError as wrapped:
        found = as_disk_full(wrapped, tmp_path)
    assert isinstance(found, DiskFull) and found.path == tmp_path / "v3"
    other = OSError(errno.EACCES, "Permission denied")
    assert as_disk_full(other, tmp_path) is other
