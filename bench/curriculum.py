"""A learning-progress curriculum against the fixed sampler on reversal over a wide length
range, side by side.

The embedded default stack trains on three reversal tasks by string length (one letter,
which the warm start already solves; 2-4 letters, which it partly solves; 10-14, which it
never reverses exactly) once with the fixed mixture and once with
`orchestrator.curriculum.task_weighting = "learning_progress"`, same seed, same warm
start, both runs at the same time (so the changing load of a shared machine falls on
both alike). What it compares is held-out: the reward of k samples at the training
temperature on the same held-out problems of every band (each band weighs the same),
never the training reward, which a sampler that picks its problems inflates. The figure
is the held-out reward gained over the warm start per second of RL wall time (evaluation
left out), at the end and at the RL time of the shorter run. Finished runs under
`--runs-dir` are read, not run again.

    python bench/curriculum.py [--steps 200] [--seeds 1] [--runs-dir DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import ROOT, print_table, write_result

BANDS = {"short": (1, 1), "mid": (2, 4), "long": (10, 14)}
"""Task name → (min_len, max_len) of its strings."""
SAMPLERS: dict[str, list[str]] = {
    "fixed": [],
    "learning_progress": ["--orchestrator.curriculum.task-weighting", "learning_progress"],
}


def tasks_override() -> str:
    bands = (
        f'{{type = "reversal", name = "{n}", min_len = {lo}, max_len = {hi}}}'
        for n, (lo, hi) in BANDS.items()
    )
    return f"[{', '.join(bands)}]"


def start_run(sampler: str, seed: int, args: argparse.Namespace) -> subprocess.Popen[bytes] | None:
    """Start one run (None when `--runs-dir` holds it finished)."""
    run = f"{sampler}-s{seed}"
    if (args.runs_dir / run / "summary.json").exists():
        return None
    command = [
        sys.executable, "-m", "tidal.cli", "rl", "@", str(ROOT / "configs" / "default.toml"),
        "--run.output-dir", str(args.runs_dir), "--run.name", run, "--run.seed", str(seed),
        "--overwrite",
        "--orchestrator.tasks", tasks_override(),
        "--orchestrator.warmup-steps", str(args.warmup_steps),
        "--orchestrator.steps", str(args.steps),
        "--orchestrator.eval.every", str(args.eval_every),
        "--orchestrator.eval.prompts", str(args.eval_prompts),
        "--orchestrator.eval.k", str(args.eval_k),
        "--orchestrator.eval.after-warmup", "true",
        "--orchestrator.report.table-every", "0",
        *SAMPLERS[sampler],
    ]  # fmt: skip
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    with (args.runs_dir / f"{run}.out").open("w") as out:  # the child keeps its own handle
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)


def run_pair(seed: int, args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """Every sampler's run of one seed, side by side (at the same time, so a shared
    machine's changing load falls on both alike); their metrics lines."""
    started = {sampler: start_run(sampler, seed, args) for sampler in SAMPLERS}
    for sampler, process in started.items():
        if process is not None and process.wait() != 0:
            output = (args.runs_dir / f"{sampler}-s{seed}.out").read_text()
            raise RuntimeError(f"{sampler}-s{seed} failed:\n{output[-3000:]}")
    return {
        sampler: [
            json.loads(line)
            for line in (args.runs_dir / f"{sampler}-s{seed}" / "metrics.jsonl")
            .read_text()
            .splitlines()
        ]
        for sampler in SAMPLERS
    }


def held_out(line: dict[str, Any], kind: str = "sampled") -> float:
    """Mean held-out reward over the bands (each band weighs the same): `sampled` at the
    training temperature (the training reward's held-out counterpart) or `greedy`."""
    return statistics.mean(line[f"eval/{band}/{kind}_reward"] for band in BANDS)


def curve(lines: list[dict[str, Any]]) -> list[dict[str, float]]:
    """At each evaluation, starting with the warm start's (0 s): RL wall seconds so far
    without evaluation time, the held-out rewards, and the sampled reward per band."""
    points, clock = [], 0.0
    for line in lines:
        if line["phase"] == "rl":
            clock += line["seconds"] - line.get("eval/seconds", 0.0)
        if "eval/short/sampled_reward" in line:
            point = {"step": line["step"], "wall_s": clock}
            point.update(held_out=held_out(line), greedy=held_out(line, "greedy"))
            point.update({band: line[f"eval/{band}/sampled_reward"] for band in BANDS})
            points.append(point)
    return points


def reward_at(points: list[dict[str, float]], wall_s: float) -> float:
    """Held-out reward at `wall_s`, linearly interpolated between evaluations."""
    for a, b in itertools.pairwise(points):
        if a["wall_s"] <= wall_s <= b["wall_s"]:
            share = (wall_s - a["wall_s"]) / max(b["wall_s"] - a["wall_s"], 1e-9)
            return a["held_out"] + share * (b["held_out"] - a["held_out"])
    return points[-1]["held_out"]


def summarize(
    sampler: str, seed: int, lines: list[dict[str, Any]], common_s: float
) -> dict[str, Any]:
    points = curve(lines)
    start, end = points[0], points[-1]
    rl = [line for line in lines if line["phase"] == "rl"]
    drawn = {
        band: statistics.mean(line.get(f"curriculum/{band}/weight", 1 / len(BANDS)) for line in rl)
        for band in BANDS
    }
    return {
        "sampler": sampler,
        "seed": seed,
        "RL s": end["wall_s"],
        "held-out start": start["held_out"],
        "held-out end": end["held_out"],
        "gain/s": (end["held_out"] - start["held_out"]) / end["wall_s"],
        "gain/s @ equal s": (reward_at(points, common_s) - start["held_out"]) / common_s,
        "greedy start": start["greedy"],
        "greedy end": end["greedy"],
        **{f"end {band}": end[band] for band in BANDS},
        "train reward": statistics.mean(line["reward_mean"] for line in rl),
        **{f"drawn {band}": drawn[band] for band in BANDS},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--eval-prompts", type=int, default=32)
    parser.add_argument("--eval-k", type=int, default=4)
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/curriculum-runs"))
    args = parser.parse_args()
    rows, curves = [], {}
    for seed in range(args.seeds):
        runs = run_pair(seed, args)
        common_s = min(curve(lines)[-1]["wall_s"] for lines in runs.values())
        for sampler, lines in runs.items():
            rows.append(summarize(sampler, seed, lines, common_s))
            curves[f"{sampler}-s{seed}"] = curve(lines)
    ratios = {}
    for key in ("gain/s", "gain/s @ equal s"):
        fixed = statistics.mean(r[key] for r in rows if r["sampler"] == "fixed")
        mine = statistics.mean(r[key] for r in rows if r["sampler"] != "fixed")
        ratios[key] = mine / fixed if fixed > 0 else float("nan")
    print_table("Learning progress vs the fixed sampler: held-out reward over all lengths", rows)
    print_table("Held-out reward gained per RL second, curriculum / fixed", [ratios])
    config = {
        "run_config": "configs/default.toml",
        "bands": BANDS,
        "warmup_steps": args.warmup_steps,
        "steps": args.steps,
        "seeds": args.seeds,
        "eval_every": args.eval_every,
        "eval_prompts_per_band": args.eval_prompts,
        "eval_k": args.eval_k,
        "samplers": SAMPLERS,
    }
    summary = {"ratio (curriculum / fixed)": ratios, "curves": curves}
    path = write_result("curriculum", config=config, results=rows, summary=summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
