"""`tidal import-model`: refusals are one line on stderr with exit status 2, `--help` needs
neither torch nor transformers, and a GGUF converts from the command line with a report
of what was written (a tiny Llama: the real model's conversion is `tests/smollm2.py`'s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tidal.cli.main import main
from tidal.models.hf_folder import read_weights

from ..models.tiny_gguf import tiny_llama


def exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    return int(exit_.value.code or 0)


def test_a_missing_file_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_code(["import-model", str(tmp_path / "m.gguf"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "m.gguf does not exist" in err
    assert not (tmp_path / "o").exists()


def test_out_is_required_and_dtype_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["import-model", "m.gguf"]) == 2
    assert "--out" in capsys.readouterr().err
    assert exit_code(["import-model", "m.gguf", "--out", "o", "--dtype", "float16"]) == 2
    assert "invalid choice: 'float16'" in capsys.readouterr().err


def test_help_imports_no_torch_transformers_or_gguf() -> None:
    code = (
        "import sys\n"
        "from tidal.cli.main import main\n"
        "try:\n"
        "    main(['import-model', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted({'torch', 'transformers', 'gguf'} & set(sys.modules)), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "--dtype {float32,bfloat16}" in done.stdout
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr


def test_a_gguf_imports_from_the_command_line_and_reports_what_it_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf = tiny_llama(tmp_path / "tiny.gguf")
    out = tmp_path / "tiny-bf16"
    main(["import-model", str(gguf), "--out", str(out), "--dtype", "bfloat16"])
    report = capsys.readouterr().out
    assert f"{gguf} -> {out}" in report and "llama, 0.0M parameters in bfloat16" in report
    assert "(dequantized from 11 F32, 9 Q8_0)" in report and f"--trainer.model.path {out}" in report
    assert "bos_token_id 1, eos_token_id 2, pad_token_id 2" in report
    assert {t.dtype for t in read_weights(out).values()} == {torch.bfloat16}
