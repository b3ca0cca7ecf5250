"""Small Hugging Face model folders built at test time (no hub): a byte-level BPE tokenizer
trained with `tokenizers` on an in-file corpus, a chat template, `generation_config.json`,
and a tiny model with random weights, in the Qwen3 and Llama 3 styles.

- Qwen3 style: ChatML (`<|im_start|>`, `<|im_end|>`, `<|endoftext|>`), no BOS, EOS
  `<|im_end|>` in tokenizer_config as Qwen3's instruct models have it, generation config
  eos `[<|im_end|>, <|endoftext|>]`, a template that reads `enable_thinking` and drops the
  `<think>` block of assistant turns before the last user message (as Qwen3's does).
- Llama 3 style: `<|begin_of_text|>` added by tokenizer.json's post-processor, header
  tokens, `<|eot_id|>` closing turns, EOS `<|end_of_text|>`, generation config eos
  `[<|end_of_text|>, <|eot_id|>]`.
- Weights and config.json come from our own writer (`tidal.models.hf_folder.write_folder`
  through `export_model`, as tests/unit/models do), with `vocab_size` equal to the
  tokenizer's, so the folder loads in `transformers` and in `tidal.models` alike.
- Special tokens are added after training, so they get the last ids, as in real models;
  Qwen's `<think>`/`</think>` are added but not special (decoding keeps them).
- `tokenizer_class` is `PreTrainedTokenizerFast`, so `transformers` reads tokenizer.json
  as is (its Qwen2Tokenizer would rebuild the pre-tokenizer from its own defaults).

Use the session fixtures `qwen3_folder` / `llama_folder` (import them into a conftest),
or `build_model_folder(path, family)` for a folder a test may modify;
`declare_token_ids(folder)` makes its config files name special-token ids as Qwen3's do.
`sentencepiece_style_folder` is a tokenizer-only Llama 2-style folder (byte fallback,
`▁` spaces) for what byte-level BPE does not exercise.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello, world!",
    "What is 12 + 30? The answer is 42. Let me think step by step.",
    "Café, naïve, résumé, façade: accented words are common in French and Spanish.",
    "東京は日本の首都です。北京是中国的首都。こんにちは世界。",
    "Emoji 😀 and 🚀 and 👍🏽 appear in chats; so do arrows → and symbols ©.",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))",
    "<think>\nI should add the numbers.\n</think>\n\nThe sum is 3.",
    "user: please call the tool. assistant: calling the calculator tool now.",
] * 4

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<think>", "</think>"]  # added but not special, as in Qwen3: decode keeps them
LLAMA_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]

# ChatML, Qwen3-like in behaviour (written for these tests, not copied).
CHATML_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n"
    "{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}"
    "{% endif %}{% endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}"
    "{%- if not loop.first %}{{ raise_exception('system message must come first') }}{% endif %}"
    "{%- elif m.role == 'assistant' %}"
    "{%- set content = m.content %}{% set reasoning = m.reasoning_content or '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\n') %}{% endif %}"
    "{%- if loop.index0 > ns.last_user and reasoning %}"
    "<|im_start|>assistant\n<think>\n{{ reasoning }}\n</think>\n\n{{ content }}<|im_end|>\n"
    "{%- else %}<|im_start|>assistant\n{{ content }}<|im_end|>\n{% endif %}"
    "{%- elif m.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    "{%- endif %}"
)

# Llama 3 headers (written for these tests).
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0].role == 'system' %}{% set system = messages[0].content | trim %}"
    "{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\n"
    "{% if date_string is defined %}Today Date: {{ date_string }}\n\n{% endif %}"
    "{{ system }}<|eot_id|>"
    "{%- for m in messages %}"
    "<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content | trim }}<|eot_id|>"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def train_tokenizer(
    specials: list[str], *, added: tuple[str, ...] = (), vocab_size: int = 480
) -> Tokenizer:
    """A byte-level BPE trained on `CORPUS`, `specials` then `added` (plain added tokens)
    given the last ids."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens(specials)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in added])
    return tok


def _family(family: str) -> dict[str, Any]:
    if family == "qwen3":
        tok = train_tokenizer(QWEN_SPECIALS, added=tuple(QWEN_ADDED))
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        ids = {s: tok.token_to_id(s) for s in QWEN_SPECIALS}
        return {
            "tokenizer": tok,
            "config": {
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": CHATML_TEMPLATE,
            },
            "eos": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        }
    if family == "llama":
        tok = train_tokenizer(LLAMA_SPECIALS)
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
            special_tokens=[("<|begin_of_text|>", bos)],
        )
        ids = {s: tok.token_to_id(s) for s in LLAMA_SPECIALS}
        return {
            "tokenizer": tok,
            "config": {
                "bos_token": {
                    "__type": "AddedToken",
                    "content": "<|begin_of_text|>",
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "single_word": False,
                },
                "eos_token": "<|end_of_text|>",
                "chat_template": LLAMA3_TEMPLATE,
            },
            "eos": [ids["<|end_of_text|>"], ids["<|eot_id|>"]],
        }
    raise ValueError(f"unknown family {family!r}: qwen3 or llama")


def _tiny_args(family: str, vocab_size: int, dim: int = 32, ffn_dim: int = 48) -> Any:
    from tidal.models.args import DecoderArgs

    if family == "qwen3":
        return DecoderArgs(
            vocab_size=vocab_size, dim=dim, n_layers=2, n_heads=4, n_kv_heads=2,
            ffn_dim=ffn_dim, max_seq_len=128, family="qwen3", head_dim=dim // 2, qk_norm=True,
            tie_embeddings=True,
        )  # fmt: skip
    return DecoderArgs(
        vocab_size=vocab_size, dim=dim, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=ffn_dim,
        max_seq_len=128, family="llama", rope_theta=500000.0, tie_embeddings=False,
    )  # fmt: skip


def write_weights(
    folder: Path, family: str, vocab_size: int, *, seed: int = 0, dim: int = 32, ffn_dim: int = 48
) -> None:
    """config.json + random safetensors through our exporter (RNG of the caller untouched)."""
    import torch

    from tidal.models.layers import DecoderLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DecoderLM(_tiny_args(family, vocab_size, dim, ffn_dim))
        model.init_weights(0.02)
    export_model(model, folder)


def export_model(model: Any, folder: Path, **options: Any) -> None:
    """`model` as a model folder: its own config.json and HF-named weights (`write_folder`)."""
    from tidal.models.hf_checkpoint import publishable_state_dict
    from tidal.models.hf_folder import write_folder

    write_folder(folder, model.args.to_hf_config(), publishable_state_dict(model), **options)


def write_tokenizer(folder: Path, family: str, spec: dict[str, Any] | None = None) -> int:
    """tokenizer.json, tokenizer_config.json, generation_config.json; returns vocab size."""
    spec = spec or _family(family)
    tok: Tokenizer = spec["tokenizer"]
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    added = {
        str(i): {"content": t.content, "lstrip": False, "rstrip": False, "normalized": False,
                 "single_word": False, "special": t.special}
        for i, t in tok.get_added_tokens_decoder().items()
    }  # fmt: skip
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 128,
        "added_tokens_decoder": added,
        **spec["config"],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    generation = {"eos_token_id": spec["eos"], "do_sample": True, "temperature": 0.7}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return int(tok.get_vocab_size(with_added_tokens=True))


def build_model_folder(
    folder: Path, family: str, *, weights: bool = True, dim: int = 32, ffn_dim: int = 48
) -> Path:
    """A complete tiny model folder of `family` ("qwen3" or "llama") at `folder` (dim 32
    unless asked; the learning test uses the default run's dim 128)."""
    spec = _family(family)
    if weights:  # first: the exporter writes the folder and renames it into place
        vocab_size = spec["tokenizer"].get_vocab_size(with_added_tokens=True)
        write_weights(folder, family, vocab_size, dim=dim, ffn_dim=ffn_dim)
    write_tokenizer(folder, family, spec)
    return folder


def declare_token_ids(folder: Path) -> dict[str, dict[str, Any]]:
    """Make a Qwen3-style `folder`'s config.json and generation_config.json declare
    special-token ids as Qwen3's own files do (a BOS the tokenizer does not add, an int EOS
    in config.json, an EOS list in generation_config.json), each distinct from the
    tokenizer's own, plus a `*_token_id` of no known meaning; returns what each declares."""
    vocab = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    ids = {t["content"]: t["id"] for t in vocab}
    start, end, text_end = ids["<|im_start|>"], ids["<|im_end|>"], ids["<|endoftext|>"]
    declared = {
        "config.json": {"bos_token_id": start, "eos_token_id": text_end,
                        "pad_token_id": text_end, "sep_token_id": end},
        "generation_config.json": {"bos_token_id": start, "eos_token_id": [text_end, end],
                                   "pad_token_id": text_end, "decoder_start_token_id": start},
    }  # fmt: skip
    for name, ids_ in declared.items():
        settings = json.loads((folder / name).read_text())
        (folder / name).write_text(json.dumps({**settings, **ids_}, indent=2))
    return declared


def build_sentencepiece_style_folder(folder: Path) -> Path:
    """A Llama 2-style tokenizer folder (no weights): BPE with byte fallback (`<0xE2>`
    tokens for characters outside the vocabulary), Metaspace-like `▁` spaces and a
    decoder that strips the sequence's leading space, BOS `<s>`, EOS `</s>`."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        min_frequency=2,
        special_tokens=["<unk>", "<s>", "</s>"],
        limit_alphabet=70,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):  # byte-fallback tokens, plain vocabulary entries
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return folder


def _session_folder(family: str) -> Callable[[pytest.TempPathFactory], Path]:
    @pytest.fixture(scope="session", name=f"{family}_folder")
    def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
        return build_model_folder(tmp_path_factory.mktemp(family) / "model", family)

    return folder


qwen3_folder = _session_folder("qwen3")
llama_folder = _session_folder("llama")


@pytest.fixture(scope="session")
def sentencepiece_style_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sentencepiece_style_folder(tmp_path_factory.mktemp("sp") / "tokenizer")
