"""Tool latency: what a slow tool costs an RL step of 64 tool-calling episodes.

The real stack (`tidal rl @ configs/lookup.toml`: the default tiny byte-level model,
native inference, the orchestrator's episode loop, the trainer), 8 prompts x 8 episodes
a step, on the lookup task with its tool wrapped to wait `--latency-ms` on every other
step (`bench/slow_lookup_task.py`, a plug-in task): one run holds both arms, steps
apart, so load on a shared machine hits them alike. Once, first: `configs/lookup.toml`'s
supervised warm-up on the tool-using demonstrations, so the model does call the tool;
every measured run starts from its weights (`--model` reuses a warmed folder).
Measured runs, RL only, at max_async 0 and 1, interleaved, `--repeats` times; per step
from metrics.jsonl (the first `SKIP` RL steps left out):
- rollout: `generate_seconds`, the step's 64 episodes from the first Generate to the
  last verified (at max_async 0 nothing else runs meanwhile: the strict figure);
- step: `seconds`, between step completions (at max_async 0, rollout + training);
- calls and turns per episode, parse failures, tool wait per episode: the tool ran.
Ratios: pooled medians slow / 0 ms, and "paired": the median over slow steps of the
step's figure / the mean of its two 0 ms neighbours' (robust to drift within a run).

    python bench/tool_latency.py [--repeats 4] [--steps 16] [--latency-ms 200]
                                 [--warmup-steps 200 | --model WARMED_FOLDER]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import ROOT, print_table, write_result

HERE = Path(__file__).resolve().parent
CONFIG = ROOT / "configs" / "lookup.toml"
SKIP = 2  # first RL steps left out: the pipeline fills, the engine warms up
SETTINGS = (0, 1)  # max_async
PROMPTS, GROUP = 8, 8  # 64 episodes a step
STEP_KEYS = ("step", "generate_seconds", "seconds", "samples", "tools/calls", "tools/seconds")
TASK_PATH = "slow_lookup_task:SlowLookupTask"


def tidal_rl(args: list[str], *, out: Path, name: str) -> list[dict[str, Any]]:
    """Run `tidal rl @ configs/lookup.toml ARGS` and return its metrics.jsonl rows."""
    command = [
        sys.executable, "-m", "tidal.cli", "rl", "@", str(CONFIG), *args,
        "--run.output-dir", str(out), "--run.name", name,
        "--orchestrator.report.table-every", "0",
    ]  # fmt: skip
    # the plug-in task is imported by the orchestrator (and its verifier workers)
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": path}
    )
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]


def warm_up(out: Path, *, steps: int) -> Path:
    """The model after `steps` supervised steps on the demonstrations (an HF folder)."""
    tidal_rl(
        ["--orchestrator.warmup-steps", str(steps), "--orchestrator.steps", "1"],
        out=out,
        name="warmup",
    )
    return out / "warmup" / "weights" / f"v{steps:06d}"


def task_overlay(path: Path, *, latency_s: float, block: int) -> Path:
    """The TOML that swaps the lookup task for the plug-in with the slow tool."""
    path.write_text(
        f'[orchestrator.task]\ntype = "import"\npath = "{TASK_PATH}"\n'
        f"options = {{ latency_s = {latency_s}, block = {block} }}\n"
    )
    return path


def run_steps(
    model: Path, overlay: Path, *, max_async: int, steps: int, out: Path, name: str
) -> list[dict[str, Any]]:
    """One run's RL step rows after the first `SKIP`."""
    args = [
        "@", str(overlay), "--trainer.model.path", str(model), "--run.tokenizer", "byte",
        "--orchestrator.warmup-steps", "0", "--orchestrator.steps", str(steps),
        "--orchestrator.staleness.max-async", str(max_async),
        "--orchestrator.prompts-per-step", str(PROMPTS),
        "--orchestrator.group-size", str(GROUP),
    ]  # fmt: skip
    rows = tidal_rl(args, out=out, name=name)
    return [r for r in rows if r["phase"] == "rl"][SKIP:]


def is_slow_step(row: dict[str, Any]) -> bool:
    """Even steps have the slow tool (`slow_lookup_task.is_slow` with block = prompts)."""
    return row["step"] % 2 == 0


def check_arms(rows: list[dict[str, Any]], latency_s: float) -> None:
    """Fail loudly unless the slow steps' episodes waited for their tools about
    `latency_s` longer than the fast steps' (so the parity assumption holds)."""

    def wait(slow: bool) -> float:
        return statistics.median(
            r["tools/seconds"] / r["tools/calls"]
            for r in rows
            if is_slow_step(r) == slow and r.get("tools/calls")
        )

    if wait(True) - wait(False) < 0.8 * latency_s:
        raise RuntimeError(
            f"slow steps waited {wait(True):.3f}s per call, fast ones {wait(False):.3f}s: "
            f"the slow tool is not on the even steps"
        )


def arm_figures(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Medians of the figures this benchmark reports, over one arm's step rows."""

    def med(key: str) -> float:
        return statistics.median(float(r.get(key) or 0.0) for r in rows)

    return {
        "rollout_s": med("generate_seconds"),
        "step_s": med("seconds"),
        "episodes": med("samples"),
        "calls_per_episode": med("tools/calls_per_episode"),
        "turns_per_episode": med("episode/turns_mean"),
        "parse_failures": med("tools/parse_failures"),
        "tool_wait_s_per_episode": statistics.median(
            float(r.get("tools/seconds") or 0.0) / r["samples"] for r in rows
        ),
    }


def paired_ratio(rows: list[dict[str, Any]], key: str) -> float:
    """Median over slow steps of the step's `key` / the mean of its fast neighbours'."""
    by_step = {r["step"]: r for r in rows}
    ratios = [
        r[key] / statistics.mean((by_step[r["step"] - 1][key], by_step[r["step"] + 1][key]))
        for r in rows
        if is_slow_step(r) and {r["step"] - 1, r["step"] + 1} <= by_step.keys()
    ]
    return statistics.median(ratios)


def summarize(
    runs: dict[int, list[list[dict[str, Any]]]], latency_s: float
) -> list[dict[str, Any]]:
    """Two rows per max_async (0 ms, slow): pooled medians and ratios to the 0 ms arm."""
    out: list[dict[str, Any]] = []
    for max_async, repeats in runs.items():
        rows = [r for run in repeats for r in run]
        check_arms(rows, latency_s)
        fast = arm_figures([r for r in rows if not is_slow_step(r)])
        slow = arm_figures([r for r in rows if is_slow_step(r)])
        paired = {
            key: statistics.median(paired_ratio(run, key) for run in repeats)
            for key in ("generate_seconds", "seconds")
        }
        arms = (("0 ms", fast, {}), (f"{latency_s * 1000:g} ms", slow, paired))
        for arm, m, ratios in arms:
            out.append(
                {
                    "max_async": max_async,
                    "tool latency": arm,
                    "rollout s": m["rollout_s"],
                    "rollout ratio": m["rollout_s"] / fast["rollout_s"],
                    "rollout ratio, paired": ratios.get("generate_seconds", 1.0),
                    "step s": m["step_s"],
                    "step ratio": m["step_s"] / fast["step_s"],
                    "step ratio, paired": ratios.get("seconds", 1.0),
                    "calls/episode": m["calls_per_episode"],
                    "turns/episode": m["turns_per_episode"],
                    "parse failures/step": m["parse_failures"],
                    "tool wait s/episode": m["tool_wait_s_per_episode"],
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--latency-ms", type=int, default=200)
    parser.add_argument("--warmup-steps", type=int, default=200)
    parser.add_argument("--model", type=Path, help="a warmed-up model folder: skip step 1")
    args = parser.parse_args()
    latency_s = args.latency_ms / 1000
    runs: dict[int, list[list[dict[str, Any]]]] = {k: [] for k in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="tidal-bench-tools-") as tmp:
        out = Path(tmp)
        model = args.model or warm_up(out, steps=args.warmup_steps)
        overlay = task_overlay(out / "task.toml", latency_s=latency_s, block=PROMPTS)
        for repeat in range(args.repeats):
            for k in SETTINGS:
                name = f"async{k}-{repeat}"
                runs[k].append(
                    run_steps(model, overlay, max_async=k, steps=args.steps, out=out, name=name)
                )
    rows = summarize(runs, latency_s)
    title = f"{PROMPTS * GROUP} tool episodes a step, {args.latency_ms} ms tool vs 0 ms (medians)"
    print_table(title, rows)
    summary = {
        "latency_ms": args.latency_ms,
        "episodes_per_step": PROMPTS * GROUP,
        **{
            f"max_async_{r['max_async']}": {
                "rollout_ratio": r["rollout ratio"],
                "rollout_ratio_paired": r["rollout ratio, paired"],
                "step_ratio": r["step ratio"],
                "step_ratio_paired": r["step ratio, paired"],
                "calls_per_episode": r["calls/episode"],
            }
            for r in rows
            if r["tool latency"] != "0 ms"
        },
    }
    config = {
        "run_config": "configs/lookup.toml",
        "task": TASK_PATH,
        "prompts_per_step": PROMPTS,
        "group_size": GROUP,
        "warmup_steps": 0 if args.model else args.warmup_steps,
        "rl_steps": args.steps,
        "skipped_first_rl_steps": SKIP,
        "repeats": args.repeats,
        "per_run_steps": {
            f"max_async_{k}": [[{key: r.get(key) for key in STEP_KEYS} for r in run] for run in v]
            for k, v in runs.items()
        },
    }
    path = write_result("tool_latency", config=config, results=rows, summary=summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
