"""One RL step, end to end, Tidal beside TRL's `GRPOTrainer` on the same task and machine.

Task: reverse 3-5 letters from "abcdefgh", 8 prompts x 8 completions, <= 8 new tokens,
Qwen2 shapes `small` (~4.2M) and `large` (~33.6M). Each variant is its own process,
interleaved per repeat: TRL (in the throwaway `bench/.trl-venv`, never a Tidal
dependency) at default threads and 1 thread; `tidal rl @ configs/default.toml` plus the
task, shape and optimizer flags, with max_async 0 and 1, and with prompt sharing off.
s/step is the median time between step ends after the first `SKIP`. The same-tokenizer
scenario (`rl_same_tokenizer.py`) measures reward reached per wall-second. Writes
rl_step.json, whose summary divides TRL's s/step by Tidal's default per shape. The
`smollm2` scenario (`rl_smollm2.py`, only when named) runs the real SmolLM2-135M folder
on both sides and writes rl_step_smollm2.json.

    python bench/rl_step.py [--scenarios speed,same-tokenizer] [--repeats 2] [--no-large]
    python bench/rl_step.py --scenarios smollm2 --model-folder DIR [--smollm2-steps 4]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import rl_same_tokenizer
import rl_smollm2
from common import RESULTS_DIR, ROOT, print_table, write_result

HERE = Path(__file__).resolve().parent
TRL_VENV = HERE / ".trl-venv"
TRL_SCRIPT = HERE / "trl_side" / "grpo_reversal.py"
SKIP = 2  # first steps left out: the pipeline fills, kernels warm up
SAME_STEPS = 60  # same-tokenizer steps: both rewards move off the ~0.06 floor well before
SAME_WINDOW = 10  # steps averaged at each end of a same-tokenizer curve
SHAPES = {
    "small": {"dim": 256, "n_layers": 4, "n_heads": 4, "ffn_dim": 1024},
    "large": {"dim": 512, "n_layers": 8, "n_heads": 8, "ffn_dim": 2048},
}
STEP_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*tidal\.orchestrator\.loop: step (\d+)/\d+ rl .* "
    r"([\d.]+)s [\d.]+ tok/s"
)


TRL_PACKAGES = {  # pip requirement → the module that shows it is installed
    "torch==2.13.0": "torch",
    "trl": "trl",
    "reasoning-gym": "reasoning_gym",
    "peft": "peft",
}


def trl_python() -> Path:
    """The throwaway venv's python: made once, then only what it lacks is installed.

    torch is pinned like the project's; peft is TRL's LoRA path (`peft_config`).
    """
    python = TRL_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
    missing = [
        package for package, module in TRL_PACKAGES.items()
        if subprocess.call([python, "-c", f"import {module}"], stderr=subprocess.DEVNULL) != 0
    ]  # fmt: skip
    if missing:
        subprocess.run([python, "-m", "pip", "install", "-q", *missing], check=True)
    return python


def tidal_command(shape: dict[str, int], *, max_async: int, steps: int, out: Path, name: str,
                  extra: list[str]) -> list[str]:  # fmt: skip
    return [
        sys.executable, "-m", "tidal.cli", "rl", "@", str(ROOT / "configs" / "default.toml"),
        "--run.output-dir", str(out), "--run.name", name,
        "--orchestrator.steps", str(steps), "--orchestrator.warmup-steps", "0",
        "--orchestrator.staleness.max-async", str(max_async),
        "--orchestrator.prompts-per-step", "8", "--orchestrator.group-size", "8",
        "--orchestrator.task.type", "reversal", "--orchestrator.task.alphabet", "abcdefgh",
        "--orchestrator.task.min-len", "3", "--orchestrator.task.max-len", "5",
        "--orchestrator.sampling.max-tokens", "8", "--orchestrator.sampling.temperature", "1",
        "--orchestrator.report.table-every", "0",
        "--trainer.model.family", "qwen2", "--trainer.model.dim", str(shape["dim"]),
        "--trainer.model.n-layers", str(shape["n_layers"]),
        "--trainer.model.n-heads", str(shape["n_heads"]),
        "--trainer.model.n-kv-heads", str(shape["n_heads"]),
        "--trainer.model.ffn-dim", str(shape["ffn_dim"]),
        "--trainer.model.tie-embeddings", "true",
        "--trainer.optim.lr", "3e-4", "--trainer.optim.schedule.decay", "linear",
        "--trainer.optim.schedule.decay-steps", str(steps),
        "--trainer.loss.clip-low", "0.2", "--trainer.loss.clip-high", "0.2",
        *extra,
    ]  # fmt: skip


def log_time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def run_tidal(shape: dict[str, int], *, max_async: int, steps: int, out: Path, name: str,
              extra: list[str]) -> dict[str, Any]:  # fmt: skip
    command = tidal_command(
        shape, max_async=max_async, steps=steps, out=out, name=name, extra=extra
    )
    load = os.getloadavg()[0]
    launched = time.time()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    exited = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    lines = [m for m in map(STEP_LINE.match, (done.stdout + done.stderr).splitlines()) if m]
    first, last = lines[0], lines[-1]
    rl = [
        r for r in map(json.loads, (out / name / "metrics.jsonl").read_text().splitlines())
        if r["phase"] == "rl"
    ]  # fmt: skip
    timed = rl[SKIP:]
    return {
        "s_per_step": statistics.median(r["seconds"] for r in timed),
        "completion_tokens_per_s": sum(r["generated_tokens"] for r in timed)
        / sum(r["seconds"] for r in timed),
        "startup_s": log_time(first.group(1)) - float(first.group(3)) - launched,
        "shutdown_s": exited - log_time(last.group(1)),
        "train_s_per_step": statistics.median(r["train_seconds"] for r in timed),
        "trainer_compute_s_per_step": statistics.median(r["train/seconds"] for r in timed),
        "generate_s_per_step": statistics.median(r["generate_seconds"] for r in timed),
        "rewards": [round(r["reward_mean"], 4) for r in rl],
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def run_trl(
    shape: dict[str, int], *, steps: int, out: Path, name: str, threads: int = 0
) -> dict[str, Any]:
    events_path = out / f"{name}.jsonl"
    command = [
        str(trl_python()), str(TRL_SCRIPT), "--out", str(events_path), "--steps", str(steps),
        "--dim", str(shape["dim"]), "--layers", str(shape["n_layers"]),
        "--heads", str(shape["n_heads"]), "--ffn", str(shape["ffn_dim"]),
        "--workdir", str(out / f"{name}-work"), "--threads", str(threads),
    ]  # fmt: skip
    load = os.getloadavg()[0]
    launched = time.time()
    done = subprocess.run(command, capture_output=True, text=True)
    exited = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    built = next(e["t"] for e in events if e["event"] == "built")
    ends = [e["t"] for e in events if e["event"] == "step"]
    durations = [b - a for a, b in zip([built, *ends], ends, strict=False)]  # step i's seconds
    rewards = {e["step"]: e for e in events if e["event"] == "reward"}
    timed = range(SKIP, len(durations))
    return {
        "s_per_step": statistics.median(durations[i] for i in timed),
        "completion_tokens_per_s": sum(rewards[i + 1]["completion_tokens"] for i in timed)
        / sum(durations[i] for i in timed),
        "startup_s": built - launched,
        "shutdown_s": exited - ends[-1],
        "rewards": [round(rewards[s]["reward"], 4) for s in sorted(rewards)],
        "threads": next(e["threads"] for e in events if e["event"] == "start"),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def variants(shape_name: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, how) of each variant, in the interleaving order."""
    out: list[tuple[str, dict[str, Any]]] = [
        ("trl", {"kind": "trl"}),
        ("trl 1 thread", {"kind": "trl", "threads": 1}),
        ("tidal max_async 0", {"kind": "tidal", "max_async": 0, "extra": []}),
        ("tidal max_async 1", {"kind": "tidal", "max_async": 1, "extra": []}),
        (  # the default's prompt sharing off: what training each prompt once buys
            "tidal max_async 1, prompts unshared",
            {
                "kind": "tidal",
                "max_async": 1,
                "extra": ["--orchestrator.packing.share-prompts", "false"],
            },
        ),
    ]
    if shape_name == "small":  # the thread plan: the trainer on both cores
        out.append(
            (
                "tidal max_async 1, trainer 2 threads",
                {"kind": "tidal", "max_async": 1, "extra": ["--trainer.num-threads", "2"]},
            )
        )
    return out


Runs = dict[str, dict[str, list[dict[str, Any]]]]  # shape → variant → one result per repeat


def summarize(runs: Runs) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The table's rows (medians over repeats) and the summary figures."""
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for shape_name, by_variant in runs.items():
        median = {
            name: statistics.median(r["s_per_step"] for r in results)
            for name, results in by_variant.items()
        }
        for name, results in by_variant.items():
            rows.append(
                {
                    "shape": shape_name,
                    "variant": name,
                    "s/step (median)": median[name],
                    "speedup vs TRL": median["trl"] / median[name],
                    "vs TRL 1 thread": median.get("trl 1 thread", math.nan) / median[name],
                    "completion tok/s": statistics.median(
                        r["completion_tokens_per_s"] for r in results
                    ),
                    "start-up s": statistics.median(r["startup_s"] for r in results),
                    "shutdown s": statistics.median(r["shutdown_s"] for r in results),
                    "load": statistics.median(r["load_before"] for r in results),
                }
            )
        default = median["tidal max_async 1"]  # the default config
        summary[f"step_speedup_vs_trl_{shape_name}"] = round(median["trl"] / default, 3)
        if "trl 1 thread" in median:
            summary[f"step_speedup_vs_trl_1thread_{shape_name}"] = round(
                median["trl 1 thread"] / default, 3
            )
    every = [r for by_variant in runs.values() for v in by_variant.values() for r in v]
    summary["load_avg_during_runs"] = [
        min(r["load_before"] for r in every),
        max(r["load_after"] for r in every),
    ]
    return rows, summary


SAME_TOKENIZER = "same_tokenizer"  # the scenario key of its per-run results
SPEED_TITLE = "RL step, Tidal beside TRL GRPOTrainer (medians of interleaved repeats)"
SAME_TITLE = "Same tokenizer: reward reached per wall-second (medians of interleaved repeats)"


def split_results(
    results: list[dict[str, Any]],
) -> tuple[Runs, dict[str, list[dict[str, Any]]]]:
    """Per-run results of a written file: step-speed runs and same-tokenizer runs."""
    runs: Runs = {}
    same: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if "repeat" not in r:
            continue  # a row of medians
        if r.get("scenario") == SAME_TOKENIZER:
            same.setdefault(r["variant"], []).append(r)
        else:
            runs.setdefault(r["shape"], {}).setdefault(r["variant"], []).append(r)
    return runs, same


def summarize_all(
    runs: Runs, same: dict[str, list[dict[str, Any]]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Step-speed rows, same-tokenizer rows and the summary of both (where present)."""
    rows, summary = summarize(runs) if runs else ([], {})
    same_rows: list[dict[str, Any]] = []
    if same:
        same_rows, same_summary = rl_same_tokenizer.summarize(same)
        summary.update(same_summary)
    return rows, same_rows, summary


def per_run(runs: Runs, same: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [
        {"shape": s, "variant": v, "repeat": i, **r}
        for s, by_variant in runs.items()
        for v, results in by_variant.items()
        for i, r in enumerate(results)
    ] + [
        {"scenario": SAME_TOKENIZER, "shape": "small", "variant": v, "repeat": i, **r}
        for v, results in same.items()
        for i, r in enumerate(results)
    ]


def resummarize(path: Path) -> None:
    """Recompute rows and summary of an existing result from its per-run results."""
    result = json.loads(path.read_text())
    runs, same = split_results(result["results"])
    rows, same_rows, summary = summarize_all(runs, same)
    result["results"] = per_run(runs, same) + rows + same_rows
    result["summary"] = summary
    path.write_text(json.dumps(result, indent=2) + "\n")
    print_table(SPEED_TITLE, rows)
    print_table(SAME_TITLE, same_rows)


def run_speed(args: argparse.Namespace, out: Path) -> Runs:
    """The step-speed scenario: both shapes, every variant, interleaved per repeat."""
    shapes = ["small"] if args.no_large else ["small", "large"]
    runs: Runs = {s: {} for s in shapes}
    for shape_name in shapes:
        shape = SHAPES[shape_name]
        steps = args.steps if shape_name == "small" else args.large_steps
        repeats = args.repeats if shape_name == "small" else args.large_repeats
        for repeat in range(repeats):
            for name, how in variants(shape_name):
                tag = f"{shape_name}-{name.replace(' ', '_').replace(',', '')}-{repeat}"
                if how["kind"] == "trl":
                    result = run_trl(
                        shape, steps=steps, out=out, name=tag, threads=how.get("threads", 0)
                    )
                else:
                    result = run_tidal(
                        shape, max_async=how["max_async"], steps=steps, out=out,
                        name=tag, extra=how["extra"],
                    )  # fmt: skip
                print(f"{tag}: {result['s_per_step']:.3f} s/step", flush=True)
                runs[shape_name].setdefault(name, []).append(result)
    return runs


def run_smollm2(args: argparse.Namespace) -> None:
    """The real-model scenario: its own result file (rl_step_smollm2.json)."""
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="tidal-bench-rl-smollm2-") as tmp:
        runs = rl_smollm2.run_scenario(
            trl_python(), args.model_folder, steps=args.smollm2_steps,
            skip=args.smollm2_skip, repeats=args.smollm2_repeats, out=Path(tmp),
            variants=args.smollm2_variants,
        )  # fmt: skip
    rows, summary = rl_smollm2.summarize(runs)
    print_table("RL step, SmolLM2-135M-Instruct, Tidal beside TRL GRPOTrainer", rows)
    path = write_result(
        "rl_step_smollm2",
        config={
            "model": str(args.model_folder),
            "task": "reasoning_gym basic_arithmetic " + json.dumps(rl_smollm2.OPTIONS),
            "prompts_x_completions": "8 x 8",
            "max_new_tokens": rl_smollm2.MAX_NEW,
            "lr": rl_smollm2.LR,
            "clip": [0.2, 0.2],
            "kl": 0,
            "steps": args.smollm2_steps,
            "skipped_first_steps": args.smollm2_skip,
            "repeats": args.smollm2_repeats,
            "variants": [name for name, _ in rl_smollm2.chosen_variants(args.smollm2_variants)],
            "trl": "GRPOTrainer, use_cpu, bf16=True, torch default threads (2)",
            "tidal": "tidal rl @ configs/default.toml + the task flags; precision auto (bf16)",
            "wall_s": round(time.time() - started, 1),
        },
        results=[
            {"variant": v, "repeat": i, **r}
            for v, results in runs.items()
            for i, r in enumerate(results)
        ]
        + rows,
        summary=summary,
    )
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenarios", default="speed,same-tokenizer",
        help="comma-separated: speed (both shapes' step times), same-tokenizer, smollm2 "
        "(the real model; only when named, on its own)",
    )  # fmt: skip
    parser.add_argument(
        "--model-folder", type=Path, default=Path("/work/smollm2-hf"),
        help="smollm2: the SmolLM2-135M-Instruct folder `tidal import-model` wrote",
    )  # fmt: skip
    parser.add_argument("--smollm2-steps", type=int, default=4, help="smollm2: RL steps per run")
    parser.add_argument(
        "--smollm2-skip", type=int, default=1, help="smollm2: first steps left out of s/step"
    )
    parser.add_argument("--smollm2-repeats", type=int, default=1)
    parser.add_argument(
        "--smollm2-variants", type=int, default=len(rl_smollm2.VARIANTS),
        help="smollm2: run the first N variants (TRL and Tidal's default always; 3 adds "
        "the zero-advantage skip off, 4 and 5 the 2-thread trainer and inference)",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12, help="RL steps per small run")
    parser.add_argument("--large-steps", type=int, default=6, help="RL steps per large run")
    parser.add_argument("--large-repeats", type=int, default=2)
    parser.add_argument("--no-large", action="store_true")
    parser.add_argument(
        "--same-tokenizer-steps", type=int, default=SAME_STEPS,
        help="RL steps per same-tokenizer run (the lr decays to 0 over them)",
    )  # fmt: skip
    parser.add_argument("--same-tokenizer-repeats", type=int, default=2)
    parser.add_argument(
        "--same-tokenizer-first-seed", type=int, default=0,
        help="seeds first..first+repeats-1 (more seeds for an earlier result: run the next "
        "ones into TIDAL_BENCH_DIR, add their per-run results, --resummarize)",
    )  # fmt: skip
    parser.add_argument(
        "--window", type=int, default=SAME_WINDOW,
        help="steps averaged for the initial and final reward of the same-tokenizer measure",
    )  # fmt: skip
    parser.add_argument(
        "--resummarize", type=Path, help="only recompute the rows and summary of this result"
    )
    args = parser.parse_args()
    if args.resummarize:
        resummarize(args.resummarize)
        return
    scenarios = set(args.scenarios.split(","))
    if "smollm2" in scenarios:
        if scenarios != {"smollm2"}:
            parser.error("--scenarios: smollm2 runs on its own")
        run_smollm2(args)
        return
    unknown = scenarios - {"speed", "same-tokenizer"}
    if unknown:
        parser.error(f"--scenarios: unknown {sorted(unknown)}; use speed and/or same-tokenizer")
    if 2 * args.window > args.same_tokenizer_steps:
        parser.error("--window: at most half of --same-tokenizer-steps")
    started = time.time()
    trl_python()
    runs: Runs = {}
    same: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="tidal-bench-rl-step-") as tmp:
        if "speed" in scenarios:
            runs = run_speed(args, Path(tmp))
        if "same-tokenizer" in scenarios:
            same = rl_same_tokenizer.run_scenario(
                trl_python(), SHAPES["small"], steps=args.same_tokenizer_steps,
                seeds=range(
                    args.same_tokenizer_first_seed,
                    args.same_tokenizer_first_seed + args.same_tokenizer_repeats,
                ),
                window=args.window, out=Path(tmp),
                tidal_command=tidal_command, step_line=STEP_LINE,
            )  # fmt: skip
    config: dict[str, Any] = {
        "task": "reversal of 3-5 letters from 'abcdefgh'",
        "prompts_x_completions": "8 x 8",
        "max_new_tokens": 8,
        "lr": "3e-4, linear decay, no warm-up",
        "clip": [0.2, 0.2],
        "kl": 0,
        "temperature": 1.0,
        "scenarios": sorted(scenarios),
        "tidal": "tidal rl @ configs/default.toml + the task/shape/optimizer flags",
        "trl": "trl GRPOTrainer in bench/.trl-venv, torch default threads",
        "wall_s": round(time.time() - started, 1),
    }
    if runs:
        config.update(
            shapes={s: SHAPES[s] for s in runs},
            steps={"small": args.steps, "large": args.large_steps},
            repeats={"small": args.repeats, "large": args.large_repeats},
            skipped_first_steps=SKIP,
        )
    if same:
        config["same_tokenizer"] = {
            "shape": SHAPES["small"],
            "steps": args.same_tokenizer_steps,
            "seeds": list(
                range(
                    args.same_tokenizer_first_seed,
                    args.same_tokenizer_first_seed + args.same_tokenizer_repeats,
                )
            ),
            "window": args.window,
            "tokenizer": "TRL's 12-token character tokenizer as an HF folder",
            "reward": "reversal partial credit in [0, 1], exact = 1 (both sides)",
            "adam_betas": [0.9, float(rl_same_tokenizer.ADAM_BETA2)],
        }
    previous = RESULTS_DIR / "rl_step.json"
    if len(scenarios) < 2 and previous.exists() and "TIDAL_BENCH_DIR" not in os.environ:
        kept = json.loads(previous.read_text())
        kept_runs, kept_same = split_results(kept["results"])
        runs, same = runs or kept_runs, same or kept_same
        config["kept_from"] = {"when": kept["when"], "config": kept["config"]}
    rows, same_rows, summary = summarize_all(runs, same)
    print_table(SPEED_TITLE, rows)
    print_table(SAME_TITLE, same_rows)
    if same:
        rl_same_tokenizer.print_curves(same)
    path = write_result(
        "rl_step", config=config, results=per_run(runs, same) + rows + same_rows, summary=summary
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
