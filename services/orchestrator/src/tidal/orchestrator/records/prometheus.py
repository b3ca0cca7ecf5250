"""The orchestrator's Prometheus metrics (docs/operations.md#metrics), on its `ServiceMetrics`.

Per-step numbers come from the `StepRecord` the run log writes (this is a `RunLog` sink),
so Prometheus, metrics.jsonl, TensorBoard and W&B never disagree about a step. The
in-flight count and bound and the steps generating ahead are read at scrape time; the
served version is inference's own `tidal_inference_policy_version`.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tidal.common.observability.prometheus import ServiceMetrics
from tidal.orchestrator.peers.inflight import InflightLimiter
from tidal.orchestrator.records.run_log import StepRecord

STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16)
STALENESS_PREFIX = "staleness/"
STEP_COUNTERS = (
    ("tools/calls", "tool_calls", "Tool calls in episodes (answered or not valid)"),
    ("tools/parse_failures", "tool_parse_failures",
     "Tool calls that could not run: malformed, an unknown tool, or arguments off-schema"),
    ("tools/errors", "tool_errors", "Tool calls that raised or timed out"),
    ("tools/seconds", "tool_seconds", "Seconds episodes waited for their tool calls"),
    ("judge/calls", "judge_calls", "Requests sent to judges (retries included)"),
    ("judge/retries", "judge_retries",
     "Judge requests sent again after a timeout, a refused connection or a 429/5xx"),
    ("judge/cache_hits", "judge_cache_hits", "Judged pairs answered from the judge's cache"),
    ("judge/parse_failures", "judge_parse_failures", "Judge replies with no usable score"),
    ("judge/timeouts", "judge_timeouts",
     "Judged pairs left unanswered, their last request past its deadline"),
    ("judge/errors", "judge_errors",
     "Judged pairs left unanswered, their last request refused or failed (HTTP, connection)"),
    ("judge/seconds", "judge_seconds", "Seconds spent in judge requests"),
    ("reward_model/inputs", "reward_model_inputs", "Completions scored by reward models"),
    ("reward_model/seconds", "reward_model_seconds", "Seconds completions waited for them"),
)  # fmt: skip
"""Per-step totals in a step's extras (step_stats.py) counted across steps."""
REASONING_GAUGES = (
    ("reasoning/reasoning_chars_mean", "reasoning_chars_mean",
     "Mean reasoning characters per completion, last RL step (reasoning models)"),
    ("reasoning/answer_chars_mean", "answer_chars_mean",
     "Mean answer characters per completion (reasoning split off), last RL step"),
    ("reasoning/well_formed_fraction", "reasoning_well_formed_fraction",
     "Share of the last RL step's completions with a closed reasoning block then an answer"),
)  # fmt: skip
OFF_POLICY_KL = {"0": "mismatch_kl", "1": "stale_kl/1", "2": "stale_kl/2", "3": "stale_kl/3"}
OFF_POLICY_KL["4+"] = "stale_kl/4+"
CORRECTIONS = {"ppo_clip": "clip_frac", "any_mask": "mask_frac"}
"""Trainer metrics of the share of loss tokens each correction touches, beside the
`correction/<name>` ones the trainer reports for the corrections it runs."""


class OrchestratorMetrics:
    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics
        self.steps = metrics.counter("tidal_orchestrator_steps", "Steps finished", ["phase"])
        self.step_seconds = metrics.histogram(
            "tidal_orchestrator_step_seconds",
            "Wall time between two finished steps (the pipeline's period)",
            ["phase"],
        )
        self.generate_seconds = metrics.histogram(
            "tidal_orchestrator_generate_seconds", "Wall time of one RL step's generation"
        )
        self.train_seconds = metrics.histogram(
            "tidal_orchestrator_train_seconds", "Wall time of one Train call, as the caller sees it"
        )
        self.generated_tokens = metrics.counter(
            "tidal_orchestrator_generated_tokens", "Completion tokens of the steps' rollouts"
        )
        self.trained_tokens = metrics.counter(
            "tidal_orchestrator_trained_tokens", "Tokens (prompt + completion) sent to train"
        )
        self.staleness = metrics.histogram(
            "tidal_orchestrator_sample_staleness",
            "Staleness of each trained sample: policy versions between the one that wrote its "
            "oldest token and the one being updated",
            buckets=STALENESS_BUCKETS,
        )
        self.dropped_stale = metrics.counter(
            "tidal_orchestrator_dropped_stale_samples",
            "Samples dropped for staleness above orchestrator.staleness.max_off_policy_steps",
        )
        self.reward = metrics.gauge(
            "tidal_orchestrator_reward_mean", "Mean reward of the last RL step"
        )
        self.last_step = metrics.gauge("tidal_orchestrator_last_step", "The newest finished step")
        self.counters = {
            key: metrics.counter(f"tidal_orchestrator_{name}", help_text)
            for key, name, help_text in STEP_COUNTERS
        }
        self.episode_turns = metrics.gauge(
            "tidal_orchestrator_episode_turns_mean", "Mean model turns per episode, last RL step"
        )
        self.reasoning = {
            key: metrics.gauge(f"tidal_orchestrator_{name}", help_text)
            for key, name, help_text in REASONING_GAUGES
        }
        self.off_policy_kl = metrics.gauge(
            "tidal_orchestrator_off_policy_kl",
            "k3 KL(behaviour ‖ trainer) of the last RL step's loss tokens by staleness: "
            '"0" is the inference/trainer mismatch at the same weights',
            ["staleness"],
        )
        self.staleness_share = metrics.gauge(
            "tidal_orchestrator_staleness_token_share",
            "Share of the last RL step's loss tokens at each staleness (or unknown)",
            ["staleness"],
        )
        self.correction_share = metrics.gauge(
            "tidal_orchestrator_correction_token_share",
            "Share of the last RL step's loss tokens each off-policy correction touched",
            ["correction"],
        )

    def step_finished(self, step: StepRecord) -> None:
        """Count one finished step (called by RunLog.append)."""
        if step.phase == "lost":
            return
        self.steps.labels(phase=step.phase).inc()
        self.step_seconds.labels(phase=step.phase).observe(step.seconds)
        self.train_seconds.observe(step.train_seconds)
        self.generated_tokens.inc(step.generated_tokens)
        self.trained_tokens.inc(step.trained_tokens)
        self.dropped_stale.inc(step.dropped_stale)
        self.last_step.set(step.step)
        if step.phase == "rl":
            self.generate_seconds.observe(step.generate_seconds)
            if step.reward_mean is not None:
                self.reward.set(step.reward_mean)
            for key, counter in self.counters.items():
                counter.inc(step.extra.get(key, 0.0))
            if "episode/turns_mean" in step.extra:
                self.episode_turns.set(step.extra["episode/turns_mean"])
            for key, gauge in self.reasoning.items():
                if key in step.extra:
                    gauge.set(step.extra[key])
            for key, count in step.extra.items():
                if key.startswith(STALENESS_PREFIX) and key[len(STALENESS_PREFIX) :].isdigit():
                    age = int(key[len(STALENESS_PREFIX) :])
                    for _ in range(int(count)):
                        self.staleness.observe(age)
            self._off_policy(step.train)

    def _off_policy(self, train: dict[str, float]) -> None:
        """The trainer's off-policy measures of the step, by staleness and by correction."""
        for bucket, name in OFF_POLICY_KL.items():
            if name in train:
                self.off_policy_kl.labels(staleness=bucket).set(train[name])
        corrections = dict(CORRECTIONS)
        for key, value in train.items():
            if key.startswith("staleness_share/"):
                self.staleness_share.labels(staleness=key.split("/", 1)[1]).set(value)
            if key.startswith("correction/"):
                corrections[key.split("/", 1)[1]] = key
        for correction, name in corrections.items():
            if name in train:
                self.correction_share.labels(correction=correction).set(train[name])

    def watch(self, limiter: InflightLimiter, steps_ahead: Callable[[], int]) -> None:
        """Expose the in-flight bound and the steps generating ahead (`steps_ahead`, a
        len() the loop owns), read at scrape time."""
        self.metrics.register(_PipelineCollector(limiter, steps_ahead))


class _PipelineCollector(Collector):
    def __init__(self, limiter: InflightLimiter, steps_ahead: Callable[[], int]) -> None:
        self.limiter = limiter
        self.steps_ahead = steps_ahead

    def collect(self) -> list[Metric]:  # type: ignore[override]
        return [
            GaugeMetricFamily(
                "tidal_orchestrator_generate_inflight",
                "Generate calls in flight to inference",
                value=self.limiter.inflight,
            ),
            GaugeMetricFamily(
                "tidal_orchestrator_generate_inflight_limit",
                "The adaptive bound on Generate calls in flight (orchestrator.inflight)",
                value=self.limiter.limit,
            ),
            GaugeMetricFamily(
                "tidal_orchestrator_rollout_steps_queued",
                "Later RL steps whose rollouts are generating (or done) ahead of the step "
                "in training",
                value=self.steps_ahead(),
            ),
        ]

    def describe(self) -> list[Metric]:  # type: ignore[override]
        return []
