"""Off-policy corrections under a real mismatch and high staleness: reward and KLs by seed.

Runs the embedded default stack with bfloat16 inference against the float32 trainer and
`max_async = 4`, once per correction and seed, and reads each run's metrics.jsonl: the
final reward (mean of the last 10 RL steps) per seed, its mean and spread over seeds, the
mean `mismatch_kl` (staleness 0) and `stale_kl/1`, `stale_kl/2`, and the share of tokens
each correction touched. Also plots reward and KLs over steps (seed means).
Finished runs under `--runs-dir` are read, not run again.

    python bench/off_policy.py [--seeds 3] [--runs-dir /tmp/off-policy-runs]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import RESULTS_DIR, ROOT, print_table, write_result

from tidal.orchestrator.records.run_log import run_log_records

CORRECTIONS: dict[str, list[str]] = {
    "none": [],
    "tis": ["--trainer.loss.tis-cap", "2.0"],
    "decoupled-tis": ["--trainer.loss.objective", "decoupled", "--trainer.loss.tis-cap", "2.0"],
    "mis-token": [
        *("--trainer.loss.trust-region.ratio-low", "0.5"),
        *("--trainer.loss.trust-region.ratio-high", "2.0"),
    ],
    "geo": [
        *("--trainer.loss.trust-region.geo-ratio-low", "0.8"),
        *("--trainer.loss.trust-region.geo-ratio-high", "1.25"),
    ],
}
MISMATCH = ["--inference.dtype", "bfloat16", "--orchestrator.staleness.max-async", "4"]
TOUCHED = ("correction/tis", "correction/mis_token", "correction/geo")


def run_once(name: str, seed: int, out: Path) -> list[dict[str, Any]]:
    """The RL steps of one run (run now unless `out` holds it finished)."""
    run = f"{name}-s{seed}"
    if not (out / run / "summary.json").exists():
        command = [
            sys.executable, "-m", "tidal.cli", "rl", "@", str(ROOT / "configs" / "default.toml"),
            "--run.output-dir", str(out), "--run.name", run, "--run.seed", str(seed),
            "--orchestrator.report.table-every", "0", *MISMATCH, *CORRECTIONS[name],
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            raise RuntimeError(f"{run} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return [r for r in run_log_records(out / run / "metrics.jsonl") if r["phase"] == "rl"]


def mean_of(steps: list[dict[str, Any]], key: str, empty: float = 0.0) -> float:
    values = [s[key] for s in steps if s.get(key) is not None]
    return statistics.mean(values) if values else empty


def plot(runs: dict[str, list[list[dict[str, Any]]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (reward, kl) = plt.subplots(1, 2, figsize=(11, 3.8), dpi=100)
    for name, seeds in runs.items():
        steps = [s["step"] for s in seeds[0]]
        by_step = list(zip(*seeds, strict=False))
        reward.plot(steps[: len(by_step)], [mean_of(list(s), "reward_mean") for s in by_step])
        reward.lines[-1].set_label(name)
        if name == "none":
            for key in ("train/mismatch_kl", "train/stale_kl/1", "train/stale_kl/4+"):
                kls = [mean_of(list(s), key, empty=float("nan")) for s in by_step]  # gap: no tokens
                kl.plot(steps[: len(by_step)], kls, marker=".", label=key)
    reward.set_title("reward (mean over seeds)")
    kl.set_title('KL(behaviour ‖ trainer), run "none"')
    kl.set_yscale("symlog", linthresh=1e-4)
    for ax in (reward, kl):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/off-policy-runs"))
    args = parser.parse_args()
    runs = {n: [run_once(n, s, args.runs_dir) for s in range(args.seeds)] for n in CORRECTIONS}
    rows: list[dict[str, Any]] = []
    for name, seeds in runs.items():
        finals = [mean_of(steps[-10:], "reward_mean") for steps in seeds]
        every = [step for steps in seeds for step in steps]
        rows.append(
            {
                "correction": name,
                "final reward": statistics.mean(finals),
                "sd over seeds": statistics.stdev(finals) if len(finals) > 1 else 0.0,
                "per seed": ", ".join(f"{f:.3f}" for f in finals),
                "mismatch_kl": mean_of(every, "train/mismatch_kl"),
                "stale_kl/1": mean_of(every, "train/stale_kl/1"),
                "stale_kl/2": mean_of(every, "train/stale_kl/2"),
                "touched": sum(mean_of(every, f"train/{k}") for k in TOUCHED),
                "clip_frac": mean_of(every, "train/clip_frac"),
            }
        )
    print_table("Off-policy corrections: bf16 inference, fp32 trainer, max_async 4", rows)
    plot(runs, RESULTS_DIR / "off_policy.png")
    config = {"run_config": "configs/default.toml", "overrides": MISMATCH, "seeds": args.seeds}
    summary = {r["correction"]: [r["final reward"], r["sd over seeds"]] for r in rows}
    path = write_result("off_policy", config=config, results=rows, summary=summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
