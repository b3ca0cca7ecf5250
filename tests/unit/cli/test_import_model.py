"""`tidal import-model`: refusals are one line on stderr with exit status 2, and the real
GGUF converts from the command line into a bfloat16 folder holding the float32 import's
weights rounded (`slow`: one conversion)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tidal.cli.main import main
from tidal.models.hf_folder import read_weights

from ...smollm2 import converted_folder, smollm2_gguf


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


@pytest.mark.slow
def test_the_real_gguf_imports_as_bfloat16_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gguf = smollm2_gguf()
    out = tmp_path / "smollm2-bf16"
    main(["import-model", str(gguf), "--out", str(out), "--dtype", "bfloat16"])
    report = capsys.readouterr().out
    assert f"-> {out}" in report and "llama, 134.5M parameters in bfloat16" in report
    assert "210 Q4_1" in report and f"--trainer.model.path {out}" in report
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    exact = read_weights(converted_folder(gguf))
    for name, tensor in read_weights(out).items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, exact[name].bfloat16())
