"""Configuration of the orchestrator service (`[orchestrator]`).

pydantic only (no torch), like every service config, so the umbrella CLI validates a whole
run config instantly. The defaults are the embedded CPU run: string reversal over a
four-letter alphabet, which a 2-layer dim-128 byte-level Llama learns in a few minutes
(~15 supervised warm-start steps, then ~60 RL steps of 8 prompts × 8 completions;
measured offline: the RL reward rises by ~0.4 from the first to the last five steps).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tidal.common.config import BaseConfig
from tidal.common.sections import ServiceRunConfig


class ReversalTaskConfig(BaseConfig):
    """The built-in verifiable task: reverse a random string ("abc>" → "cba")."""

    type: Literal["reversal"] = "reversal"
    """Task kind; "reversal" is the only built-in task so far."""
    alphabet: str = Field(default="abcd", min_length=1)
    """Characters the strings are drawn from (ASCII, no '>')."""
    min_len: int = Field(default=1, ge=1)
    """Shortest string to reverse."""
    max_len: int = Field(default=3, ge=1)
    """Longest string to reverse."""

    @model_validator(mode="after")
    def _check(self) -> ReversalTaskConfig:
        if self.min_len > self.max_len:
            raise ValueError(f"min_len {self.min_len} is larger than max_len {self.max_len}")
        if ">" in self.alphabet or not self.alphabet.isascii():
            raise ValueError(f"alphabet {self.alphabet!r} must be ASCII and must not contain '>'")
        return self


class SamplingConfig(BaseConfig):
    """How inference samples completions for training (behaviour policy)."""

    temperature: float = Field(default=1.0, ge=0)
    """Softmax temperature; 1.0 samples from the policy itself (what the PG loss assumes)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus filtering; 1.0 disables it."""
    max_tokens: int | None = Field(default=None, gt=0)
    """New tokens per completion; unset means the task's own bound (reference length + 2)."""


class OrchestratorConfig(BaseConfig):
    task: ReversalTaskConfig = ReversalTaskConfig()
    """The verifiable task prompts come from."""
    steps: int = Field(default=60, ge=0)
    """RL steps after the warm start. Step ids continue after the warm-up steps."""
    warmup_steps: int = Field(default=15, ge=0)
    """Supervised warm-start steps (LOSS_KIND_SFT on reference completions), run first as
    steps 1..warmup_steps."""
    prompts_per_step: int = Field(default=8, gt=0)
    """Prompts sampled per step (also the SFT batch size in prompts)."""
    group_size: int = Field(default=8, gt=0)
    """Completions per prompt; GRPO advantages are computed within each group."""
    sampling: SamplingConfig = SamplingConfig()
    """Sampling parameters of rollouts."""
    normalize_advantages: bool = True
    """Divide each group's advantages by the group's reward std (GRPO); false gives
    Dr.GRPO-style mean-centred rewards."""
    micro_batch_tokens: int = Field(default=2048, gt=0)
    """Token budget of one packed micro-batch (no sample may be longer)."""
    max_async: int = Field(default=1, ge=0)
    """How far generation may run ahead of training: rollouts of step n start once
    inference has loaded version n-1-max_async. 0 is synchronous (on-policy)."""
    max_off_policy_steps: int | None = Field(default=None, ge=0)
    """Drop samples whose staleness (step - 1 - oldest policy version of their tokens)
    exceeds this; unset means max_async + 1 (one version of slack for mid-generation
    reloads and late loads)."""
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
