"""A curriculum against the fixed sampler on reversal with a wide length range, side by side.

The embedded default stack trains on three reversal tasks by string length (short ones the
warm start already solves, long ones it never solves exactly at first) once with the fixed
mixture and once with `orchestrator.curriculum.task_weighting = "learning_progress"`, same
seed, same warm start, one run after the other in this process. What it compares is
held-out: the greedy reward on the same evaluation problems of every length (equal per
length band), never the training reward, which a sampler that picks its problems inflates.
The figure is the held-out reward gained over the warm start per second of RL wall time
(evaluation time left out), at the end and at the wall time of the shorter run.

    python bench/curriculum.py [--steps 30] [--seeds 1] [--runs-dir /tmp/curriculum-runs]
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


def run_once(sampler: str, seed: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The metrics lines of one run (run now unless `--runs-dir` holds it finished)."""
    run = f"{sampler}-s{seed}"
    if not (args.runs_dir / run / "summary.json").exists():
        command = [
            sys.executable, "-m", "tidal.cli", "rl", "@", str(ROOT / "configs" / "default.toml"),
            "--run.output-dir", str(args.runs_dir), "--run.name", run, "--run.seed", str(seed),
            "--overwrite",
            "--orchestrator.tasks", tasks_override(),
            "--orchestrator.warmup-steps", str(args.warmup_steps),
            "--orchestrator.steps", str(args.steps),
            "--orchestrator.eval.every", str(args.eval_every),
            "--orchestrator.eval.prompts", str(args.eval_prompts),
            "--orchestrator.eval.k", "1",
            "--orchestrator.eval.after-warmup", "true",
            "--orchestrator.report.table-every", "0",
            *SAMPLERS[sampler],
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            raise RuntimeError(f"{run} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    lines = (args.runs_dir / run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def held_out(line: dict[str, Any]) -> float:
    """Mean greedy reward over the bands' held-out problems (each band weighs the same)."""
    return statistics.mean(line[f"eval/{band}/greedy_reward"] for band in BANDS)


def curve(lines: list[dict[str, Any]]) -> list[dict[str, float]]:
    """(RL wall seconds without evaluation, held-out reward, per band) at each evaluation,
    starting with the one after the warm-up (0 s)."""
    points, clock = [], 0.0
    for line in lines:
        if line["phase"] == "rl":
            clock += line["seconds"] - line.get("eval/seconds", 0.0)
        if "eval/short/greedy_reward" in line:
            point = {"step": line["step"], "wall_s": clock, "held_out": held_out(line)}
            point.update({band: line[f"eval/{band}/greedy_reward"] for band in BANDS})
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
    weights = {
        band: statistics.mean(line.get(f"curriculum/{band}/weight", 0.0) for line in rl)
        for band in BANDS
    }
    return {
        "sampler": sampler,
        "seed": seed,
        "rl wall s": end["wall_s"],
        "held-out start": start["held_out"],
        "held-out end": end["held_out"],
        "gain/s (end)": (end["held_out"] - start["held_out"]) / end["wall_s"],
        "gain/s (equal time)": (reward_at(points, common_s) - start["held_out"]) / common_s,
        **{f"end {band}": end[band] for band in BANDS},
        "train reward": statistics.mean(line["reward_mean"] for line in rl),
        **{f"drawn {band}": weights[band] for band in BANDS},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-prompts", type=int, default=16)
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/curriculum-runs"))
    args = parser.parse_args()
    runs = {(s, seed): run_once(s, seed, args) for seed in range(args.seeds) for s in SAMPLERS}
    rows, curves = [], {}
    for seed in range(args.seeds):
        common_s = min(curve(runs[s, seed])[-1]["wall_s"] for s in SAMPLERS)
        for sampler in SAMPLERS:
            rows.append(summarize(sampler, seed, runs[sampler, seed], common_s))
            curves[f"{sampler}-s{seed}"] = curve(runs[sampler, seed])
    print_table("Curriculum vs fixed sampler: held-out greedy reward over all lengths", rows)
    ratios = {}
    for key in ("gain/s (end)", "gain/s (equal time)"):
        fixed = statistics.mean(r[key] for r in rows if r["sampler"] == "fixed")
        curriculum = statistics.mean(r[key] for r in rows if r["sampler"] != "fixed")
        ratios[key] = curriculum / fixed if fixed > 0 else float("inf")
    print({k: round(v, 3) for k, v in ratios.items()})
    config = {
        "run_config": "configs/default.toml",
        "bands": BANDS,
        "warmup_steps": args.warmup_steps,
        "steps": args.steps,
        "seeds": args.seeds,
        "eval_every": args.eval_every,
        "eval_prompts_per_band": args.eval_prompts,
        "samplers": SAMPLERS,
    }
    summary = {"ratio (curriculum / fixed)": ratios, "curves": curves}
    path = write_result("curriculum", config=config, results=rows, summary=summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
