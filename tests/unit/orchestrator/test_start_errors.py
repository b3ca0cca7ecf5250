"""A bad task, tokenizer or chat config stops `tidal orchestrator` before it serves or waits
for any peer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _orchestrator(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tidal.cli",
            "orchestrator",
            "--run.output-dir",
            str(tmp_path),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_unknown_task_import_path_fails_at_start_with_the_valid_choices(tmp_path: Path) -> None:
    done = _orchestrator(
        tmp_path, "--orchestrator.task.type", "import", "--orchestrator.task.path", "nope_pkg:Task"
    )
    assert done.returncode == 2
    assert "orchestrator task path 'nope_pkg:Task': cannot import" in done.stderr
    types = "['arithmetic', 'code', 'countdown', 'dataset', 'lookup', 'reasoning_gym', 'reversal']"
    assert f"built-in types {types}" in done.stderr


def test_unknown_algorithm_fails_at_start_with_the_valid_choices(tmp_path: Path) -> None:
    done = _orchestrator(tmp_path, "--orchestrator.advantages.algorithm", "ppo")
    assert done.returncode == 2
    assert "'grpo', 'dr_grpo', 'rloo' or 'remax'" in done.stderr


def test_a_system_prompt_with_plain_text_prompts_fails_at_start_naming_the_key(
    tmp_path: Path,
) -> None:
    done = _orchestrator(tmp_path, "--orchestrator.chat.system-prompt", "Be brief.")
    assert done.returncode == 2
    assert "orchestrator.chat.system_prompt is set but prompts are plain text" in done.stderr


def test_a_tokenizer_folder_that_does_not_exist_fails_at_start(tmp_path: Path) -> None:
    done = _orchestrator(tmp_path, "--run.tokenizer", str(tmp_path / "missing"))
    assert done.returncode == 2
    assert str(tmp_path / "missing") in done.stderr
