"""A real `tidal rl` with a reasoning parser and a format reward: the step lines of
metrics.jsonl carry the reasoning and answer lengths through all four services."""

from __future__ import annotations

import pytest

from tidal.orchestrator.records.run_log import run_log_records

WARMUP, STEPS = 2, 2


@pytest.mark.slow
def test_a_run_with_a_reasoning_parser_logs_reasoning_and_answer_lengths(launch) -> None:  # type: ignore[no-untyped-def]
    run = launch(
        "--orchestrator.chat.template", "on",
        "--orchestrator.reasoning.parser", "think",
        "--orchestrator.reasoning.format-weight", "0.2",
        "--orchestrator.warmup-steps", str(WARMUP),
        "--orchestrator.steps", str(STEPS),
    )  # fmt: skip
    assert run.process.wait(timeout=300) == 0, run.output()
    log = (run.run_dir / "logs" / "orchestrator.log").read_text()
    assert "reasoning <think>…</think> split off before verification" in log
    metrics = run_log_records(run.run_dir / "metrics.jsonl")
    rl = [m for m in metrics if m["phase"] == "rl"]
    assert len(rl) == STEPS
    for m in rl:
        # a tiny model warmed up on bare answers rarely opens <think>: mostly answer
        assert m["reasoning/answer_chars_mean"] > 0
        assert m["reasoning/reasoning_chars_mean"] >= 0
        assert 0.0 <= m["reasoning/well_formed_fraction"] <= 1.0
