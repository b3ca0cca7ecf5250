"""A run with `packing.share_prompts`: the four services train each group's prompt once
end to end (packer, wire, trainer) and the run completes, with each step's prompt
tokens trained once per group instead of once per completion."""

from __future__ import annotations

from tidal.orchestrator.records.run_log import run_log_records


def test_a_run_with_shared_prompts_trains_every_completion_token(launch) -> None:  # type: ignore[no-untyped-def]
    run = launch(
        *("--orchestrator.packing.share-prompts", "true"),
        *("--orchestrator.steps", "3", "--orchestrator.warmup-steps", "1"),
    )
    assert run.process.wait(timeout=300) == 0, run.output()[-3000:]
    rows = run_log_records(run.run_dir / "metrics.jsonl")
    rl = [r for r in rows if r.get("generated_tokens", 0) > 0]
    assert len(rl) == 3
    for r in rl:  # 8 prompts of a few tokens, held once each (64 copies unshared)
        prompt_tokens = r["train/tokens"] - r["train/loss_tokens"]
        assert 0 < r["train/loss_tokens"] <= r["generated_tokens"]
        assert 0 < prompt_tokens <= 8 * 16, r
