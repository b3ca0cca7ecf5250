"""Per-step tool metrics: turns, calls, parse failures, errors and tool seconds of the
step's episodes, in the run log's extras and on Prometheus."""

from __future__ import annotations

from dataclasses import replace

from tidal.common.observability.prometheus import ServiceMetrics
from tidal.orchestrator.completions import Completion, ScoredSample, ToolStats
from tidal.orchestrator.records.prometheus import OrchestratorMetrics
from tidal.orchestrator.records.run_log import StepRecord
from tidal.orchestrator.records.step_stats import episode_stats
from tidal.orchestrator.tasks import Problem


def _sample(turns: int, stats: ToolStats) -> ScoredSample:
    completion = Completion(0, (1, 2), (0.0, 0.0), (0, 0), True, turns=("x",) * turns, tools=stats)
    return ScoredSample(Problem("p", "r"), (0,), completion, 1.0, 0.0, 0)


def test_episode_stats_are_totals_and_per_episode_means() -> None:
    scored = [
        _sample(3, ToolStats(calls=2, parse_failures=1, errors=0, seconds=0.5)),
        _sample(1, ToolStats()),
        _sample(2, ToolStats(calls=2, parse_failures=0, errors=1, seconds=0.25)),
    ]
    stats = episode_stats(scored)
    assert stats == {
        "episode/turns_mean": 2.0,
        "episode/turns_max": 3.0,
        "tools/calls": 4.0,
        "tools/calls_per_episode": 4 / 3,
        "tools/parse_failures": 1.0,
        "tools/errors": 1.0,
        "tools/seconds": 0.75,
        "tools/parse_failure_rate": 0.25,
    }


def test_episodes_the_context_ended_are_counted() -> None:
    full = _sample(2, ToolStats(calls=1))
    full = replace(full, completion=replace(full.completion, context_full=True))
    stats = episode_stats([full, full, _sample(2, ToolStats(calls=1))])
    assert stats["episode/context_full"] == 2.0
    assert "episode/context_full" not in episode_stats([_sample(2, ToolStats(calls=1))])


def test_single_turn_steps_have_no_episode_metrics() -> None:
    single = ScoredSample(
        Problem("p", "r"), (0,), Completion(0, (1,), (0.0,), (0,), True), 1.0, 0.0, 0
    )
    assert episode_stats([single]) == {}


def test_prometheus_counts_tool_calls_across_steps() -> None:
    metrics = ServiceMetrics("orchestrator")
    prom = OrchestratorMetrics(metrics)
    extra = episode_stats([_sample(2, ToolStats(calls=3, parse_failures=1, errors=1, seconds=1.5))])
    for step in (1, 2):
        prom.step_finished(replace(StepRecord.lost(step), phase="rl", extra=extra))
    value = metrics.registry.get_sample_value
    assert value("tidal_orchestrator_tool_calls_total") == 6
    assert value("tidal_orchestrator_tool_parse_failures_total") == 2
    assert value("tidal_orchestrator_tool_errors_total") == 2
    assert value("tidal_orchestrator_tool_seconds_total") == 3.0
    assert value("tidal_orchestrator_episode_turns_mean") == 2.0
