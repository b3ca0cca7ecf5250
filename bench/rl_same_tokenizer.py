"""The same-tokenizer scenario of `bench/rl_step.py`: reward reached per wall-second.

Both systems train the same model on the same ids with the same reward, so what differs
is the system: how fast it turns wall-clock time into reward.

- One Hugging Face folder per seed, written by TRL's side
  (`grpo_reversal.py --save-model`): TRL's 12-token character tokenizer
  (`tokenizer.json`, `tokenizer_config.json`), `config.json`, `generation_config.json` and
  the Qwen2 shape's weights initialized from the seed. TRL trains it with `--model DIR`,
  Tidal with `--trainer.model.path DIR` (its real HF folder loader and HF tokenizer:
  `run.tokenizer = "auto"` makes the folder's tokenizer the run's). Same initial weights,
  same ids.
- Same prompt ids: the folder has no chat template, so Tidal's orchestrator renders plain
  prompts (`tokenizer.encode(prompt)`, the tokenizer's post-processor adding `<s>`) and
  TRL tokenizes a non-conversational prompt with `processing_class(text=prompts)`, the
  same post-processor. `check_same_ids` asserts it before any run through Tidal's own
  `PromptRenderer` and TRL's tokenizer call, and that both decode a completion to the
  same text (the tokenizer's `Fuse` decoder: "cba", not "c b a").
- Same reward and scale: Tidal's reversal verifier (positional partial credit over
  max(len(prediction), len(target)), exact = 1.0) and TRL's reward function, the same
  function reimplemented on the TRL side, both on the decoded completion in [0, 1].
- Same algorithm: 8 x 8, <= 8 new tokens, temperature 1, lr 3e-4 linearly decayed to 0
  over the run, clip 0.2/0.2, no KL, token-mean loss (Tidal `loss.norm = "token"`, TRL's
  default `dapo`), group-std advantages (both defaults; population std in Tidal, sample
  std in TRL: a constant 0.94 on TRL's advantages), grad-norm clip 1.0, AdamW with
  betas (0.9, 0.95) and no weight decay (Tidal's default; TRL is given `adam_beta2 =
  0.95`, its default being 0.999). Tidal runs at its default config otherwise
  (`max_async = 1`), and at `max_async = 0`.
- Fixed seeds: each repeat's seed (0, 1, ... from `--same-tokenizer-first-seed`) sets
  the weights, TRL's sampling and prompts, and Tidal's `run.seed`; the prompts come from
  the same distribution (3-5 letters of "abcdefgh") in each system's own order. The
  variants run interleaved per seed.

The measure, `reward_per_s`: (mean reward of the last W steps - mean reward of the
first W steps) / wall seconds from launch to the end of the last step. Both systems run
the same number of steps under the same schedule (lr decayed to 0 at the last step), so
each run ends at the same point of its schedule and the gain is what that run's whole
wall time bought; a user waits from launch, so start-up counts (the `_since_first_step`
variant leaves it out). W-step means smooth the per-step noise of 64 samples (per-step
std ~0.03 at these rewards). Rejected: the time to cross a reward threshold (on a slowly
rising noisy curve the crossing is decided by noise, and a run that never crosses has
no value) and the area under reward(t) (it rewards the level held, not what was
learned). The ratio factors into `gain_vs_trl` (learning per step) x TRL's wall seconds /
Tidal's, both in the summary, and the raw curves (step, seconds since launch, reward)
are in the JSON so a reader can check any other reading.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from common import ROOT

from tidal.orchestrator.records.run_log import run_log_records

HERE = Path(__file__).resolve().parent
TRL_SCRIPT = HERE / "trl_side" / "grpo_reversal.py"
ADAM_BETA2 = "0.95"  # Tidal's default trainer.optim.betas[1]; TRL's own default is 0.999
PROBE_PROMPT = "abcdefgh>"
PROBE_COMPLETION = [10, 9, 8, 2]  # "hgf" then EOS

VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("trl", {"kind": "trl", "threads": 0}),
    ("trl 1 thread", {"kind": "trl", "threads": 1}),
    ("tidal max_async 0", {"kind": "tidal", "max_async": 0}),
    ("tidal max_async 1", {"kind": "tidal", "max_async": 1}),
]


def model_folder(python: Path, shape: dict[str, int], *, seed: int, out: Path) -> Path:
    """The seed's HF folder (tokenizer + seeded Qwen2 weights), written by TRL's side."""
    folder = out / f"model-seed{seed}"
    subprocess.run(
        [
            str(python), str(TRL_SCRIPT), "--save-model", str(folder), "--seed", str(seed),
            "--dim", str(shape["dim"]), "--layers", str(shape["n_layers"]),
            "--heads", str(shape["n_heads"]), "--ffn", str(shape["ffn_dim"]),
        ],
        check=True, capture_output=True,
    )  # fmt: skip
    return folder


def check_same_ids(python: Path, folder: Path) -> dict[str, Any]:
    """Prompt ids and decoded text of both sides on the folder; raises where they differ."""
    from tidal.orchestrator.config import ChatConfig
    from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
    from tidal.orchestrator.tasks.base import Problem
    from tidal.text.loader import load_tokenizer

    trl_side = (
        "import json, sys; from transformers import AutoTokenizer; "
        "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "print(json.dumps({'prompt_ids': t(text=[sys.argv[2]])['input_ids'][0], "
        "'completion': t.batch_decode([json.loads(sys.argv[3])], skip_special_tokens=True)[0]}))"
    )
    done = subprocess.run(
        [str(python), "-c", trl_side, str(folder), PROBE_PROMPT, json.dumps(PROBE_COMPLETION)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    trl = json.loads(done.stdout)
    tokenizer = load_tokenizer(str(folder))
    renderer = PromptRenderer.from_config(tokenizer, ChatConfig())
    tidal = {
        "prompt_ids": renderer.prompt_ids(Problem(prompt=PROBE_PROMPT, reference="")),
        "completion": tokenizer.decode(PROBE_COMPLETION),
    }
    if renderer.template or tidal != trl:
        raise RuntimeError(f"the two sides tokenize differently: tidal {tidal}, trl {trl}")
    return {"vocab_size": tokenizer.vocab_size, "probe_prompt": PROBE_PROMPT, **tidal}


def _log_time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def run_tidal(command: list[str], *, out: Path, name: str, step_line: Any) -> dict[str, Any]:
    """One `tidal rl` run; its curve from the step log lines' times and metrics.jsonl."""
    load = os.getloadavg()[0]
    launched = time.time()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    output = done.stdout + done.stderr
    ends = {
        int(m.group(2)): (_log_time(m.group(1)) - launched, float(m.group(3)))
        for m in map(step_line.match, output.splitlines())
        if m
    }
    records = run_log_records(out / name / "metrics.jsonl")
    rl = [r for r in records if r["phase"] == "rl"]
    first_end, first_seconds = ends[rl[0]["step"]]
    return {
        "curve": [
            [r["step"], round(ends[r["step"]][0], 3), round(r["reward_mean"], 4)] for r in rl
        ],
        "first_step_start_s": round(first_end - first_seconds, 3),
        "s_per_step": statistics.median(r["seconds"] for r in rl[2:]),
        "plain_prompts": "prompts as plain text" in output,  # the orchestrator's log line
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def run_trl(python: Path, shape: dict[str, int], *, folder: Path, seed: int, steps: int,
            threads: int, out: Path, name: str) -> dict[str, Any]:  # fmt: skip
    """One GRPOTrainer run on the folder; its curve from the script's event lines."""
    events_path = out / f"{name}.jsonl"
    command = [
        str(python), str(TRL_SCRIPT), "--out", str(events_path), "--steps", str(steps),
        "--dim", str(shape["dim"]), "--layers", str(shape["n_layers"]),
        "--heads", str(shape["n_heads"]), "--ffn", str(shape["ffn_dim"]),
        "--workdir", str(out / f"{name}-work"), "--threads", str(threads),
        "--model", str(folder), "--seed", str(seed), "--adam-beta2", ADAM_BETA2,
    ]  # fmt: skip
    load = os.getloadavg()[0]
    launched = time.time()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    built = next(e["t"] for e in events if e["event"] == "built")
    ends = {e["step"]: e["t"] - launched for e in events if e["event"] == "step"}
    rewards = {e["step"]: e["reward"] for e in events if e["event"] == "reward"}
    times = [ends[s] for s in sorted(ends)]
    return {
        "curve": [[s, round(ends[s], 3), round(rewards[s], 4)] for s in sorted(rewards)],
        "first_step_start_s": round(built - launched, 3),
        "s_per_step": statistics.median(b - a for a, b in itertools.pairwise(times[1:])),
        "threads": next(e["threads"] for e in events if e["event"] == "start"),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def reward_per_second(result: dict[str, Any], window: int) -> dict[str, float]:
    """The module docstring's measure, from one run's curve."""
    rewards = [reward for _, _, reward in result["curve"]]
    last_end = result["curve"][-1][1]
    initial = statistics.fmean(rewards[:window])
    final = statistics.fmean(rewards[-window:])
    gain = final - initial
    return {
        "reward_initial": round(initial, 4),
        "reward_final": round(final, 4),
        "reward_gain": round(gain, 4),
        "wall_s": round(last_end, 2),
        "reward_per_s": gain / last_end,
        "reward_per_s_since_first_step": gain / (last_end - result["first_step_start_s"]),
    }


def run_scenario(python: Path, shape: dict[str, int], *, steps: int, seeds: range, window: int,
                 out: Path, tidal_command: Callable[..., list[str]],
                 step_line: Any) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """Every variant per seed, interleaved; variant -> one result per seed.

    `tidal_command` and `step_line` are `bench/rl_step.py`'s: the same `tidal rl` command
    as the step-speed runs, plus the model folder and the seed."""
    same: dict[str, list[dict[str, Any]]] = {}
    for seed in seeds:
        folder = model_folder(python, shape, seed=seed, out=out)
        ids = check_same_ids(python, folder)
        for name, how in VARIANTS:
            tag = f"same-{name.replace(' ', '_')}-{seed}"
            if how["kind"] == "trl":
                result = run_trl(
                    python, shape, folder=folder, seed=seed, steps=steps,
                    threads=how["threads"], out=out, name=tag,
                )  # fmt: skip
            else:
                command = tidal_command(
                    shape, max_async=how["max_async"], steps=steps, out=out, name=tag,
                    extra=["--trainer.model.path", str(folder), "--run.seed", str(seed)],
                )  # fmt: skip
                result = run_tidal(command, out=out, name=tag, step_line=step_line)
            result.update(seed=seed, ids=ids)
            result.update(reward_per_second(result, window))
            print(
                f"{tag}: reward {result['reward_initial']:.3f} -> {result['reward_final']:.3f} "
                f"in {result['wall_s']:.1f} s: {result['reward_per_s']:.5f} reward/s",
                flush=True,
            )
            print(f"{tag} json: {json.dumps(result)}", flush=True)  # kept if a later run fails
            same.setdefault(name, []).append(result)
    return same


def summarize(
    by_variant: dict[str, list[dict[str, Any]]],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (medians over repeats) and the summary keys of the same-tokenizer scenario."""

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in by_variant[name])

    rows = [
        {
            "scenario": "same tokenizer",
            "variant": name,
            "reward/s (median)": median(name, "reward_per_s"),
            "vs TRL": median(name, "reward_per_s") / median("trl", "reward_per_s"),
            "vs TRL 1 thread": median(name, "reward_per_s")
            / median("trl 1 thread", "reward_per_s"),
            "reward first W": median(name, "reward_initial"),
            "reward last W": median(name, "reward_final"),
            "wall s": median(name, "wall_s"),
            "s/step": median(name, "s_per_step"),
            "load": statistics.median(r["load_before"] for r in results),
        }
        for name, results in by_variant.items()
    ]
    default, trl, trl1 = "tidal max_async 1", "trl", "trl 1 thread"
    summary = {
        "reward_per_second_vs_trl": median(default, "reward_per_s") / median(trl, "reward_per_s"),
        "reward_per_second_vs_trl_1thread": median(default, "reward_per_s")
        / median(trl1, "reward_per_s"),
        "reward_per_second_vs_trl_since_first_step": median(
            default, "reward_per_s_since_first_step"
        )
        / median(trl, "reward_per_s_since_first_step"),
        "same_tokenizer_gain_vs_trl": median(default, "reward_gain") / median(trl, "reward_gain"),
        "same_tokenizer_wall_speedup_vs_trl": median(trl, "wall_s") / median(default, "wall_s"),
    }
    summary = {key: round(value, 3) for key, value in summary.items()}
    flat = [name for name in by_variant if median(name, "reward_gain") <= 0]
    if flat:  # a ratio of gains that are not gains means nothing; say so, do not print one
        print(f"same tokenizer: no reward gain in {flat}: raise --same-tokenizer-steps")
        if median(trl, "reward_gain") <= 0:
            summary = dict.fromkeys(summary)
        summary["same_tokenizer_no_gain"] = flat
    every = [r for results in by_variant.values() for r in results]
    summary["same_tokenizer_load_avg"] = [
        min(r["load_before"] for r in every),
        max(r["load_after"] for r in every),
    ]
    return rows, summary


def print_curves(by_variant: dict[str, list[dict[str, Any]]], points: int = 8) -> None:
    """The raw curves, thinned to `points` steps per run: `step@seconds:reward`."""
    for name, results in by_variant.items():
        for repeat, result in enumerate(results):
            curve = result["curve"]
            picks = sorted({round(i * (len(curve) - 1) / (points - 1)) for i in range(points)})
            text = "  ".join(f"{curve[i][0]}@{curve[i][1]:.0f}s:{curve[i][2]:.3f}" for i in picks)
            print(f"{name} #{repeat}: {text}", file=sys.stdout, flush=True)
