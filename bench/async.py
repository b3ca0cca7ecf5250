"""Asynchrony: seconds per RL step and trainer-idle fraction for max_async 0, 1 and 2.

Runs the embedded default stack (`tidal rl @ configs/default.toml`, the real four
services on loopback) once per setting and repeat, interleaved (0, 1, 2, 0, 1, 2, ...)
so drift on a shared machine hits every setting alike, and reads each run's
metrics.jsonl:
- seconds per step: median of the RL steps' `seconds` (time between step completions),
  leaving out the first RL steps while the pipeline fills;
- trainer-idle fraction: Σ `wait/trainer_s` (the trainer waiting for its next batch,
  from one Train reply to the next Train call) / Σ `seconds` over the same steps.
Threads per service come from the run config (`trainer.num_threads`,
`inference.num_threads`, both 1 by default so the two compute services share two cores).

    python bench/async.py [--repeats 2] [--steps 40]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import ROOT, print_table, write_result

from tidal.orchestrator.records.run_log import run_log_records

SETTINGS = (0, 1, 2)
SKIP_FIRST = 3


def run_once(max_async: int, *, steps: int, warmup: int, out: Path, tag: str) -> dict[str, float]:
    name = f"async{max_async}-{tag}"
    command = [
        sys.executable, "-m", "tidal.cli", "rl", "@", str(ROOT / "configs" / "default.toml"),
        "--run.output-dir", str(out), "--run.name", name,
        "--orchestrator.staleness.max-async", str(max_async),
        "--orchestrator.steps", str(steps), "--orchestrator.warmup-steps", str(warmup),
        "--orchestrator.report.table-every", "0",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    records = run_log_records(out / name / "metrics.jsonl")
    rl = [r for r in records if r["phase"] == "rl"][SKIP_FIRST:]
    total = sum(r["seconds"] for r in rl)
    return {
        "s_per_step": statistics.median(r["seconds"] for r in rl),
        "trainer_idle": sum(r["wait/trainer_s"] for r in rl) / total,
        "policy_wait_s": statistics.median(r["wait/policy_s"] for r in rl),
        "staleness": statistics.mean(r["staleness_mean"] for r in rl),
        "reward_last5": statistics.mean(r["reward_mean"] for r in rl[-5:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=15)
    args = parser.parse_args()
    runs: dict[int, list[dict[str, float]]] = {k: [] for k in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="tidal-bench-async-") as tmp:
        for repeat in range(args.repeats):
            for k in SETTINGS:
                runs[k].append(
                    run_once(
                        k, steps=args.steps, warmup=args.warmup, out=Path(tmp), tag=str(repeat)
                    )
                )
    rows: list[dict[str, Any]] = []
    base = statistics.median(r["s_per_step"] for r in runs[0])
    for k in SETTINGS:
        med = {m: statistics.median(r[m] for r in runs[k]) for m in runs[k][0]}
        rows.append(
            {
                "max_async": k,
                "s/step (median)": med["s_per_step"],
                "vs max_async=0": med["s_per_step"] / base,
                "trainer idle": med["trainer_idle"],
                "policy wait s": med["policy_wait_s"],
                "staleness": med["staleness"],
                "reward last 5": med["reward_last5"],
            }
        )
    print_table("RL step time by max_async (default run config, medians)", rows)
    summary = {
        f"max_async_{r['max_async']}": {
            "s_per_step": r["s/step (median)"],
            "speedup_vs_sync": 1 / r["vs max_async=0"],
            "trainer_idle_fraction": r["trainer idle"],
        }
        for r in rows
    }
    config = {
        "run_config": "configs/default.toml",
        "steps": args.steps,
        "warmup_steps": args.warmup,
        "repeats": args.repeats,
        "skipped_first_rl_steps": SKIP_FIRST,
    }
    path = write_result("async", config=config, results=rows, summary=summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
