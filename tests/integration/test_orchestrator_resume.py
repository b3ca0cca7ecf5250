"""Kill the orchestrator mid-run, restart it with --orchestrator.resume: the prompts seen
over both lives equal those of an uninterrupted run, and no step is trained twice.

The services run as real processes: the uninterrupted run through the launcher
(`tidal rl`), the interrupted one as four separately started services
(tests/helpers/split_runs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidal.cli.config import RunConfig
from tidal.cli.launcher import prepare_run_dir
from tidal.common.config.loading import load_config
from tidal.orchestrator.records.run_log import run_log_records

from ..helpers.split_runs import (
    kill_and_resume_orchestrator,
    logged_prompts,
    running_services,
    trainer_status,
)

ROOT = Path(__file__).resolve().parents[2]
WARMUP, STEPS = 2, 10
KILL_AFTER_STEP = 5
EVAL_EVERY = 4


def _overrides(dataset: Path) -> list[str]:
    qa = f'{{type = "dataset", name = "qa", path = "{dataset}"}}'
    chat = '{type = "reversal", name = "chat", turns = 2}'  # multi-turn episodes
    tasks = f'[{{type = "reversal", weight = 2}}, {qa}, {chat}]'
    return [
        "--orchestrator.warmup-steps", str(WARMUP),
        "--orchestrator.steps", str(STEPS),
        "--orchestrator.prompts-per-step", "4",
        "--orchestrator.group-size", "4",
        "--orchestrator.report.table-every", "0",
        "--orchestrator.eval.every", str(EVAL_EVERY),
        "--orchestrator.eval.prompts", "4",
        "--orchestrator.eval.k", "2",
        "--orchestrator.tasks", tasks,
        "--grpc.shutdown-grace-s", "0.5",  # long-lived Watch streams would hold each stop 5 s
    ]  # fmt: skip


def _dataset(tmp_path: Path) -> Path:
    path = tmp_path / "qa.jsonl"
    lines = [json.dumps({"prompt": f"{i}>", "answer": str(i)[::-1]}) for i in range(30)]
    path.write_text("\n".join([*lines, "{broken"]) + "\n")
    return path


@pytest.mark.slow
def test_resumed_orchestrator_sees_the_prompts_of_an_uninterrupted_run(
    launch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    dataset = _dataset(tmp_path)
    uninterrupted = launch(*_overrides(dataset))
    assert uninterrupted.process.wait(timeout=300) == 0, uninterrupted.output()
    expected = logged_prompts(uninterrupted.run_dir)
    assert sorted(expected) == list(range(1, WARMUP + STEPS + 1))
    # held-out evaluation ran on every task after RL steps 4, 8 and the last, and took
    # nothing from the training prompt stream (the resumed run below compares equal)
    metrics = run_log_records(uninterrupted.run_dir / "metrics.jsonl")
    evals = [m for m in metrics if "eval/qa/pass@2" in m]
    assert [m["step"] - WARMUP for m in evals] == [4, 8, STEPS]
    # multi-turn episodes were generated, scored per turn and trained
    chat = [m for m in metrics if "task/chat/score/turns_completed" in m]
    assert chat and all(0 < m["task/chat/score/turns_completed"] <= 1 for m in chat)
    for m in evals:
        for task in ("reversal", "qa", "chat"):
            assert 0 <= m[f"eval/{task}/greedy_accuracy"] <= 1
            assert 0 <= m[f"eval/{task}/pass@2"] <= 1

    argv = ["@", str(ROOT / "configs" / "default.toml"), *_overrides(dataset)]
    argv += ["--run.output-dir", str(tmp_path / "split"), "--run.name", "resumed"]
    config, _ = load_config(RunConfig, argv)
    run_dir = prepare_run_dir(config)
    with running_services(run_dir) as services:
        kill_and_resume_orchestrator(
            services, run_dir, after_step=KILL_AFTER_STEP, last_step=WARMUP + STEPS
        )
        status = trainer_status(run_dir, config.endpoints.trainer)

    assert logged_prompts(run_dir) == expected
    # every step trained exactly once, across both orchestrator lives
    assert (status.step, status.steps_trained) == (WARMUP + STEPS, WARMUP + STEPS)
    log = (run_dir / "logs" / "orchestrator.log").read_text()
    assert "resume: trainer at step" in log
    assert "1 malformed records skipped" in log
