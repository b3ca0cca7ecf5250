"""A short `tidal rl` on real-task machinery: a GSM8K-format JSONL scored by the math
verifier and a reasoning-gym dataset, mixed, through the real launcher and services.

The byte-level default model cannot solve either, so rewards are not asserted to rise;
what is asserted is that both tasks were drawn and scored by their own verifiers without
failures, that their sub-scores reached metrics.jsonl, and that evaluation ran on their
held-out problems, greedy only (`eval.k = 0`), before the first step too (~30 s).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidal.orchestrator.records.run_log import run_log_records

STEPS = 2
GSM8K = [
    ("Tom has 3 apples and buys 4. How many?", "3 + 4 = <<3+4=7>>7\n#### 7"),
    ("A box holds 5 pens. 2 boxes?", "5 * 2 = <<5*2=10>>10\n#### 10"),
    ("Sam had 9 cards and gave 4. Left?", "9 - 4 = <<9-4=5>>5\n#### 5"),
    ("6 birds, 3 fly off. How many stay?", "6 - 3 = <<6-3=3>>3\n#### 3"),
    ("Ann reads 2 pages a day for 4 days.", "2 * 4 = <<2*4=8>>8\n#### 8"),
]


def _run_file(tmp_path: Path) -> Path:
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in GSM8K))
    held_out = tmp_path / "gsm8k_test.jsonl"
    held_out.write_text(json.dumps({"question": "1 and 1 more?", "answer": "#### 2"}) + "\n")
    run_file = tmp_path / "real_tasks.toml"
    run_file.write_text(
        f"""
[orchestrator]
steps = {STEPS}
warmup_steps = 1
prompts_per_step = 4
group_size = 4

[orchestrator.report]
table_every = 0

[orchestrator.eval]
every = {STEPS}
prompts = 2
k = 0
at_start = true

[[orchestrator.tasks]]
type = "dataset"
name = "gsm8k"
path = "{data}"
eval_path = "{held_out}"
prompt_field = "question"
verifier = "math"
max_answer_chars = 24

[[orchestrator.tasks]]
type = "reasoning_gym"
dataset = "basic_arithmetic"
options = {{ min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1 }}
eval_size = 4
max_answer_chars = 4
"""
    )
    return run_file


@pytest.mark.slow
def test_math_and_reasoning_gym_tasks_report_their_sub_scores(launch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = launch("@", str(_run_file(tmp_path)), "--grpc.shutdown-grace-s", "0.5")
    assert run.process.wait(timeout=300) == 0, run.output()
    records = run_log_records(run.run_dir / "metrics.jsonl")
    rl = [r for r in records if r["phase"] == "rl"]
    assert len(rl) == STEPS
    keys = set().union(*(r.keys() for r in rl))
    for name in ("gsm8k/score/format", "gsm8k/score/answer"):
        assert f"task/{name}" in keys, sorted(keys)
    for name in ("score", "correct"):
        assert f"task/basic_arithmetic/score/{name}" in keys, sorted(keys)
    for record in rl:
        for key, value in record.items():
            if key.startswith("verifier_failures/"):
                assert value == 0, (key, record)
            if key.startswith("task/") and "/score/" in key:
                assert 0.0 <= value <= 1.0, (key, value)
    for name in ("gsm8k", "basic_arithmetic"):  # held-out problems were evaluated
        assert 0.0 <= rl[-1][f"eval/{name}/greedy_reward"] <= 1.0
        # ... and before any training (eval.at_start), on the first step's record
        assert 0.0 <= records[0][f"eval_start/{name}/greedy_reward"] <= 1.0
        assert not any(k.startswith("eval_start/") for r in records[1:] for k in r)
        # k = 0: greedy only, so no sampled metrics (test_orchestrator_resume has k = 2)
        assert not any(k.startswith(f"eval/{name}/pass@") for k in rl[-1]), rl[-1]
        assert f"eval/{name}/sampled_reward" not in rl[-1]
    assert records[0]["eval_start/policy_version"] == 0
    assert records[0]["eval_start/seconds"] > 0  # what the start's evaluation took
