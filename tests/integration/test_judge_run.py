"""A judge-scored task runs with a second inference replica serving the judge: a short
`tidal rl` whose reversal task is scored by a judge naming a model folder (a tiny Qwen3-
style folder with random weights), which the launcher serves as one more inference child.

A random judge's replies are mostly unparsable, and that is the point of what is asserted:
every completion of every step went to the judge (a request or a cache hit), the judge
answered (no timeouts, no errors), what it could not parse was counted, and every reward
stayed in [0, 1]. The judge child's log shows it served its fixed folder, not the policy.
"""

from __future__ import annotations

from pathlib import Path

from tidal.orchestrator.records.run_log import run_log_records

from ..hf_folders import build_model_folder

STEPS, PROMPTS, GROUP = 2, 2, 4


def _run_file(tmp_path: Path, judge: Path) -> Path:
    run_file = tmp_path / "judged.toml"
    run_file.write_text(
        f"""
[orchestrator]
steps = {STEPS}
warmup_steps = 1
prompts_per_step = {PROMPTS}
group_size = {GROUP}

[orchestrator.report]
table_every = 0

[orchestrator.task.reward]
type = "judge"
model_path = "{judge}"
rubric = "{{prompt}} {{completion}} Score 0-10:"
max_tokens = 4
timeout_s = 120
"""
    )
    return run_file


def test_a_judge_scored_task_runs_with_a_judge_replica(launch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    judge = build_model_folder(tmp_path / "judge", "qwen3")
    run = launch("@", str(_run_file(tmp_path, judge)), "--grpc.shutdown-grace-s", "0.5")
    assert run.process.wait(timeout=420) == 0, run.output()
    records = run_log_records(run.run_dir / "metrics.jsonl")
    rl = [r for r in records if r["phase"] == "rl"]
    assert len(rl) == STEPS
    for record in rl:
        asked = record["judge/calls"] + record.get("judge/cache_hits", 0.0)
        assert asked >= PROMPTS * GROUP, record  # every completion reached the judge
        assert record["judge/timeouts"] == record["judge/errors"] == 0, record
        assert 0 <= record["judge/parse_failures"] <= record["judge/calls"]
        assert record["judge/seconds"] > 0
        assert 0.0 <= record["task/reversal/reward_mean"] <= 1.0
    log = (run.run_dir / "logs" / "judge-0.log").read_text()
    assert f"serving the fixed model {judge}" in log
