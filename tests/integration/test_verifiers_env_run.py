"""A real `tidal rl` whose task is a `verifiers` environment (tests/helpers/vf_vowels.py):
inference serves its HTTP endpoint, the orchestrator runs the environment's episodes through
verifiers' train client against `/inference/v1/generate`, and the trainer trains on them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidal.orchestrator.records.run_log import run_log_records

from ..hf_folders import qwen3_folder

__all__ = ["qwen3_folder"]

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
STEPS = 2


@pytest.fixture(autouse=True)
def _env_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launched orchestrator imports the environment by its taskset id."""
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", f"{HELPERS}{os.pathsep}{path}" if path else str(HELPERS))


@pytest.mark.slow
def test_a_verifiers_environment_trains_as_a_task(launch, qwen3_folder: Path) -> None:  # type: ignore[no-untyped-def]
    run = launch(
        "--trainer.model.path", str(qwen3_folder),
        "--inference.http.enabled", "true",
        "--orchestrator.task", '{type = "verifiers", env = "vf_vowels", args = {size = 4}}',
        "--orchestrator.warmup-steps", "0",
        "--orchestrator.steps", str(STEPS),
        "--orchestrator.prompts-per-step", "2",
        "--orchestrator.group-size", "2",
        "--orchestrator.sampling.max-tokens", "8",
    )  # fmt: skip
    assert run.process.wait(timeout=300) == 0, run.output()
    metrics = run_log_records(run.run_dir / "metrics.jsonl")
    assert [m["phase"] for m in metrics] == ["rl"] * STEPS
    assert all(m["trained_tokens"] > 0 for m in metrics)
    assert all(0 <= m["task/vf_vowels/reward_mean"] <= 1 for m in metrics)
    # every trained token came with the policy version that produced it
    assert all(m["train/staleness_share/unknown"] == 0 for m in metrics)


def test_without_the_http_server_the_run_stops_naming_the_key(launch, qwen3_folder: Path) -> None:  # type: ignore[no-untyped-def]
    run = launch(
        "--trainer.model.path", str(qwen3_folder),
        "--orchestrator.task", '{type = "verifiers", env = "vf_vowels"}',
        "--orchestrator.warmup-steps", "0",
    )  # fmt: skip
    assert run.process.wait(timeout=120) != 0
    assert "inference.http.enabled" in run.output()
