"""The lookup tool task learns through the real launcher on the tiny default model: from the
suite's one warm-up on demonstrations of which half call `lookup(key)` and half guess
(`lookup_warmed`), RL raises the reward as the policy learns to call the tool (calls per
episode rise), and an episode whose next turn would not fit the model's context ends
cleanly instead of stopping the run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tidal.orchestrator.records.run_log import run_log_records

from .conftest import LOOKUP_CONFIG, from_warmed

RL_STEPS = 25
REWARD_GAIN = 0.2
"""Mean reward of the last 5 RL steps over the first 5. After this warm-up a call is
right about 9 times in 10 and a guess 1 in 8, so the gain is about (calls per episode
gained) × (what a call pays over a guess); the full run (250 + 60 steps) gained +0.37
(docs/benchmarks/tool_learning.md)."""
CALLS_GAIN = 0.25
"""Calls per episode, last 5 RL steps over the first 5 (the warm-up leaves about 0.55)."""
MAX_PARSE_FAILURE_RATE = 0.2
"""The call format survives RL: at most this share of the last 5 steps' calls fail to parse
(about 0.05 after the warm-up; per 5 steps the rate is noisy, 0.05 -> 0.10 was seen)."""
LIMIT_S = 600
"""Generous: the RL steps take about a minute on an idle 2-core machine (the warm-up is
the shared fixture's), several under the suite's load."""


def _mean(records: list[dict], key: str) -> float:  # type: ignore[type-arg]
    return sum(r.get(key, 0.0) for r in records) / len(records)


@pytest.mark.slow
@pytest.mark.timeout(LIMIT_S + 60)
def test_lookup_reward_rises_as_the_policy_learns_to_call_the_tool(  # type: ignore[no-untyped-def]
    launch, lookup_warmed: Path
) -> None:
    started = time.monotonic()
    run = launch(
        "@",
        str(LOOKUP_CONFIG),
        *from_warmed(lookup_warmed),
        "--orchestrator.steps",
        str(RL_STEPS),
        "--orchestrator.report.table-every",
        "0",
        "--grpc.shutdown-grace-s",
        "0.5",
    )
    assert run.process.wait(timeout=LIMIT_S) == 0, run.output()
    assert time.monotonic() - started < LIMIT_S

    records = run_log_records(run.run_dir / "metrics.jsonl")
    rl = [r for r in records if r["phase"] == "rl"]
    assert len(rl) == RL_STEPS
    first, last = rl[:5], rl[-5:]
    reward = _mean(first, "reward_mean"), _mean(last, "reward_mean")
    # Means of rewards in 64ths: a rise of exactly the bound must not fail on rounding.
    rise = reward[1] - reward[0]
    assert rise >= REWARD_GAIN - 1e-9, f"reward {reward[0]:.3f} -> {reward[1]:.3f}"
    calls = _mean(first, "tools/calls_per_episode"), _mean(last, "tools/calls_per_episode")
    assert calls[1] >= calls[0] + CALLS_GAIN, f"calls per episode {calls[0]:.2f} -> {calls[1]:.2f}"
    failures = _mean(first, "tools/parse_failure_rate"), _mean(last, "tools/parse_failure_rate")
    assert failures[1] <= MAX_PARSE_FAILURE_RATE, (
        f"parse failure rate {failures[0]:.3f} -> {failures[1]:.3f}"
    )
    # a wrong key's longer result leaves the model's 128 positions no room for a turn:
    # those episodes end before their next turn, counted, and the run goes on
    assert sum(r.get("episode/context_full", 0.0) for r in rl) > 0
