"""A short `tidal rl` on the code task: MBPP-style problems whose completions run in the
sandbox, through the real launcher and services.

The byte-level default model writes no working Python in two steps, so rewards are not
asserted to rise; what is asserted is that every completion was scored in the sandbox by
the fraction of its tests passed, without a verifier failure, and that the sub-scores
reached metrics.jsonl. The deadlines are roomy: a loaded machine's slow start of a
sandboxed program is no verifier failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.orchestrator.records.run_log import run_log_records

from ..helpers.sandbox_walls import ROOMY_WALL_S

STEPS = 2
FIXTURE = Path(__file__).parents[1] / "unit" / "orchestrator" / "fixtures" / "code_problems.jsonl"


def _run_file(tmp_path: Path) -> Path:
    run_file = tmp_path / "code_task.toml"
    run_file.write_text(
        f"""
[orchestrator]
steps = {STEPS}
warmup_steps = 1
prompts_per_step = 2
group_size = 4

[orchestrator.report]
table_every = 0

[orchestrator.task]
type = "code"
path = "{FIXTURE}"
setup_field = "test_setup_code"
max_answer_chars = 48

[orchestrator.task.sandbox]
wall_s = {ROOMY_WALL_S}

[orchestrator.timeouts]
verifier_s = {ROOMY_WALL_S + 30.0}
"""
    )
    return run_file


@pytest.mark.slow
def test_code_task_scores_completions_in_the_sandbox(launch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = launch("@", str(_run_file(tmp_path)), "--grpc.shutdown-grace-s", "0.5")
    assert run.process.wait(timeout=300) == 0, run.output()
    records = run_log_records(run.run_dir / "metrics.jsonl")
    rl = [r for r in records if r["phase"] == "rl"]
    assert len(rl) == STEPS
    keys = set().union(*(r.keys() for r in rl))
    for name in ("all_passed", "timed_out"):
        assert f"task/code/score/{name}" in keys, sorted(keys)
    for record in rl:
        for key, value in record.items():
            if key.startswith("verifier_failures/"):
                assert value == 0, (key, record)
            if key.startswith("task/") and "/score/" in key:
                assert 0.0 <= value <= 1.0, (key, value)
