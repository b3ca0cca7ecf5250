"""`[orchestrator.distill]`: on-policy distillation's configuration.

Its own module, beside the orchestrator's config, because the teacher's keys are one
concern: where the teacher is, how its per-token terms become advantages. How the
settings distillation cannot use are refused lives with `OrchestratorConfig`, which sees
the sampling and advantage keys they clash with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from tidal.common.config.loading import BaseConfig


class DistillConfig(BaseConfig):
    """`[orchestrator.distill]`: on-policy distillation. A teacher scores each sampled
    completion token (inference's Score) and `coef · (log p_teacher - log p_student)`
    becomes that token's advantage term (docs/training.md#distillation). Off unless
    `model_path`, `address` or `self_distill` is set."""

    model_path: Path | None = None
    """The teacher: a Hugging Face folder, served by an inference process of its own that
    `tidal rl` starts (as a judge's); it must share the run's tokenizer."""
    address: str | None = None
    """The teacher inference service's gRPC address (host:port); `tidal rl` sets it for
    `model_path`; set it yourself for a teacher served elsewhere."""
    self_distill: bool = False
    """The teacher is the policy itself, shown a privileged prompt (`privileged_prompt`):
    its own Score on the run's inference replicas, no teacher process."""
    privileged_prompt: str = "{prompt}\n(A correct answer: {reference})\n"
    """Self-distillation: the teacher's prompt, from the problem's `{prompt}` and its
    `{reference}` completion (with the chat template, the last user message's content)."""
    coef: float = Field(default=1.0, gt=0)
    """Weight of the per-token reverse-KL term `log p_teacher - log p_student`."""
    mode: Literal["replace", "add"] = "replace"
    """"replace": pure distillation, the teacher term is the whole advantage; "add": it is
    added to the task's (reward-based) advantage of every token."""
    baseline: Literal["none", "group"] = "none"
    """"group": subtract from each token's term the mean term over its group's sampled
    tokens (a constant baseline: the same gradient in expectation, less variance)."""

    @property
    def enabled(self) -> bool:
        return self.model_path is not None or self.address is not None or self.self_distill
