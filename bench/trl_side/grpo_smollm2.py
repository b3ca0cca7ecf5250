"""TRL's `GRPOTrainer` on a real model folder: the other side of `rl_step.py --scenarios smollm2`.

Runs in the throwaway venv `bench/rl_step.py` makes (trl + torch==2.13.0 + reasoning-gym),
importing nothing from Tidal. The task is Tidal's `reasoning_gym` task as that scenario
configures it: `basic_arithmetic` with the given options, the question as one user
message rendered by the folder's chat template, the completion's last number scored by
the dataset's own `score_answer` (0 without a number). Settings: 8 prompts x 8
completions per step, `--max-new` new tokens, lr 3e-6 constant, clip 0.2/0.2, no KL,
token-mean loss (TRL's default "dapo"), temperature 1, one gradient step per
generation batch; TRL's CPU path as its docs give it (`use_cpu`), its default gradient
checkpointing and fused AdamW, bf16 or fp32 (`--precision`).

Writes the same JSON-lines events as `grpo_reversal.py` ("start", "built", "step",
"reward", "end") to `--out`.

`python grpo_smollm2.py --model DIR --out events.jsonl --steps 3 [--precision bf16]`
"""

from __future__ import annotations

import argparse
import json
import re
import time

STARTED = time.time()

import reasoning_gym  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

LAST_NUMBER = re.compile(r"(-?[0-9]+)\D*$")  # Tidal's `task.extract` in the scenario
PROMPTS, GROUP = 8, 8


class Events(TrainerCallback):
    def __init__(self, path: str, max_new: int) -> None:
        self.file = open(path, "a")  # noqa: SIM115
        self.max_new = max_new

    def write(self, **event: object) -> None:
        self.file.write(json.dumps(event) + "\n")
        self.file.flush()

    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        if logs and "reward" in logs:
            self.write(
                event="reward",
                step=state.global_step,
                reward=float(logs["reward"]),
                completion_tokens=float(logs.get("completions/mean_length", 0.0)) * 64,
            )

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.write(event="step", step=state.global_step, t=time.time())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--max-new", type=int, default=48)
    parser.add_argument("--lr", type=float, default=3e-6)
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--options", default="{}", help="basic_arithmetic options (JSON)")
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="/tmp/trl-grpo-smollm2")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    events = Events(args.out, args.max_new)
    events.write(event="start", t=STARTED, threads=torch.get_num_threads())
    data = reasoning_gym.create_dataset(
        "basic_arithmetic",
        seed=args.seed,
        size=PROMPTS * (args.steps + 2),
        **json.loads(args.options),
    )
    entries = {str(e["question"]): e for e in data}

    def reward(prompts: list, completions: list, **_: object) -> list[float]:
        scores = []
        for prompt, completion in zip(prompts, completions, strict=True):
            entry = entries[prompt[-1]["content"]]
            found = LAST_NUMBER.search(completion[-1]["content"])
            scores.append(0.0 if found is None else float(data.score_answer(found.group(1), entry)))
        return scores

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = GRPOConfig(
        output_dir=args.workdir,
        max_steps=args.steps,
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
        max_completion_length=args.max_new,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        epsilon=0.2,
        epsilon_high=0.2,
        beta=0.0,
        temperature=1.0,
        num_iterations=1,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=args.precision == "bf16",
        seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    prompts = [[{"role": "user", "content": q}] for q in entries]
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        callbacks=[events],
    )
    events.write(event="built", t=time.time())
    trainer.train()
    events.write(event="end", t=time.time())


if __name__ == "__main__":
    main()
