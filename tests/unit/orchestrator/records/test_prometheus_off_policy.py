"""The trainer's off-policy measures of a step reach the orchestrator's Prometheus gauges."""

from __future__ import annotations

from dataclasses import replace

from prometheus_client import generate_latest

from tidal.common.observability.prometheus import ServiceMetrics
from tidal.orchestrator.records.prometheus import OrchestratorMetrics
from tidal.orchestrator.records.run_log import StepRecord


def test_mismatch_staleness_and_corrections_are_gauges_by_label() -> None:
    service = ServiceMetrics("orchestrator")
    metrics = OrchestratorMetrics(service)
    step = StepRecord(
        step=3,
        phase="rl",
        reward_mean=0.5,
        reward_std=0.1,
        policy_version=1,
        policy_version_max=2,
        staleness_mean=0.5,
        samples=4,
        dropped_stale=0,
        completion_len_mean=3.0,
        exact_fraction=0.5,
        generated_tokens=10,
        trained_tokens=20,
        micro_batches=1,
        generate_seconds=0.1,
        train_seconds=0.2,
        seconds=0.5,
        tokens_per_s=60.0,
        trace_id="0" * 32,
    )
    train = {
        "mismatch_kl": 0.001,
        "stale_kl/1": 0.02,
        "staleness_share/0": 0.25,
        "staleness_share/1": 0.75,
        "clip_frac": 0.1,
        "correction/tis": 0.05,
    }
    metrics.step_finished(replace(step, train=train))
    text = generate_latest(service.registry).decode()
    assert 'tidal_orchestrator_off_policy_kl{staleness="0"} 0.001' in text
    assert 'tidal_orchestrator_off_policy_kl{staleness="1"} 0.02' in text
    assert 'tidal_orchestrator_staleness_token_share{staleness="1"} 0.75' in text
    assert 'tidal_orchestrator_correction_token_share{correction="tis"} 0.05' in text
    assert 'tidal_orchestrator_correction_token_share{correction="ppo_clip"} 0.1' in text
