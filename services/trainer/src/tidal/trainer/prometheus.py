"""The trainer's Prometheus metrics (docs/operations.md#metrics), on its `ServiceMetrics`.

Updated once per step from values the step measures anyway: nothing runs per
micro-batch or per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram

from tidal.common.observability.prometheus import ServiceMetrics


@dataclass(frozen=True)
class TrainerMetrics:
    steps: Counter
    step_seconds: Histogram
    trained_tokens: Counter
    last_step: Gauge
    loss: Gauge
    publish_seconds: Histogram
    checkpoint_seconds: Histogram

    @classmethod
    def on(cls, metrics: ServiceMetrics) -> TrainerMetrics:
        return cls(
            steps=metrics.counter(
                "tidal_trainer_steps",
                "Steps trained by this process (retries answered from the record not counted)",
            ),
            step_seconds=metrics.histogram(
                "tidal_trainer_step_seconds",
                "Wall time of one step's compute: journal entry, forward, backward and "
                "optimizer step",
            ),
            trained_tokens=metrics.counter(
                "tidal_trainer_trained_tokens", "Tokens (prompt + completion) trained on"
            ),
            last_step=metrics.gauge("tidal_trainer_last_step", "The newest step trained"),
            loss=metrics.gauge("tidal_trainer_loss", "The loss of the newest step"),
            publish_seconds=metrics.histogram(
                "tidal_trainer_publish_seconds",
                "Wall time of publishing one version (write or send the weights, register "
                "it with weightsync)",
            ),
            checkpoint_seconds=metrics.histogram(
                "tidal_trainer_checkpoint_seconds", "Wall time of one checkpoint save"
            ),
        )

    def trained(self, step: int, tokens: int, seconds: float, loss: float | None) -> None:
        self.steps.inc()
        self.trained_tokens.inc(tokens)
        self.step_seconds.observe(seconds)
        self.last_step.set(step)
        if loss is not None:
            self.loss.set(loss)
