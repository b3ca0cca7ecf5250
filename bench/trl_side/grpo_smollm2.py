"""TRL's `GRPOTrainer` on a real model folder and a Tidal task: the TRL side of the SmolLM2 benches.

Runs in the throwaway venv `bench/rl_step.py` makes (trl, peft, torch==2.13.0,
reasoning-gym), importing nothing from Tidal. The problems come from `--problems`, a JSON
file Tidal's side writes from its own task (`bench/smollm2_trl.py`): the reasoning-gym
dataset and options, the training problems in Tidal's draw order (trained in that order:
no shuffling) and the held-out ones. A prompt is the question as one user message, after
`--system-prompt` when given, rendered by the folder's chat template. The reward is
Tidal's `reasoning_gym` verifier reimplemented: the first group of `--extract`'s first
match, scored by the dataset's own `score_answer` (0 without a match).

Settings: `--prompts` x `--group` completions per step, `--max-new` new tokens,
temperature 1, lr `--lr` constant or cosine to `--min-lr-ratio` of it over the steps,
clip 0.2/`--clip-high`, no KL, token-mean loss (TRL's "dapo"), group-std-normalized
advantages, grad-norm clip 1, one gradient step per generation batch; full weights or
LoRA (`--lora-rank`, peft on q/k/v/o); TRL's CPU path (`use_cpu`), bf16 autocast or fp32.

`--eval-every N` (and `--eval-at-start`) adds held-out greedy evaluation inside the run:
greedy replies to every held-out problem in one batch, scored like the reward; an "eval"
event carries its start and end times, so the caller can count it in the wall time or not.

`python grpo_smollm2.py --model DIR --problems P.json --out events.jsonl --steps 3`
"""

from __future__ import annotations

import argparse
import json
import re
import time
from typing import Any

STARTED = time.time()

import reasoning_gym  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOTrainer  # noqa: E402
from trl_common import Events, grpo_config  # noqa: E402

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]  # Tidal's LoRA default


class Problems:
    """The problems file: messages to prompt with, and the verifier of a reply."""

    def __init__(self, path: str, *, system_prompt: str | None, extract: str) -> None:
        with open(path) as file:
            spec = json.load(file)
        self.train: list[dict[str, Any]] = spec["train"]
        self.eval: list[dict[str, Any]] = spec["eval"]
        self.system_prompt = system_prompt
        self.extract = re.compile(extract)
        options = spec["options"]
        self.scorer = reasoning_gym.create_dataset(spec["dataset"], seed=0, size=1, **options)

    def messages(self, entry: dict[str, Any]) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": entry["question"]}]

    def score(self, entry: dict[str, Any], reply: str) -> float:
        found = self.extract.search(reply)
        if found is None:
            return 0.0
        return float(self.scorer.score_answer(found.group(1).strip(), entry))


class GreedyEval(TrainerCallback):
    """Held-out greedy accuracy at the start and every `every` steps (and after the last)."""

    def __init__(
        self,
        problems: Problems,
        tokenizer: Any,
        events: Events,
        *,
        every: int,
        at_start: bool,
        max_new: int,
        bf16: bool,
    ) -> None:
        self.problems, self.tokenizer, self.events = problems, tokenizer, events
        self.every, self.at_start, self.max_new, self.bf16 = every, at_start, max_new, bf16
        self.texts = [
            tokenizer.apply_chat_template(
                problems.messages(e), add_generation_prompt=True, tokenize=False
            )
            for e in problems.eval
        ]

    def run(self, model: Any, step: int) -> None:
        started = time.time()
        was_training = model.training
        model.eval()
        batch = self.tokenizer(
            self.texts,
            return_tensors="pt",
            padding=True,
            padding_side="left",
            add_special_tokens=False,
        )
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            out = model.generate(
                **batch, do_sample=False, max_new_tokens=self.max_new,
                pad_token_id=self.tokenizer.pad_token_id,
            )  # fmt: skip  # (N, prompt + new)
        replies = self.tokenizer.batch_decode(
            out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True
        )
        model.train(was_training)
        scored = zip(self.problems.eval, replies, strict=True)
        scores = [self.problems.score(entry, reply) for entry, reply in scored]
        self.events.write(
            event="eval",
            step=step,
            t0=started,
            t1=time.time(),
            greedy_accuracy=sum(s >= 1.0 for s in scores) / len(scores),
            greedy_reward=sum(scores) / len(scores),
            replies=replies,
        )

    def on_train_begin(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
        if self.at_start:
            self.run(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
        step = state.global_step
        if self.every and (step % self.every == 0 or step == state.max_steps):
            self.run(model, step)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--problems", required=True, help="the JSON file of smollm2_trl.py")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt")
    parser.add_argument("--max-new", type=int, default=48)
    parser.add_argument("--lr", type=float, default=3e-6)
    parser.add_argument(
        "--min-lr-ratio",
        type=float,
        default=None,
        help="cosine decay to lr x this over the steps (unset: constant)",
    )
    parser.add_argument("--adam-beta2", type=float, default=0.999, help="TRL's default 0.999")
    parser.add_argument("--clip-high", type=float, default=0.2)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument(
        "--gradient-checkpointing", choices=("on", "off"), default="on", help="TRL's default: on"
    )
    parser.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tune")
    parser.add_argument("--lora-alpha", type=float, default=16.0)
    parser.add_argument("--system-prompt", default=None)
    parser.add_argument("--extract", default=r"(-?[0-9]+)\D*$", help="the answer's regex")
    parser.add_argument("--eval-every", type=int, default=0, help="0: no evaluation")
    parser.add_argument("--eval-at-start", action="store_true")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="/tmp/trl-grpo-smollm2")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    batch = args.prompts * args.group
    events = Events(args.out, batch=batch)
    events.write(event="start", t=STARTED, threads=torch.get_num_threads())
    problems = Problems(args.problems, system_prompt=args.system_prompt, extract=args.extract)
    train = problems.train[: args.prompts * args.steps]

    def reward(completions: list, index: list[int], **_: object) -> list[float]:
        replies = [c[-1]["content"] for c in completions]
        return [problems.score(train[i], r) for i, r in zip(index, replies, strict=True)]

    schedule: dict[str, Any] = {"lr_scheduler_type": "constant"}
    if args.min_lr_ratio is not None:
        schedule = {
            "lr_scheduler_type": "cosine_with_min_lr",
            "lr_scheduler_kwargs": {"min_lr_rate": args.min_lr_ratio},
        }
    config = grpo_config(
        workdir=args.workdir,
        steps=args.steps,
        seed=args.seed,
        per_device_train_batch_size=batch,
        num_generations=args.group,
        max_completion_length=args.max_new,
        learning_rate=args.lr,
        warmup_steps=0,
        adam_beta2=args.adam_beta2,
        epsilon_high=args.clip_high,
        max_grad_norm=args.max_grad_norm,
        gradient_checkpointing=args.gradient_checkpointing == "on",
        shuffle_dataset=False,
        bf16=args.precision == "bf16",
        **schedule,
    )
    lora = None
    if args.lora_rank:
        lora = LoraConfig(
            r=args.lora_rank,
            lora_alpha=args.lora_alpha,
            lora_dropout=0.0,
            target_modules=LORA_TARGETS,
            task_type="CAUSAL_LM",
        )
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    dataset = Dataset.from_dict(
        {
            "prompt": [problems.messages(e) for e in train],
            "index": list(range(len(train))),
        }
    )
    callbacks: list[TrainerCallback] = [events]
    if args.eval_every or args.eval_at_start:
        callbacks.append(
            GreedyEval(
                problems,
                tokenizer,
                events,
                every=args.eval_every,
                at_start=args.eval_at_start,
                max_new=args.max_new,
                bf16=args.precision == "bf16",
            )
        )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=lora,
    )
    events.write(event="built", t=time.time())
    trainer.train()
    events.write(event="end", t=time.time())


if __name__ == "__main__":
    main()
