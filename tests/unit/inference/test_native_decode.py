"""The decode kernel's build: compiled once per source, flags and CPU, then reused; a
compiler that fails is an error naming it; a shared temporary folder someone else could
write is refused rather than loaded from."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tidal.inference import native_decode
from tidal.inference.native_decode import CACHE_ENV, PagedDecodeLibrary, build


@pytest.fixture
def counting_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """CXX = a script that writes its `-o` target and logs each compile to the returned file
    (the build's caching is what is tested here; the real compile is the decode tests')."""
    log = tmp_path / "compiles"
    script = tmp_path / "cxx"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1" = --version ] && { echo "fake c++ 1.0"; exit 0; }\n'
        'while [ "$1" != -o ]; do shift; done\n'
        f'echo built >> {log}; echo library > "$2"\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("CXX", str(script))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "kernels"))
    return log


def test_a_build_is_compiled_once_and_reused(counting_compiler: Path, tmp_path: Path) -> None:
    first = build()
    assert first.parent == tmp_path / "kernels" and first.suffix == ".so"
    assert build() == first  # found by its name: not compiled again
    assert counting_compiler.read_text().count("built") == 1
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no partial file left


def test_another_cpu_gets_a_build_of_its_own(
    counting_compiler: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = build()
    monkeypatch.setattr(native_decode, "_cpu_flags", lambda: "flags : sse2")
    elsewhere = build()
    assert elsewhere != here and counting_compiler.read_text().count("built") == 2


def test_the_real_build_loads_with_the_symbol_the_engine_calls() -> None:
    PagedDecodeLibrary(build())  # the user's cache, as the decode tests built it


def test_a_failing_compiler_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(RuntimeError, match="no working C\\+\\+ compiler '/nonexistent/c\\+\\+'"):
        build()


def test_a_temporary_folder_others_can_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv(CACHE_ENV, str(blocked / "kernels"))  # cannot be made: a file's child
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shared = tmp_path / f"tidal-kernels-{os.getuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(RuntimeError, match="is not this user's alone"):
        native_decode._cache_dir()
    shared.chmod(0o700)
    assert native_decode._cache_dir() == shared
