"""`tidal`: flags without values, and `--help` (keys set first, one section, every key)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tidal.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ["@", str(ROOT / "configs" / "default.toml")]


def exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    return int(exit_.value.code or 0)


def test_rl_flag_without_value_fails_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["rl", *DEFAULT, "--trainer.optim.lr", "--dry-run"]) == 2
    assert "--trainer.optim.lr needs a value" in capsys.readouterr().err


def test_rl_flag_before_dry_run_is_not_given_true(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["rl", *DEFAULT, "--orchestrator.steps", "--dry-run"]) == 2
    assert "--orchestrator.steps needs a value" in capsys.readouterr().err


def test_rl_bare_boolean_flag_sets_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["rl", *DEFAULT, "--orchestrator.resume", "--dry-run"]) == 0
    assert "resume = true" in capsys.readouterr().out


def test_rl_help_all_lists_optional_and_tagged_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["rl", "--help", "all"]) == 0
    out = capsys.readouterr().out
    assert "--trainer.model.lora.rank " in out
    assert "--orchestrator.task.alphabet " in out and "--orchestrator.task.num_numbers " in out
    assert "--weightsync.transport.replicas " in out


def test_rl_help_shows_toml_values_not_python_reprs(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["rl", "--help", "all"]) == 0
    out = capsys.readouterr().out
    assert '--run.output_dir (default: "outputs")' in out
    assert "PosixPath" not in out and "TaskConfig(" not in out and "PydanticUndefined" not in out


def test_rl_help_is_short_and_names_the_sections(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["rl", "--help"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) < 120
    assert "--trainer.optim.lr " in out and "--orchestrator.task.type " in out
    assert "--trainer.optim.eps " not in out
    assert "orchestrator: task, " in out and " sampling, " in out and "--help SECTION" in out


def test_rl_help_section_lists_its_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["rl", "--help", "orchestrator.staleness"]) == 0
    out = capsys.readouterr().out
    assert "[orchestrator.staleness]" in out and "--orchestrator.staleness.max_async (" in out
    assert "--trainer." not in out and "--orchestrator.steps" not in out


def test_rl_help_unknown_section_names_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["rl", "--help", "orchestrator.stalenes"]) == 2
    assert "did you mean 'orchestrator.staleness'?" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command", ["orchestrator", "inference", "trainer", "weightsync", "sft", "export"]
)
def test_every_command_help_names_its_sections(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_code([command, "--help"]) == 0
    assert "Sections (`--help SECTION`" in capsys.readouterr().out


def test_help_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "from tidal.cli.main import main\n"
        "for command in ('rl', 'trainer', 'inference', 'sft'):\n"
        "    try:\n"
        "        main([command, '--help', 'trainer'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('torch' in sys.modules, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "False", done.stderr
