"""Kill the orchestrator of a run with a curriculum mid-run and resume it: the curriculum
state and the problems drawn over both lives equal those of an uninterrupted run.

The datasets' verdicts do not depend on what the policy samples (a regex every completion
matches, or one none does), so both runs observe the same pass rates and any difference
comes from the saved state. Services run as real processes (tests/helpers/split_runs.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidal.cli.config import RunConfig
from tidal.cli.launcher import prepare_run_dir
from tidal.common.config.loading import load_config
from tidal.orchestrator.records.run_log import run_log_records

from ..helpers.split_runs import kill_and_resume_orchestrator, logged_prompts, running_services

ROOT = Path(__file__).resolve().parents[2]

CURRICULUM_STEPS, CURRICULUM_KILL_AFTER = 8, 5


def _fixed_verdict_dataset(path: Path, *, records: int, solved_every: int) -> Path:
    """Records whose verdict does not depend on the completion (so both runs see the same
    rewards whatever they sample): every `solved_every`-th always passes, the rest never."""
    always, never = "(?s).*", "(?!)"
    lines = [
        json.dumps(
            {
                "prompt": f"{i}>",
                "reference": "ab",
                "answer": always if i % solved_every == 0 else never,
            }
        )
        for i in range(records)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _curriculum_overrides(tmp_path: Path) -> list[str]:
    easy = _fixed_verdict_dataset(tmp_path / "easy.jsonl", records=8, solved_every=2)
    hard = _fixed_verdict_dataset(tmp_path / "hard.jsonl", records=10, solved_every=5)
    fields = 'verifier = "regex", eval_fraction = 0.0'
    tasks = [
        f'{{type = "dataset", name = "{p.stem}", path = "{p}", {fields}}}' for p in (easy, hard)
    ]
    return [
        "--orchestrator.warmup-steps", "1",
        "--orchestrator.steps", str(CURRICULUM_STEPS),
        "--orchestrator.prompts-per-step", "4",
        "--orchestrator.group-size", "2",
        "--orchestrator.report.table-every", "0",
        "--orchestrator.tasks", f"[{', '.join(tasks)}]",
        "--orchestrator.curriculum.skip-above", "1.0",
        "--orchestrator.curriculum.skip-below", "0.0",
        "--orchestrator.curriculum.min-samples", "2",
        "--orchestrator.curriculum.readmit-after", "3",
        "--orchestrator.curriculum.task-weighting", "learning_progress",
        "--grpc.shutdown-grace-s", "0.5",
    ]  # fmt: skip


def _curriculum_state(run_dir: Path) -> dict[str, object]:
    return json.loads((run_dir / "progress.json").read_text())["mixture_after"]["curriculum"]


@pytest.mark.slow
def test_resumed_orchestrator_continues_the_curriculum_of_an_uninterrupted_run(
    launch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    overrides = _curriculum_overrides(tmp_path)
    uninterrupted = launch(*overrides)
    assert uninterrupted.process.wait(timeout=300) == 0, uninterrupted.output()
    expected = logged_prompts(uninterrupted.run_dir)
    state = _curriculum_state(uninterrupted.run_dir)
    # the curriculum did act: problems were skipped and re-admitted, and the task weights
    # left the fixed 50/50 mixture
    assert state["skips"] > 0
    metrics = run_log_records(uninterrupted.run_dir / "metrics.jsonl")
    weights = {m["curriculum/easy/weight"] for m in metrics if "curriculum/easy/weight" in m}
    assert weights - {0.5}

    argv = ["@", str(ROOT / "configs" / "default.toml"), *overrides]
    argv += ["--run.output-dir", str(tmp_path / "split"), "--run.name", "resumed"]
    config, _ = load_config(RunConfig, argv)
    run_dir = prepare_run_dir(config)
    with running_services(run_dir) as services:
        kill_and_resume_orchestrator(
            services,
            run_dir,
            after_step=1 + CURRICULUM_KILL_AFTER,
            last_step=1 + CURRICULUM_STEPS,
        )

    assert logged_prompts(run_dir) == expected
    assert _curriculum_state(run_dir) == state
