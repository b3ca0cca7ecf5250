"""A curriculum against the fixed sampler on reversal over a wide length range, one run
after another with the same seeds.

Three reversal bands by string length, each a finite training set (`train_size`) so the
curriculum can judge problems one by one: `short` (1-2 letters, which the warm start
mostly solves), `mid` (3-5, partly solved) and `long` (10-14, never reversed exactly).
The reward is the task's own: partial credit by position, or 0/1 for the bands `--binary`
names (every band when it names none). A completion "passes" at `--pass-threshold` of
it. The fixed sampler draws the bands 1/3 each. `--curriculum skip` draws the same way but
passes over problems whose latest group all passed (and, unless `--skip-below none`,
those of which none passed), re-admitting them after `--readmit-after` steps; `signal`
and `learning-progress` weight the bands instead (`--explore` of the draws stay fixed).
Runs go one after another (the machine's cores are shared), in alternating order across
seeds, with the load average read around each. What is compared is held-out: the mean
over the bands (each weighs the same) of the reward of k samples at the training
temperature on the same held-out problems, never the training reward (a sampler that
picks its problems picks it). Two readings of its rate: the gain over the warm start at
the end per second of RL time (evaluation left out), and how much sooner in RL seconds
the curve first gains `--target` (which still counts when both runs end on the same
plateau). Finished runs under `--runs-dir` are read, not run again.

    python bench/curriculum.py [--curriculum skip] [--steps 200] [--seeds 2] [--runs-dir DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import ROOT, median_seconds, print_table, write_result

from tidal.orchestrator.records.run_log import run_log_records

BANDS = {"short": (1, 2), "mid": (3, 5), "long": (10, 14)}
"""Task name → (min_len, max_len) of its strings (`--short`, `--mid`, `--long` change one)."""
POOL = 128
"""Training problems per band (each band's `train_size`)."""


def samplers(args: argparse.Namespace) -> dict[str, list[str]]:
    """Sampler name → its command-line settings: the fixed sampler and the curriculum
    `--curriculum` picks."""
    curriculum = "--orchestrator.curriculum."
    if args.curriculum == "skip":
        settings = [
            *([f"{curriculum}skip-above", args.skip_above] if args.skip_above != "none" else []),
            *([f"{curriculum}skip-below", args.skip_below] if args.skip_below != "none" else []),
            f"{curriculum}min-samples", "8", f"{curriculum}readmit-after", str(args.readmit_after),
            f"{curriculum}pass-threshold", str(args.pass_threshold),
        ]  # fmt: skip
    else:
        settings = [
            f"{curriculum}task-weighting", args.curriculum.replace("-", "_"),
            f"{curriculum}explore", str(args.explore),
            f"{curriculum}pass-threshold", str(args.pass_threshold),
        ]  # fmt: skip
    return {"fixed": [], args.curriculum: settings}


def pool(band: str, args: argparse.Namespace) -> int:
    """Training problems of `band` (`--long-pool` sets the long band's apart)."""
    return args.long_pool if band == "long" and args.long_pool else POOL


def tasks_override(args: argparse.Namespace) -> str:
    def credit(band: str) -> str:
        binary = args.binary is not None and (not args.binary or band in args.binary)
        return ", partial_credit = false" if binary else ""

    bands = (
        f'{{type = "reversal", name = "{n}", min_len = {lo}, max_len = {hi}, '
        f"train_size = {pool(n, args)}{credit(n)}}}"
        for n, (lo, hi) in BANDS.items()
    )
    return f"[{', '.join(bands)}]"


def run(sampler: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One run to its end (read back when `--runs-dir` holds it finished): its metrics
    lines and the load average (1 min) before and after it."""
    name = f"{sampler}-s{seed}"
    folder = args.runs_dir / name
    load = [os.getloadavg()[0]]
    if not (folder / "summary.json").exists():
        command = [
            sys.executable, "-m", "tidal.cli", "rl", "@", str(ROOT / "configs" / "default.toml"),
            "--run.output-dir", str(args.runs_dir), "--run.name", name, "--run.seed", str(seed),
            "--overwrite",
            "--orchestrator.tasks", tasks_override(args),
            "--orchestrator.warmup-steps", str(args.warmup_steps),
            "--orchestrator.steps", str(args.steps),
            "--orchestrator.eval.every", str(args.eval_every),
            "--orchestrator.eval.prompts", str(args.eval_prompts),
            "--orchestrator.eval.k", str(args.eval_k),
            "--orchestrator.eval.after-warmup", "true",
            "--orchestrator.report.table-every", "0",
            *samplers(args)[sampler],
        ]  # fmt: skip
        args.runs_dir.mkdir(parents=True, exist_ok=True)
        log = args.runs_dir / f"{name}.out"
        with log.open("w") as out:
            if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT).returncode:
                raise RuntimeError(f"{name} failed:\n{log.read_text()[-3000:]}")
        (folder / "load.json").write_text(json.dumps([*load, os.getloadavg()[0]]))
    lines = run_log_records(folder / "metrics.jsonl")
    return {"lines": lines, "load": json.loads((folder / "load.json").read_text())}


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


def seconds_to(points: list[dict[str, float]], level: float) -> float | None:
    """RL seconds at which the held-out curve first reaches `level` (linear between
    evaluations); None when it never does."""
    for a, b in itertools.pairwise(points):
        if a["held_out"] >= level:
            return a["wall_s"]
        if b["held_out"] >= level:
            share = (level - a["held_out"]) / (b["held_out"] - a["held_out"])
            return a["wall_s"] + share * (b["wall_s"] - a["wall_s"])
    return None


def summarize(
    name: str, seed: int, result: dict[str, Any], common_s: float, target: float
) -> dict[str, Any]:
    lines = result["lines"]
    points = curve(lines)
    start, end = points[0], points[-1]
    rl = [line for line in lines if line["phase"] == "rl"]
    gain = end["held_out"] - start["held_out"]
    # a run that never gains the target counts its whole RL time: a ratio is then a bound
    reached_s = seconds_to(points, start["held_out"] + target)
    return {
        "sampler": name,
        "seed": seed,
        "load 1 min before/after": "/".join(f"{x:.1f}" for x in result["load"]),
        "RL steps": len(rl),
        "RL s": end["wall_s"],
        "held-out start": start["held_out"],
        "held-out end": end["held_out"],
        "gain/s": gain / end["wall_s"],
        "gain/s @ equal s": (reward_at(points, common_s) - start["held_out"]) / common_s,
        "gain/step": gain / len(rl),
        "s to target": end["wall_s"] if reached_s is None else reached_s,
        "reached": reached_s is not None,
        **{f"end {band}": end[band] for band in BANDS},
        "zero-adv share": statistics.mean(
            line.get("train/zero_adv_skipped_samples", 0.0) / max(line["samples"], 1) for line in rl
        ),
        "tokens/step": statistics.mean(line["generated_tokens"] for line in rl),
        "train reward": statistics.mean(line["reward_mean"] for line in rl),
        "skips": rl[-1].get("curriculum/skips", 0.0),
        **{f"draws {band}": draws(rl, band) for band in BANDS},
    }


def draws(rl: list[dict[str, Any]], band: str) -> float:
    """The band's mean draw probability over the RL steps (its fixed share without task
    weights)."""
    shares = [line.get(f"curriculum/{band}/weight") for line in rl]
    return statistics.mean(s for s in shares if s is not None) if any(shares) else 1 / len(BANDS)


RATIOS = ("gain/s", "gain/s @ equal s", "gain/step")


def bound(fixed_reached: bool, other_reached: bool) -> str:
    """How to read a seed's speed to the target: exact when both runs reached it, a lower
    bound when only the curriculum did, an upper one when only the fixed sampler did."""
    return {(True, True): "=", (False, True): ">=", (True, False): "<="}.get(
        (fixed_reached, other_reached), "neither"
    )


def overhead(args: argparse.Namespace) -> dict[str, float]:
    """The curriculum's own cost, in-process on the bench's bands: one step's draw of 8
    prompts with and without it, at the worst case for skipping (every problem judged out
    of band, so the first search visits every one), and the JSON size of its saved state."""
    from tidal.orchestrator.curriculum_config import CurriculumConfig
    from tidal.orchestrator.mixture import TaskMixture
    from tidal.orchestrator.task_config import ReversalTaskConfig
    from tidal.orchestrator.tasks import build_tasks

    configs = [
        ReversalTaskConfig(name=n, min_len=lo, max_len=hi, train_size=POOL)
        for n, (lo, hi) in BANDS.items()
    ]
    tasks = build_tasks(configs, seed=0)
    skip = CurriculumConfig(
        skip_above=1.0, skip_below=0.0, min_samples=8, readmit_after=args.readmit_after
    )
    weights = [1.0] * len(tasks)
    fixed = TaskMixture(tasks, weights, seed=0)
    curriculum = TaskMixture(tasks, weights, seed=0, curriculum=skip)
    for task in tasks:
        for i in range(POOL):
            fixed.observe(task.problem(i), [0.0] * 8)
            curriculum.observe(task.problem(i), [0.0] * 8)
    start = time.perf_counter()
    curriculum.draw(8, step=1)
    first_s = time.perf_counter() - start
    return {
        "fixed draw ms": median_seconds(lambda: fixed.draw(8, step=1)) * 1e3,
        "first all-skipped draw ms": first_s * 1e3,
        "later all-skipped draw ms": median_seconds(lambda: curriculum.draw(8, step=2)) * 1e3,
        "state KB": len(json.dumps(curriculum.state_dict())) / 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument(
        "--curriculum", choices=("skip", "signal", "learning-progress"), default="skip",
        help="skip: problems out of band; signal, learning-progress: task weights",
    )  # fmt: skip
    parser.add_argument("--explore", type=float, default=0.2, help="task weights' explore share")
    parser.add_argument("--readmit-after", type=int, default=40)
    parser.add_argument("--pass-threshold", type=float, default=0.75)
    parser.add_argument("--skip-below", default="0.0", help="a pass rate, or none")
    parser.add_argument("--skip-above", default="1.0", help="a pass rate, or none")
    for band, (lo, hi) in BANDS.items():
        parser.add_argument(
            f"--{band}", type=int, nargs=2, default=(lo, hi), metavar=("MIN", "MAX"),
            help=f"string lengths of the {band} band (default {lo} {hi})",
        )  # fmt: skip
    parser.add_argument("--long-pool", type=int, default=None, help=f"default {POOL}")
    parser.add_argument(
        "--binary",
        nargs="*",
        choices=list(BANDS),
        help="score the bands named (every band when none is) 0/1, exact or not",
    )
    parser.add_argument(
        "--target", type=float, default=0.1, help="held-out gain whose time is compared"
    )
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--eval-prompts", type=int, default=32)
    parser.add_argument("--eval-k", type=int, default=4)
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/curriculum-runs"))
    args = parser.parse_args()
    BANDS.update({band: tuple(getattr(args, band)) for band in BANDS})
    names = list(samplers(args))
    rows: list[dict[str, Any]] = []
    curves: dict[str, list[dict[str, float]]] = {}
    per_seed: list[dict[str, float]] = []
    for seed in range(args.seeds):
        order = names if seed % 2 == 0 else names[::-1]  # neither always runs first
        runs = {name: run(name, seed, args) for name in order}
        common_s = min(curve(r["lines"])[-1]["wall_s"] for r in runs.values())
        seed_rows = {
            name: summarize(name, seed, runs[name], common_s, args.target) for name in names
        }
        rows += seed_rows.values()
        curves.update({f"{name}-s{seed}": curve(runs[name]["lines"]) for name in names})
        fixed, other = seed_rows["fixed"], seed_rows[names[1]]
        per_seed.append(
            {"seed": seed}
            | {k: other[k] / fixed[k] if fixed[k] > 0 else float("nan") for k in RATIOS}
            | {"speed to target": fixed["s to target"] / other["s to target"]}
            | {"bound": bound(fixed["reached"], other["reached"])}
        )
    median = {k: statistics.median(r[k] for r in per_seed) for k in (*RATIOS, "speed to target")}
    costs = overhead(args)
    print_table(f"{names[1]} vs the fixed sampler: held-out reward over all lengths", rows)
    print_table(f"Held-out gain, {names[1]} / fixed, per seed", per_seed)
    print_table("Median over seeds", [median])
    print_table("The curriculum's own cost (in-process)", [costs])
    config = {
        "run_config": "configs/default.toml",
        "bands": BANDS,
        "train_size_per_band": {band: pool(band, args) for band in BANDS},
        "binary_rewards": args.binary,
        "skip_above": args.skip_above,
        "warmup_steps": args.warmup_steps,
        "steps": args.steps,
        "seeds": args.seeds,
        "readmit_after": args.readmit_after,
        "pass_threshold": args.pass_threshold,
        "skip_below": args.skip_below,
        "eval_every": args.eval_every,
        "eval_prompts_per_band": args.eval_prompts,
        "eval_k": args.eval_k,
        "target_gain": args.target,
        "curriculum": args.curriculum,
        "explore": args.explore,
        "samplers": samplers(args),
    }
    ratio = {"per_seed": per_seed, "median": median}
    summary = {f"ratio ({names[1]} / fixed)": ratio, "overhead": costs, "curves": curves}
    path = write_result("curriculum", config=config, results=rows, summary=summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
