"""Completions as the orchestrator sees them: what inference returned, then scored.

Frozen dataclasses with no protobuf in them: the inference client converts each
GenerateResponse into a `Completion`, and everything after it works on these types. Every
token carries the policy version that produced it, so a sample's staleness is judged by
its oldest token (staleness.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from tidal.orchestrator.tasks.base import Problem


@dataclass(frozen=True)
class ToolStats:
    """An episode's tool calling: calls answered, calls that could not run (malformed, an
    unknown tool, arguments off-schema), tools that raised or timed out, and the wall time
    the episode waited for its tools."""

    calls: int = 0
    parse_failures: int = 0
    errors: int = 0
    seconds: float = 0.0

    def __add__(self, other: ToolStats) -> ToolStats:
        return ToolStats(
            self.calls + other.calls,
            self.parse_failures + other.parse_failures,
            self.errors + other.errors,
            self.seconds + other.seconds,
        )


@dataclass(frozen=True)
class Completion:
    """One completion returned by inference."""

    index: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    policy_versions: tuple[int, ...]
    stopped: bool
    """True when a stop token ended it; False when max_tokens or the context cut it."""
    loss_mask: tuple[float, ...] = ()
    """Multi-turn: 1 for model tokens, 0 for environment tokens (empty: all model tokens).
    `logprobs` are 0 at environment tokens; `policy_versions` list model tokens only."""
    turns: tuple[str, ...] = ()
    """Multi-turn: the decoded model turns (empty for single-turn completions)."""
    tools: ToolStats = ToolStats()
    """Tool calling in this episode (all zero without tools)."""
    context_full: bool = False
    """Multi-turn: the episode ended because its next turn would not fit the model's
    context (the last reply is not appended)."""
    prompt_ids: tuple[int, ...] = ()
    """An environment that renders its own prompt (verifiers): the ids this episode started
    from (empty: the group's prompt)."""
    reward: float | None = None
    """An environment that scores its own episodes (verifiers, a self-rewarding agent):
    their reward, used in place of the task's verifier."""
    earlier_samples: tuple[Completion, ...] = ()
    """An agent episode whose calls rewrote their history: its samples before the last
    rewrite (each with its own `prompt_ids`), trained with this episode's advantage."""
    dropped: str = ""
    """Why this episode is not trained (an agent that timed out, crashed or never called);
    empty for a trainable one. Dropped episodes are counted, never scored."""

    def samples(self) -> tuple[Completion, ...]:
        """The sequences this episode trains: its earlier samples, then itself."""
        return (*self.earlier_samples, self)

    def token_versions(self) -> tuple[int, ...]:
        """The version of each completion token: -1 at environment tokens."""
        if not self.loss_mask:
            return self.policy_versions
        model_versions = iter(self.policy_versions)
        return tuple(next(model_versions, -1) if m > 0 else -1 for m in self.loss_mask)


@dataclass(frozen=True)
class ScoredSample:
    """A verified completion with its advantage and staleness, ready to pack."""

    problem: Problem
    prompt_ids: tuple[int, ...]
    completion: Completion
    reward: float
    advantage: float
    staleness: int
    token_advantages: tuple[float, ...] = ()
    """Each completion token's own advantage term, added to `advantage` (distillation);
    empty: none."""
