"""TRL's `GRPOTrainer` on the small reversal task: the other side of `bench/rl_step.py`.

Runs in the throwaway venv `bench/rl_step.py` makes (trl + torch==2.13.0, never a Tidal
dependency), so it imports nothing from Tidal. It lives in a subfolder so `make bench`
does not take it for a benchmark of its own.

Settings (the issue's): a Qwen2 model built from a config (random init, tied
embeddings), a 12-token character tokenizer (pad, BOS, EOS, 'a'-'h', '>'), prompts of
3-5 letters + '>', 8 prompts x 8 completions per step, <= 8 new tokens, lr 3e-4 with
linear decay, no warm-up, clip 0.2/0.2, no KL (beta 0), temperature 1, one gradient step
per generation batch. Reward: the fraction of positions matching the reversed string
over max(len(prediction), len(target)), 1.0 for an exact answer (Tidal's reversal
reward, reimplemented here; the tokenizer's `Fuse` decoder makes a completion decode to
its characters with nothing between them, as Tidal's verifier reads it).

Writes `trl_common.Events`' JSON lines to `--out`.

Same-tokenizer mode (`bench/rl_step.py`'s reward-per-second comparison):
- `--save-model DIR` writes a complete Hugging Face folder and exits: the tokenizer
  (`tokenizer.json`, `tokenizer_config.json`), `config.json`, `generation_config.json`
  and `model.safetensors` of the Qwen2 shape initialized from `--seed`. Tidal runs from
  it (`--trainer.model.path DIR`: its real HF tokenizer and folder loaders).
- `--model DIR` trains that folder's model with that folder's tokenizer instead of
  building them here, so both systems start from the same weights and ids.
`--save-tokenizer DIR` writes the tokenizer alone.

`python grpo_reversal.py --out events.jsonl --steps 20 --dim 256 --layers 4 --heads 4
 --ffn 1024 [--threads N] [--seed S] [--adam-beta2 B] [--model DIR | --save-model DIR]`
"""

from __future__ import annotations

import argparse
import random
import time

STARTED = time.time()

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from trl import GRPOTrainer  # noqa: E402
from trl_common import Events, grpo_config  # noqa: E402

ALPHABET = "abcdefgh"
SPECIALS = ["<pad>", "<s>", "</s>"]


def char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *ALPHABET, ">"])}  # 12 tokens
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()  # "cba", not the word-level default "c b a"
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def reversal_reward(prediction: str, target: str) -> float:
    if prediction == target:
        return 1.0
    longest = max(len(prediction), len(target))
    return sum(p == t for p, t in zip(prediction, target, strict=False)) / longest


def rewards(prompts: list[str], completions: list[str], **_: object) -> list[float]:
    return [
        reversal_reward(c, p.rstrip(">")[::-1]) for p, c in zip(prompts, completions, strict=True)
    ]


def build_model(tokenizer: PreTrainedTokenizerFast, args: argparse.Namespace) -> Qwen2ForCausalLM:
    """The issue's Qwen2 shape, initialized from `args.seed`."""
    torch.manual_seed(args.seed)
    return Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=args.dim,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            num_key_value_heads=args.heads,
            intermediate_size=args.ffn,
            max_position_embeddings=128,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )


def save_model_folder(folder: str, args: argparse.Namespace) -> None:
    """Tokenizer, config, generation config and seeded weights as one HF folder."""
    tokenizer = char_tokenizer()
    model = build_model(tokenizer, args)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default="/tmp/trl-grpo-reversal")
    parser.add_argument("--save-tokenizer", default=None, help="write the tokenizer, exit")
    parser.add_argument("--save-model", default=None, help="write the model folder, exit")
    parser.add_argument("--model", default=None, help="train this folder's model")
    parser.add_argument("--adam-beta2", type=float, default=0.999, help="TRL's default 0.999")
    args = parser.parse_args()
    if args.save_tokenizer:
        char_tokenizer().save_pretrained(args.save_tokenizer)
        return
    if args.save_model:
        save_model_folder(args.save_model, args)
        return
    if not args.out:
        parser.error("--out is required for a training run")
    if args.threads:
        torch.set_num_threads(args.threads)
    events = Events(args.out, batch=64)
    events.write(event="start", t=STARTED, threads=torch.get_num_threads())
    if args.model:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = Qwen2ForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    else:
        tokenizer = char_tokenizer()
        model = build_model(tokenizer, args)
    rng = random.Random(args.seed)
    prompts = [
        "".join(rng.choice(ALPHABET) for _ in range(rng.randint(3, 5))) + ">"
        for _ in range(8 * (args.steps + 2))
    ]
    config = grpo_config(
        workdir=args.workdir,
        steps=args.steps,
        seed=args.seed,
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=8,
        learning_rate=3e-4,
        adam_beta2=args.adam_beta2,
        lr_scheduler_type="linear",
        warmup_steps=0,
        epsilon_high=0.2,
        bf16=False,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=rewards,
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
