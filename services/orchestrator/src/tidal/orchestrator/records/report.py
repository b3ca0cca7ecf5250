"""End-of-run report: `report.png`, the reward curve, the summary table (`summary.json`),
and the live table of recent steps printed during the run.

matplotlib (Agg backend) is imported inside the functions, on a daemon thread started
when the first step begins, so neither start-up nor the end of the run waits for its
import; its objects are then settled with the start-up heap. `summary.json` also holds
the run's timing marks (tidal.cli.run_timing).
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tidal.common.files.durable import write_atomic
from tidal.common.process.service_start import settle_startup_heap
from tidal.orchestrator.records.run_log import StepRecord

REWARD_PLOT = "reward.png"
REPORT_PLOT = "report.png"
SUMMARY_FILE = "summary.json"
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
    trainer_wait_s: float = 0.0
    """RL steps: total time the trainer waited for its next batch."""
    policy_wait_s: float = 0.0
    """RL steps: total time generation waited for inference to load a policy version."""
    dropped: int = 0
    """Samples dropped as stale plus groups dropped by dynamic sampling."""
    startup_s: float | None = None
    """From the `tidal rl` process's start to the first step's start (None: not launched
    by `tidal rl`)."""
    shutdown_s: float | None = None
    """From the last step's end to every service process having exited (the launcher's
    figure; None until it adds it)."""


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(records: Sequence[StepRecord], total_seconds: float) -> RunSummary:
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
        trainer_wait_s=sum(r.extra.get("wait/trainer_s", 0.0) for r in rl),
        policy_wait_s=sum(r.extra.get("wait/policy_s", 0.0) for r in rl),
        dropped=sum(
            r.dropped_stale + int(r.extra.get("dropped/zero_variance_groups", 0)) for r in rl
        ),
    )


def pyplot() -> Any:
    """matplotlib's pyplot, on the Agg backend (files only, no display)."""
    importlib.import_module("matplotlib").use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def import_matplotlib_in_background() -> threading.Thread:
    """Import matplotlib's pyplot (Agg) on a daemon thread, then settle the start-up heap;
    the plots then find it loaded (one that comes first waits on Python's import lock for
    the same import). What the first step holds at that moment is frozen with it: freed by
    its references as usual, kept only if it ends in a cycle."""

    def load() -> None:
        pyplot()
        settle_startup_heap()

    thread = threading.Thread(target=load, name="import-matplotlib", daemon=True)
    thread.start()
    return thread


def write_summary(summary: RunSummary, path: Path, **marks: float | None) -> None:
    """`summary.json`: the summary's figures and the run's timing marks."""
    record = {**asdict(summary), **{k: v for k, v in marks.items() if v is not None}}
    write_atomic(path, json.dumps(record, indent=2) + "\n")


def write_reward_plot(records: Sequence[StepRecord], path: Path) -> None:
    plt = pyplot()
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


def write_report(records: Sequence[StepRecord], path: Path) -> None:
    """Six panels over RL steps: reward, eval accuracy, completion length, staleness, the
    behaviour/trainer KL by staleness and the share of tokens each correction touched."""
    plt = pyplot()
    rl = [r for r in records if r.phase == "rl"]
    steps = [r.step for r in rl]
    fig, axes = plt.subplots(3, 2, figsize=(10, 9.5), dpi=110)
    (reward, evals), (lengths, stale), (gap, touched) = axes
    reward.plot(steps, [r.reward_mean for r in rl], marker=".", label="reward mean")
    reward.plot(steps, [r.exact_fraction for r in rl], marker=".", label="pass rate")
    reward.set_title("reward")
    eval_names = sorted({k for r in rl for k in r.extra if k.startswith("eval/") and "/" in k[5:]})
    start = {k: v for r in records for k, v in r.extra.items() if k.startswith("eval_start/")}
    for name in eval_names:
        first = "eval_start/" + name.removeprefix("eval/")
        points = [(0, start[first])] if first in start else []
        points += [(r.step, r.extra[name]) for r in rl if name in r.extra]
        evals.plot(*zip(*points, strict=True), marker="o", label=name.removeprefix("eval/"))
    evals.set_title("held-out evaluation" if eval_names else "held-out evaluation (off)")
    lengths.plot(steps, [r.completion_len_mean for r in rl], marker=".", label="mean")
    lengths.plot(steps, [r.extra.get("completion_len/max") for r in rl], marker=".", label="max")
    lengths.set_title("completion length (tokens)")
    stale.plot(steps, [r.staleness_mean for r in rl], marker=".", label="mean")
    stale.plot(steps, [r.extra.get("staleness/max") for r in rl], marker=".", label="max")
    stale.plot(steps, [r.dropped_stale for r in rl], marker="x", label="dropped")
    stale.set_title("staleness (steps)")
    _plot_train_metrics(gap, rl, ["mismatch_kl", "stale_kl/"], "KL(behaviour ‖ trainer)")
    touched.set_title("tokens touched by corrections")
    _plot_train_metrics(touched, rl, ["clip_frac", "mask_frac", "correction/"], "")
    for ax in (reward, evals, lengths, stale, gap, touched):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _plot_train_metrics(ax: Any, rl: Sequence[StepRecord], prefixes: list[str], title: str) -> None:
    """One line per trainer metric starting with one of `prefixes` (log scale for KLs)."""
    names = sorted({k for r in rl for k in r.train if any(k.startswith(p) for p in prefixes)})
    for name in names:
        points = [(r.step, r.train[name]) for r in rl if name in r.train]
        ax.plot(*zip(*points, strict=True), marker=".", label=name)
    if title:  # KLs span decades and the mismatch may be exactly 0: linear near 0
        ax.set_title(title + (" by staleness (mismatch_kl: 0)" if names else " (no data)"))
        if names:
            ax.set_yscale("symlog", linthresh=1e-6)


LIVE_COLUMNS = {
    "step": lambda r: str(r.step),
    "phase": lambda r: r.phase,
    "reward": lambda r: _fmt(r.reward_mean),
    "pass": lambda r: _fmt(r.exact_fraction),
    "len": lambda r: _fmt(r.completion_len_mean),
    "stale": lambda r: _fmt(r.staleness_mean),
    "drop": lambda r: str(r.dropped_stale + int(r.extra.get("dropped/zero_variance_groups", 0))),
    "tok/s": lambda r: f"{r.tokens_per_s:.0f}",
    "wait T": lambda r: _fmt(r.extra.get("wait/trainer_s")),
    "wait P": lambda r: _fmt(r.extra.get("wait/policy_s")),
}


def print_live_table(records: Sequence[StepRecord], console: Console | None = None) -> None:
    """The most recent steps as a table (printed every `table_every` steps)."""
    table = Table(
        title="recent steps",
        caption="wait T: trainer waited for a batch (s); wait P: generation waited for a policy",
    )
    for name in LIVE_COLUMNS:
        table.add_column(name, justify="right")
    for record in records:
        table.add_row(*(cell(record) for cell in LIVE_COLUMNS.values()))
    (console or Console()).print(table)


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
    table.add_row("trainer waited for batches (s)", f"{summary.trainer_wait_s:.1f}")
    table.add_row("generation waited for a policy (s)", f"{summary.policy_wait_s:.1f}")
    table.add_row("dropped (stale samples + flat groups)", str(summary.dropped))
    if summary.startup_s is not None:
        table.add_row("start-up to first step (s)", f"{summary.startup_s:.2f}")
    if summary.shutdown_s is not None:
        table.add_row("shutdown, last step to exit (s)", f"{summary.shutdown_s:.2f}")
    (console or Console()).print(table)
