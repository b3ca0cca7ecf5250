"""A real `tidal rl` with the chat template on: multi-turn reversal episodes rendered by the
byte tokenizer's template, with a system prompt, through all four services."""

from __future__ import annotations

import pytest

from tidal.orchestrator.records.run_log import run_log_records

WARMUP, STEPS = 2, 3


@pytest.mark.slow
def test_multi_turn_run_with_the_chat_template_trains_to_the_end(launch) -> None:  # type: ignore[no-untyped-def]
    run = launch(
        "--orchestrator.chat.template", "on",
        "--orchestrator.chat.system-prompt", "Reverse each string.",
        "--orchestrator.task", '{type = "reversal", turns = 2}',
        "--orchestrator.warmup-steps", str(WARMUP),
        "--orchestrator.steps", str(STEPS),
    )  # fmt: skip
    assert run.process.wait(timeout=300) == 0, run.output()
    log = (run.run_dir / "logs" / "orchestrator.log").read_text()
    assert "tokenizer byte; prompts through its chat template" in log
    metrics = run_log_records(run.run_dir / "metrics.jsonl")
    assert [m["phase"] for m in metrics] == ["warmup"] * WARMUP + ["rl"] * STEPS
    rl = [m for m in metrics if m["phase"] == "rl"]
    assert all(0 < m["task/reversal/score/turns_completed"] <= 1 for m in rl)
    assert all(m["trained_tokens"] > 0 for m in metrics)
