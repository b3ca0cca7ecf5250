"""TRL's side of the SmolLM2 benches as Tidal's side sees it: problems out, events and curves in.

TRL's script (`trl_side/grpo_smollm2.py`) runs in another venv without Tidal, so the
problems cross as a JSON file written here by Tidal's own `reasoning_gym` task: the
training problems in the order Tidal's orchestrator draws them for one task (its train
split from index 0) and the first held-out problems its evaluation uses. Both sides then
train on and are evaluated on the same problems. `compare` reads the two accuracy
curves against each other at equal wall time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tidal.orchestrator.task_config import ReasoningGymTaskConfig
from tidal.orchestrator.tasks import build_task

HERE = Path(__file__).resolve().parent
TRL_SCRIPT = HERE / "trl_side" / "grpo_smollm2.py"


def write_problems(
    task: dict[str, Any], *, seed: int, train: int, held_out: int, path: Path
) -> Path:
    """`path` holding the task's first `train` training and `held_out` eval problems.

    `task` is an `[orchestrator.task]` table of type "reasoning_gym"; `seed` is `run.seed`.
    """
    built = build_task(ReasoningGymTaskConfig(**task), seed=seed)

    def entry(split: str, index: int) -> dict[str, Any]:
        problem = built.problem(index, split=split)  # type: ignore[arg-type]
        return {"question": problem.prompt, "answer": problem.answer, "metadata": problem.metadata}

    spec = {
        "dataset": task["dataset"],
        "options": task.get("options", {}),
        "train": [entry("train", i) for i in range(train)],
        "eval": [entry("eval", i) for i in range(held_out)],
    }
    path.write_text(json.dumps(spec))
    return path


def trl_command(
    python: Path,
    folder: Path,
    *,
    problems: Path,
    events: Path,
    workdir: Path,
    task: dict[str, Any],
    flags: dict[str, Any],
) -> list[str]:
    """The TRL script's command line: `flags` as `--name value` (True: the bare flag)."""
    command = [
        str(python),
        str(TRL_SCRIPT),
        "--model",
        str(folder),
        "--problems",
        str(problems),
        "--out",
        str(events),
        "--workdir",
        str(workdir),
    ]
    if task.get("extract"):
        command += ["--extract", task["extract"]]
    for name, value in flags.items():
        if value is True:
            command.append(f"--{name}")
        elif value is not None and value is not False:
            command += [f"--{name}", str(value)]
    return command


def read_events(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of a TRL event log (a line still being written is left out)."""
    if not path.is_file():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text.splitlines()[: text.count("\n")]]


def gain_by(points: list[dict[str, Any]], clock: str, t: float) -> float | None:
    """Accuracy of the last evaluation at or before `t` on `clock`, less the start's."""
    seen = [p["greedy_accuracy"] for p in points if p[clock] <= t]
    return round(seen[-1] - points[0]["greedy_accuracy"], 4) if seen else None


def first_reaching(points: list[dict[str, Any]], clock: str, gain: float) -> float | None:
    start = points[0]["greedy_accuracy"]
    return next((p[clock] for p in points if p["greedy_accuracy"] - start >= gain), None)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else round(a / b, 2)


def mean_gain(points: list[dict[str, Any]], clock: str, horizon: float) -> float:
    """Time-average over [0, horizon] of the gain the last evaluation so far shows (0 before)."""
    start, total, since, gain = points[0]["greedy_accuracy"], 0.0, 0.0, 0.0
    for p in points:
        if p[clock] > horizon:
            break
        total += gain * (p[clock] - since)
        since, gain = p[clock], p["greedy_accuracy"] - start
    return round((total + gain * (horizon - since)) / horizon, 4)


def compare(rows: list[dict[str, Any]], clock: str) -> dict[str, Any]:
    """Tidal against TRL on one clock: the gain at equal wall time, the time to a gain.

    An arm's gain at time t is its last evaluation by t less its own start; an arm whose
    evaluations ended earlier holds its last one (its run finished, or was cut at the
    budget). Gains are compared at every evaluation time of either arm, at the earlier
    and the later of the two last evaluations, and averaged over time up to the later.
    The time to a gain is the first evaluation at or above Tidal's last gain, or TRL's
    best gain where TRL never reaches Tidal's.
    """
    arms = {arm: [p for p in rows if p["arm"] == arm] for arm in ("tidal", "trl")}
    tidal, trl = arms["tidal"], arms["trl"]

    def at(t: float) -> dict[str, Any]:
        gains = {arm: gain_by(points, clock, t) for arm, points in arms.items()}
        return {
            "min": t,
            "tidal_gain": gains["tidal"],
            "trl_gain": gains["trl"],
            "gain_ratio": ratio(gains["tidal"], gains["trl"]),
        }

    ends = sorted(points[-1][clock] for points in arms.values())
    means = {arm: mean_gain(points, clock, ends[1]) for arm, points in arms.items()}
    # unrounded: a gain rounded up would not be reached by the evaluation that defines it
    target = tidal[-1]["greedy_accuracy"] - tidal[0]["greedy_accuracy"]
    trl_best = max(p["greedy_accuracy"] for p in trl) - trl[0]["greedy_accuracy"]
    if first_reaching(trl, clock, target) is None and trl_best > 0:
        target = trl_best
    tidal_t, trl_t = first_reaching(tidal, clock, target), first_reaching(trl, clock, target)
    return {
        "at_first_end": at(ends[0]),
        "at_last_end": at(ends[1]),
        "mean_gain_to_last_end": {**means, "ratio": ratio(means["tidal"], means["trl"])},
        "time_to_gain": {
            "gain": round(target, 4),
            "tidal_min": tidal_t,
            "trl_min": trl_t,
            "ratio": ratio(trl_t, tidal_t),
        },
        "at_evaluations": [at(t) for t in sorted({p[clock] for p in rows})],
    }


def comparisons(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Tidal against TRL per seed that ran both, with and without the evaluations' time."""
    out = {}
    for seed in sorted({p["seed"] for p in rows}):
        if {p["arm"] for p in rows if p["seed"] == seed} == {"tidal", "trl"}:
            out[f"vs_trl seed {seed}"] = {
                clock: compare([p for p in rows if p["seed"] == seed], clock)
                for clock in ("wall_min", "wall_min_less_eval")
            }
    return out
