"""Atomic shared-filesystem publish: complete or invisible, and verified on read."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from tidal.weights.folder import TMP_PREFIX, load_version, sweep_partial, write_version
from tidal.weights.manifest import CorruptWeights, WeightManifest, verify_files


def state() -> dict[str, torch.Tensor]:
    return {"a.weight": torch.randn(4, 3), "b.bias": torch.arange(5, dtype=torch.float32)}


def test_round_trip_is_bit_identical(tmp_path: Path) -> None:
    tensors = state()
    manifest = write_version(tmp_path, version=3, step=3, state_dict=tensors, config={"x": 1})
    assert Path(manifest.location).name == "v000003"
    assert WeightManifest.read(Path(manifest.location)) == manifest
    config, loaded = load_version(manifest)
    assert config == {"x": 1}
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())


def test_corrupted_file_is_refused(tmp_path: Path) -> None:
    manifest = write_version(tmp_path, version=0, step=0, state_dict=state(), config={})
    path = Path(manifest.location) / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptWeights, match=r"sha256 of model\.safetensors"):
        load_version(manifest)


def test_truncated_file_is_refused(tmp_path: Path) -> None:
    manifest = write_version(tmp_path, version=0, step=0, state_dict=state(), config={})
    path = Path(manifest.location) / "model.safetensors"
    path.write_bytes(path.read_bytes()[:10])
    with pytest.raises(CorruptWeights, match="bytes, manifest says"):
        load_version(manifest)


def test_existing_version_is_never_overwritten(tmp_path: Path) -> None:
    write_version(tmp_path, version=1, step=1, state_dict=state(), config={})
    with pytest.raises(FileExistsError):
        write_version(tmp_path, version=1, step=1, state_dict=state(), config={})


def test_crash_mid_publish_leaves_no_visible_version(tmp_path: Path) -> None:
    def exploding_tensors() -> dict[str, torch.Tensor]:
        # A non-tensor value makes safetensors fail after the temp folder exists.
        return {"ok": torch.zeros(2), "bad": "not a tensor"}  # type: ignore[dict-item]

    with pytest.raises(Exception):  # noqa: B017 - any failure mid-write
        write_version(tmp_path, version=2, step=2, state_dict=exploding_tensors(), config={})
    assert not (tmp_path / "v000002").exists()
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(TMP_PREFIX)] == []
    sweep_partial(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_load_reads_each_file_once_into_one_buffer_the_tensors_view(tmp_path: Path) -> None:
    tensors = state()
    manifest = write_version(tmp_path, version=0, step=0, state_dict=tensors, config={})
    _, loaded = load_version(manifest)
    # Every tensor views the verified read buffer (no copies): all lie inside one span of
    # the file's size, in the file's order.
    spans = sorted((t.data_ptr(), t.data_ptr() + t.nbytes) for t in loaded.values())
    size = (Path(manifest.location) / "model.safetensors").stat().st_size
    assert spans[-1][1] - spans[0][0] <= size
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())


def test_the_writer_hashes_what_it_writes_without_reading_the_files_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[Path] = []
    real_open = Path.open

    def spying_open(self: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "r" in mode:
            reads.append(self)
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "open", spying_open)
    tensors = state()
    manifest = write_version(tmp_path, version=0, step=0, state_dict=tensors, config={"x": 1})
    monkeypatch.undo()
    assert reads == []  # one pass: each digest is of the bytes as they were written
    verify_files(manifest)  # and it is the digest of the bytes on disk


def test_companion_files_are_in_the_manifest_and_verified_on_read(tmp_path: Path) -> None:
    extra = {"tokenizer.json": b'{"model": {}}', "generation_config.json": b"{}"}
    manifest = write_version(
        tmp_path, version=0, step=0, state_dict=state(), config={}, extra_files=extra
    )
    folder = Path(manifest.location)
    assert {f.path for f in manifest.files} == {"model.safetensors", "config.json", *extra}
    assert (folder / "tokenizer.json").read_bytes() == extra["tokenizer.json"]
    load_version(manifest)  # verified whole
    (folder / "tokenizer.json").write_bytes(b'{"model": 1}')
    with pytest.raises(CorruptWeights, match=r"tokenizer\.json"):
        load_version(manifest)


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "manifest.json"])
def test_a_companion_file_may_not_replace_the_versions_own(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="companion file names"):
        write_version(
            tmp_path, version=0, step=0, state_dict=state(), config={},
            extra_files={name: b"{}"},
        )  # fmt: skip


def test_a_staged_version_is_invisible_and_never_adopted_until_committed(tmp_path: Path) -> None:
    """The trainer stages version n beside step n's checkpoint: until `commit` it is a temp
    folder that readers ignore and weightsync's recovery sweeps instead of adopting."""
    from tidal.weights.codec import encode_files
    from tidal.weights.folder import stage_files
    from tidal.weightsync.recovery import recover_versions

    tensors = state()
    files = encode_files(state_dict=tensors, config={"x": 1})
    staged = stage_files(tmp_path, version=4, step=4, files=files)
    assert not (tmp_path / "v000004").exists()
    assert staged.tmp.name.startswith(TMP_PREFIX)
    assert recover_versions(tmp_path, ("model.safetensors",)) == []  # a restart: swept
    assert not staged.tmp.exists()

    staged = stage_files(tmp_path, version=4, step=4, files=files)
    manifest = staged.commit()
    assert staged.commit() == manifest  # idempotent: a retried publish commits once
    _, loaded = load_version(manifest)
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())
    assert [m.version for m in recover_versions(tmp_path, ("model.safetensors",))] == [4]
