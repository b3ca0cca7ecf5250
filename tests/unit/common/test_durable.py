"""Durable writes: the old or the new content, never a torn one; no temp file left over."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.common.files.durable import commit_dir, fsync_tree, write_atomic


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
