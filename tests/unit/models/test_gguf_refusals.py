"""`import_gguf` refuses what it cannot convert before anything slow, naming the field, and
leaves no output folder behind: a missing file, a file that is not GGUF, an architecture
Tidal's families lack (by `general.architecture`, or as transformers reads the file), a
tensor type `gguf` cannot dequantize, a weight the architecture needs. The files are tiny
GGUFs (`tiny_gguf.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.models.gguf_file import GGUFImportError, read_gguf
from tidal.models.gguf_import import import_gguf
from tidal.models.hf_config import ModelFolderError

from .tiny_gguf import header_only, tiny_llama


def refusal(path: Path, out: Path) -> str:
    with pytest.raises(GGUFImportError) as exc:
        import_gguf(path, out)
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.tmp-*"))
    return str(exc.value)


def test_a_missing_file_is_refused_naming_it(tmp_path: Path) -> None:
    message = refusal(tmp_path / "absent.gguf", tmp_path / "out")
    assert "absent.gguf does not exist" in message


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model.gguf").write_bytes(b"not a gguf file at all")
    assert "is not a GGUF file" in refusal(tmp_path / "model.gguf", tmp_path / "out")


def test_an_architecture_without_a_tidal_family_is_refused_naming_the_field(
    tmp_path: Path,
) -> None:
    path = header_only(tmp_path / "m.gguf", "mamba")
    message = refusal(path, tmp_path / "out")
    assert "general.architecture = 'mamba' is not a Tidal model family" in message
    assert "'llama'" in message and "'qwen3moe'" in message


def test_a_tensor_type_gguf_cannot_dequantize_is_refused_naming_the_tensor(
    tmp_path: Path,
) -> None:
    path = header_only(tmp_path / "m.gguf", "llama", tensor_type="I8")
    message = refusal(path, tmp_path / "out")
    assert "tensor token_embd.weight has type I8" in message and "cannot dequantize" in message


def test_a_llama_file_transformers_reads_as_mistral_is_refused(tmp_path: Path) -> None:
    # transformers reads a llama GGUF named "mistral" as MistralForCausalLM.
    path = header_only(tmp_path / "m.gguf", "llama", name="mistral")
    assert "unsupported architecture 'mistral'" in refusal(path, tmp_path / "out")


def test_a_file_without_a_tokenizer_is_refused_naming_the_field(tmp_path: Path) -> None:
    path = header_only(tmp_path / "m.gguf", "llama", tokenizer=None)
    assert "has no tokenizer.ggml.model" in refusal(path, tmp_path / "out")


def test_a_tokenizer_transformers_cannot_build_is_refused(tmp_path: Path) -> None:
    path = header_only(tmp_path / "m.gguf", "llama", tokenizer="rwkv")
    message = refusal(path, tmp_path / "out")
    assert "transformers cannot read it" in message and "tokenizer" in message


def test_a_file_missing_a_weight_is_refused_naming_it(tmp_path: Path) -> None:
    # transformers would initialize it at random and load the rest.
    path = tiny_llama(tmp_path / "m.gguf", without="blk.1.ffn_down.weight")
    message = refusal(path, tmp_path / "out")
    assert "lacks weights of its architecture" in message
    assert "model.layers.1.mlp.down_proj.weight" in message


def test_the_header_names_family_and_tensor_types(tmp_path: Path) -> None:
    summary = read_gguf(header_only(tmp_path / "m.gguf", "qwen3moe", tensor_type="F16"))
    assert (summary.architecture, summary.family) == ("qwen3moe", "qwen3_moe")
    assert summary.tensor_types == {"F16": 1} and summary.name == "tiny"


def test_an_output_that_is_not_a_model_folder_is_refused_untouched(tmp_path: Path) -> None:
    path = header_only(tmp_path / "m.gguf", "llama")
    out = tmp_path / "home"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ModelFolderError, match="is not a model folder"):
        import_gguf(path, out)
    assert (out / "notes.txt").read_text() == "keep me"


def test_an_unknown_dtype_is_refused(tmp_path: Path) -> None:
    with pytest.raises(GGUFImportError, match="dtype 'float16' is not one of"):
        import_gguf(tmp_path / "m.gguf", tmp_path / "out", dtype="float16")
