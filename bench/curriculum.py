"""Curricula against the fixed sampler on string reversal over a wide length range.

The embedded default stack trains on three length bands (strings of one letter, which the
warm start already solves; 2-4 letters, which it partly solves; 10-14, which it never
reverses exactly) with the fixed mixture and with each curriculum, same seed, same warm
start, one run after another in this process. Two setups:
- `exact`: the bands' strings as records (a finite pool per band, held-out records
  apart) scored by exact match, so a group of a solved or a hopeless problem has no reward
  variance: samplers fixed, skip (problems always or never solved are skipped) and
  learning_progress;
- `partial`: the built-in reversal task per band (unbounded, partial credit by position,
  so every length gives some signal): samplers fixed and learning_progress.
What it compares is held-out: the reward of k samples at the training temperature on
the same held-out problems of every band (each band weighs the same), never the training
reward, which a sampler that picks its problems inflates. The figure is the held-out
reward gained over the warm start per second of RL wall time (evaluation left out), at
the end and at the RL time of the setup's shortest run.

    python bench/curriculum.py [--setups exact partial] [--steps 200] [--runs-dir DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import ROOT, print_table, write_result

BANDS = {"short": (1, 1), "mid": (2, 4), "long": (10, 14)}
"""Task name → (min_len, max_len) of its strings."""
ALPHABET = "abcd"
POOL, HELD_OUT = 200, 64
"""exact setup: training records and held-out records per band (one-letter strings are
only four: that band trains and evaluates on all of them)."""
CURRICULUM = "--orchestrator.curriculum."
SAMPLERS: dict[str, dict[str, list[str]]] = {
    "exact": {
        "fixed": [],
        "skip": [f"{CURRICULUM}skip-above", "1.0", f"{CURRICULUM}skip-below", "0.0"],
        "learning_progress": [f"{CURRICULUM}task-weighting", "learning_progress"],
    },
    "partial": {
        "fixed": [],
        "learning_progress": [f"{CURRICULUM}task-weighting", "learning_progress"],
    },
}


def write_records(folder: Path, seed: int) -> dict[str, tuple[Path, Path]]:
    """Band → (training records, held-out records): distinct strings, disjoint where the
    band has enough of them."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for band, (low, high) in BANDS.items():
        strings: set[str] = set()
        possible = sum(len(ALPHABET) ** n for n in range(low, high + 1))
        while len(strings) < min(possible, POOL + HELD_OUT):
            length = rng.randint(low, high)
            strings.add("".join(rng.choice(ALPHABET) for _ in range(length)))
        ordered = sorted(strings)
        rng.shuffle(ordered)
        train, held = (
            (ordered, ordered) if possible < POOL else (ordered[HELD_OUT:], ordered[:HELD_OUT])
        )
        paths = (folder / f"{band}.train.jsonl", folder / f"{band}.eval.jsonl")
        for path, part in zip(paths, (train, held), strict=True):
            path.write_text(
                "".join(json.dumps({"prompt": f"{t}>", "answer": t[::-1]}) + "\n" for t in part)
            )
        files[band] = paths
    return files


def tasks_override(setup: str, folder: Path, seed: int) -> str:
    if setup == "partial":
        bands = [
            f'{{type = "reversal", name = "{n}", min_len = {lo}, max_len = {hi}}}'
            for n, (lo, hi) in BANDS.items()
        ]
    else:
        longest = max(high for _, high in BANDS.values())
        bands = [
            f'{{type = "dataset", name = "{n}", path = "{train}", eval_path = "{held}", '
            f"max_answer_chars = {longest}}}"
            for n, (train, held) in write_records(folder / "records", seed).items()
        ]
    return f"[{', '.join(bands)}]"


def run_once(setup: str, sampler: str, seed: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The metrics lines of one run (run now unless `--runs-dir` holds it finished)."""
    run = f"{setup}-{sampler}-s{seed}"
    if not (args.runs_dir / run / "summary.json").exists():
        command = [
            sys.executable, "-m", "tidal.cli", "rl", "@", str(ROOT / "configs" / "default.toml"),
            "--run.output-dir", str(args.runs_dir), "--run.name", run, "--run.seed", str(seed),
            "--overwrite",
            "--orchestrator.tasks", tasks_override(setup, args.runs_dir / setup, seed),
            "--orchestrator.warmup-steps", str(args.warmup_steps),
            "--orchestrator.steps", str(args.steps),
            "--orchestrator.eval.every", str(args.eval_every),
            "--orchestrator.eval.prompts", str(args.eval_prompts),
            "--orchestrator.eval.k", str(args.eval_k),
            "--orchestrator.eval.after-warmup", "true",
            "--orchestrator.report.table-every", "0",
            *SAMPLERS[setup][sampler],
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            raise RuntimeError(f"{run} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    lines = (args.runs_dir / run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


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
    setup: str, sampler: str, seed: int, lines: list[dict[str, Any]], common_s: float
) -> dict[str, Any]:
    points = curve(lines)
    start, end = points[0], points[-1]
    rl = [line for line in lines if line["phase"] == "rl"]
    drawn = {
        band: statistics.mean(line.get(f"curriculum/{band}/weight", 1 / len(BANDS)) for line in rl)
        for band in BANDS
    }
    return {
        "setup": setup,
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
    parser.add_argument(
        "--setups", nargs="+", choices=sorted(SAMPLERS), default=["exact", "partial"]
    )
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--eval-prompts", type=int, default=32)
    parser.add_argument("--eval-k", type=int, default=4)
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/curriculum-runs"))
    args = parser.parse_args()
    rows, curves, ratios = [], {}, {}
    for setup in args.setups:
        for seed in range(args.seeds):
            runs = {s: run_once(setup, s, seed, args) for s in SAMPLERS[setup]}
            common_s = min(curve(lines)[-1]["wall_s"] for lines in runs.values())
            for sampler, lines in runs.items():
                rows.append(summarize(setup, sampler, seed, lines, common_s))
                curves[f"{setup}-{sampler}-s{seed}"] = curve(lines)
        for sampler in SAMPLERS[setup]:
            if sampler == "fixed":
                continue
            for key in ("gain/s", "gain/s @ equal s"):
                mine = [r for r in rows if r["setup"] == setup and r["sampler"] == sampler]
                fixed = [r for r in rows if r["setup"] == setup and r["sampler"] == "fixed"]
                base = statistics.mean(r[key] for r in fixed)
                ratio = statistics.mean(r[key] for r in mine) / base if base > 0 else float("nan")
                ratios[f"{setup}/{sampler}/{key}"] = ratio
    print_table("Curricula vs the fixed sampler: held-out reward over all lengths", rows)
    print_table(
        "Held-out reward per RL second, curriculum / fixed",
        [{"setup/sampler/figure": k, "ratio": v} for k, v in ratios.items()],
    )
    config = {
        "run_config": "configs/default.toml",
        "bands": BANDS,
        "alphabet": ALPHABET,
        "exact_pool_per_band": [POOL, HELD_OUT],
        "warmup_steps": args.warmup_steps,
        "steps": args.steps,
        "seeds": args.seeds,
        "eval_every": args.eval_every,
        "eval_prompts_per_band": args.eval_prompts,
        "eval_k": args.eval_k,
        "samplers": {setup: SAMPLERS[setup] for setup in args.setups},
    }
    summary = {"ratio (curriculum / fixed)": ratios, "curves": curves}
    path = write_result("curriculum", config=config, results=rows, summary=summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
