"""Configuration of the orchestrator service (`[orchestrator]`).

pydantic only (no torch), like every service config, so the umbrella CLI validates a whole
run config instantly. The defaults are the embedded CPU run: string reversal over a
four-letter alphabet, which a 2-layer dim-128 byte-level Llama learns in a few minutes
(~15 supervised warm-start steps, then ~60 RL steps of 8 prompts × 8 completions;
measured offline: the RL reward rises by ~0.4 from the first to the last five steps).
Task configs live in `task_config.py`; `task` (one task) and `tasks` (a weighted
mixture) are two spellings of the same list: a non-empty `tasks` replaces `task`, so a
mixture can be layered over a base file (like configs/default.toml) that names one task.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tidal.common.config import BaseConfig
from tidal.common.sections import ServiceRunConfig
from tidal.orchestrator.task_config import (
    ArithmeticTaskConfig,
    CountdownTaskConfig,
    DatasetTaskConfig,
    ImportTaskConfig,
    ReversalTaskConfig,
    TaskConfig,
)

__all__ = [
    "ArithmeticTaskConfig",
    "CountdownTaskConfig",
    "DatasetTaskConfig",
    "ImportTaskConfig",
    "OrchestratorConfig",
    "OrchestratorRunConfig",
    "ReversalTaskConfig",
    "SamplingConfig",
]

Algorithm = Literal["grpo", "dr_grpo", "rloo", "remax"]


class SamplingConfig(BaseConfig):
    """How inference samples completions for training (behaviour policy)."""

    temperature: float = Field(default=1.0, ge=0)
    """Softmax temperature; 1.0 samples from the policy itself (what the PG loss assumes)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus filtering; 1.0 disables it."""
    max_tokens: int | None = Field(default=None, gt=0)
    """New tokens per completion; unset means the tasks' own bound (longest reference + 2)."""


class EvalConfig(BaseConfig):
    """Periodic evaluation on held-out problems of every task."""

    every: int = Field(default=0, ge=0)
    """Evaluate after every `every` RL steps (and after the last); 0 disables evaluation."""
    prompts: int = Field(default=16, gt=0)
    """Held-out problems per task."""
    k: int = Field(default=4, gt=0)
    """Samples per problem for pass@k (at the training temperature)."""


class OrchestratorConfig(BaseConfig):
    task: TaskConfig = ReversalTaskConfig()
    """The verifiable task prompts come from (use `tasks` for a mixture)."""
    tasks: list[TaskConfig] = []
    """A weighted mixture of tasks (each with `weight`); when non-empty it replaces `task`."""
    steps: int = Field(default=60, ge=0)
    """RL steps after the warm start. Step ids continue after the warm-up steps."""
    warmup_steps: int = Field(default=15, ge=0)
    """Supervised warm-start steps (LOSS_KIND_SFT on reference completions), run first as
    steps 1..warmup_steps."""
    prompts_per_step: int = Field(default=8, gt=0)
    """Prompts (groups) per step (also the SFT batch size in prompts)."""
    group_size: int = Field(default=8, gt=0)
    """Completions per prompt; advantages are computed within each group."""
    sampling: SamplingConfig = SamplingConfig()
    """Sampling parameters of rollouts."""
    algorithm: Algorithm = "grpo"
    """Advantage estimator: grpo (group mean, std-normalised unless normalize_advantages is
    false), dr_grpo (group mean, no std), rloo (leave-one-out mean), remax (reward of a
    greedy completion of the same prompt)."""
    normalize_advantages: bool = True
    """grpo only: divide by the group's reward std."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and sample more
    prompts until the step has prompts_per_step groups (or max_sampling_rounds is hit)."""
    max_sampling_rounds: int = Field(default=4, gt=0)
    """Generation rounds one step may use to fill its batch under dynamic sampling."""
    overlong_buffer_tokens: int = Field(default=0, ge=0)
    """DAPO overlong reward shaping: completions within this many tokens of max_tokens get
    a linearly growing penalty, up to overlong_penalty at max_tokens; 0 disables it."""
    overlong_penalty: float = Field(default=1.0, ge=0)
    """Largest overlong penalty (subtracted from the reward)."""
    length_penalty: float = Field(default=0.0, ge=0)
    """Subtract length_penalty × completion tokens / max_tokens from the reward."""
    verifier_timeout_s: float = Field(default=5.0, gt=0)
    """A verifier call taking longer scores 0 (counted as a timeout)."""
    micro_batch_tokens: int = Field(default=2048, gt=0)
    """Token budget of one packed micro-batch."""
    data_parallel_ranks: int = Field(default=1, gt=0)
    """Trainer data-parallel ranks: micro-batches come in equal counts per rank, rank-major,
    balanced by estimated cost."""
    overlong_samples: Literal["truncate", "drop"] = "truncate"
    """A sample longer than micro_batch_tokens: keep its first tokens (truncate) or drop it;
    both are counted."""
    max_async: int = Field(default=1, ge=0)
    """How far generation may run ahead of training: rollouts of step n start once
    inference has loaded version n-1-max_async. 0 is synchronous (on-policy)."""
    max_off_policy_steps: int | None = Field(default=None, ge=0)
    """Drop samples whose staleness (step - 1 - oldest policy version of their tokens)
    exceeds this; unset means max_async + 1 (one version of slack for mid-generation
    reloads and late loads)."""
    max_inflight_requests: int = Field(default=64, gt=0)
    """Upper bound of concurrent Generate calls; the bound adapts downwards while
    inference reports more than inflight_queue_target queued requests or a KV cache
    fuller than inflight_kv_usage_target."""
    inflight_queue_target: int = Field(default=16, ge=0)
    """Queued requests at inference above which the in-flight bound is halved."""
    inflight_kv_usage_target: float = Field(default=0.9, gt=0, le=1)
    """KV-cache usage reported by inference above which the in-flight bound is halved."""
    eval: EvalConfig = EvalConfig()
    """Held-out evaluation."""
    resume: bool = False
    """Continue from `<run dir>/progress.json` (written after every step): task cursors,
    RNG state and step. Without it a run starts from the beginning."""
    table_every: int = Field(default=10, ge=0)
    """Print the live metrics table every this many steps; 0 disables it."""
    exit_when_done: bool = True
    """Exit (code 0) after the last step; false keeps serving GetProgress until stopped."""
    generate_timeout_s: float = Field(default=300.0, gt=0)
    """Deadline of one Generate call (all completions of one prompt)."""
    train_timeout_s: float = Field(default=600.0, gt=0)
    """Deadline of one Train call."""
    peer_wait_s: float = Field(default=300.0, gt=0)
    """How long to wait at start-up for inference and the trainer to become healthy, and
    for inference to load a policy version a step needs."""
    recent_steps: int = Field(default=20, gt=0)
    """Steps kept in GetProgress's `recent` list."""

    @model_validator(mode="after")
    def _check(self) -> OrchestratorConfig:
        if self.algorithm == "rloo" and self.group_size < 2:
            raise ValueError("algorithm rloo needs group_size >= 2")
        return self

    @property
    def task_list(self) -> list[TaskConfig]:
        return list(self.tasks) if self.tasks else [self.task]

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps

    @property
    def staleness_bound(self) -> int:
        if self.max_off_policy_steps is not None:
            return self.max_off_policy_steps
        return self.max_async + 1


class OrchestratorRunConfig(ServiceRunConfig):
    orchestrator: OrchestratorConfig = OrchestratorConfig()  # type: ignore[assignment]
