"""End-of-run report: the reward curve PNG and a rich summary table.

matplotlib is imported inside the function with the Agg backend, so the orchestrator
never needs a display and does not pay matplotlib's import time unless a run finishes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tidal.orchestrator.metrics import StepMetrics

REWARD_PLOT = "reward.png"
WINDOW = 5


@dataclass(frozen=True)
class RunSummary:
    rl_steps: int
    warmup_steps: int
    first_reward: float | None
    """Mean RL reward of the first WINDOW RL steps."""
    last_reward: float | None
    """Mean RL reward of the last WINDOW RL steps."""
    total_seconds: float
    tokens_per_s: float


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(records: Sequence[StepMetrics], total_seconds: float) -> RunSummary:
    rl = [r for r in records if r.phase == "rl" and r.reward_mean is not None]
    rewards = [r.reward_mean for r in rl if r.reward_mean is not None]
    tokens = sum(r.generated_tokens + r.trained_tokens for r in records)
    return RunSummary(
        rl_steps=len(rl),
        warmup_steps=sum(r.phase == "warmup" for r in records),
        first_reward=_mean(rewards[:WINDOW]),
        last_reward=_mean(rewards[-WINDOW:]),
        total_seconds=total_seconds,
        tokens_per_s=tokens / total_seconds if total_seconds > 0 else 0.0,
    )


def write_reward_plot(records: Sequence[StepMetrics], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rl = [r for r in records if r.phase == "rl" and r.reward_mean is not None]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot([r.step for r in rl], [r.reward_mean for r in rl], marker=".", label="reward mean")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title("RL reward per step")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_summary(summary: RunSummary, console: Console | None = None) -> None:
    table = Table(title="Tidal run summary")
    table.add_column("metric")
    table.add_column("value", justify="right")
    gain = (
        None
        if summary.first_reward is None or summary.last_reward is None
        else summary.last_reward - summary.first_reward
    )
    table.add_row("warm-up steps", str(summary.warmup_steps))
    table.add_row("RL steps", str(summary.rl_steps))
    table.add_row(f"reward, first {WINDOW} RL steps", _fmt(summary.first_reward))
    table.add_row(f"reward, last {WINDOW} RL steps", _fmt(summary.last_reward))
    table.add_row("reward gain", _fmt(gain))
    table.add_row("total time (s)", f"{summary.total_seconds:.1f}")
    table.add_row("tokens/s (generated + trained)", f"{summary.tokens_per_s:.0f}")
    (console or Console()).print(table)
