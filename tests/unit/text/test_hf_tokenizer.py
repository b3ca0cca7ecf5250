"""`HFTokenizer` against `transformers.AutoTokenizer` on the same folders: ids, text and
rendered chats must be identical (Qwen3/ChatML and Llama 3 styles)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tidal.text.hf_tokenizer import HFTokenizer

TEXTS = [
    "Hello, world!",
    " leading and trailing spaces ",
    "Café, naïve, résumé — façade",
    "東京は日本の首都です。",
    "Emoji 😀🚀👍🏽 and a family 👨‍👩‍👧",
    "def add(a, b):\n    return a + b\n",
    "<|im_start|>user\nspecial strings inside text<|im_end|>",
    "",
]
CHAT = [
    {"role": "user", "content": "What is 12 + 30? Café 😀"},
    {"role": "assistant", "content": "<think>\nadd them\n</think>\n\nIt is 42."},
    {"role": "user", "content": "And 東京?"},
]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"a": "int"}}}]


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches_transformers(
    ours: HFTokenizer, reference: Any, add_special_tokens: bool
) -> None:
    for text in TEXTS:
        assert ours.encode(text, add_special_tokens=add_special_tokens) == reference.encode(
            text, add_special_tokens=add_special_tokens
        ), text


@pytest.mark.parametrize("skip_special", [True, False])
def test_decode_matches_transformers(ours: HFTokenizer, reference: Any, skip_special: bool) -> None:
    for text in TEXTS:
        ids = [*reference.encode(text), reference.eos_token_id]
        assert ours.decode(ids, skip_special=skip_special) == reference.decode(
            ids, skip_special_tokens=skip_special
        )


def test_special_ids_match_transformers(ours: HFTokenizer, reference: Any) -> None:
    assert ours.vocab_size == len(reference)
    assert ours.bos_id == reference.bos_token_id
    assert ours.eos_id == reference.eos_token_id
    # special_ids are what skip_special drops: the named ones and every special added token.
    assert ours.special_ids >= set(reference.all_special_ids)
    dropped = {
        i for i in range(len(reference)) if reference.decode([i], skip_special_tokens=True) == ""
    }
    assert ours.special_ids == dropped


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize(
    "kwargs", [{}, {"enable_thinking": False}, {"date_string": "1 Jan 2025"}, {"tools": TOOLS}]
)
def test_chat_template_matches_transformers(
    ours: HFTokenizer, reference: Any, add_generation_prompt: bool, kwargs: dict[str, Any]
) -> None:
    kw = {"add_generation_prompt": add_generation_prompt, **kwargs}
    text = reference.apply_chat_template(CHAT, tokenize=False, **kw)
    ids = reference.apply_chat_template(CHAT, tokenize=True, return_dict=False, **kw)
    assert ours.apply_chat_template(CHAT, **kw) == text
    assert ours.encode_chat(CHAT, **kw) == list(ids)


def test_system_prompt_is_a_leading_system_message(ours: HFTokenizer, reference: Any) -> None:
    with_system = [{"role": "system", "content": "You are terse."}, *CHAT]
    expected = reference.apply_chat_template(
        with_system, add_generation_prompt=True, tokenize=False
    )
    got = ours.apply_chat_template(CHAT, add_generation_prompt=True, system_prompt="You are terse.")
    assert got == expected and "You are terse." in got


def test_system_prompt_does_not_replace_the_chats_own(ours: HFTokenizer) -> None:
    chat = [{"role": "system", "content": "Dataset system."}, *CHAT]
    got = ours.apply_chat_template(chat, add_generation_prompt=True, system_prompt="Config system.")
    assert "Dataset system." in got and "Config system." not in got


def test_enable_thinking_reaches_the_template(folders: dict[str, Path]) -> None:
    ours = HFTokenizer.from_folder(folders["qwen3"])  # the template that reads it
    off = ours.apply_chat_template(CHAT, add_generation_prompt=True, enable_thinking=False)
    on = ours.apply_chat_template(CHAT, add_generation_prompt=True, enable_thinking=True)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning", "thinking"])
def test_reasoning_under_any_name_reaches_the_template(
    ours: HFTokenizer, reference: Any, key: str
) -> None:
    chat = [*CHAT, {"role": "assistant", "content": "Tokyo.", key: "it is the capital"}]
    expected = reference.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
    assert ours.apply_chat_template(chat, add_generation_prompt=False) == expected


def test_none_values_read_as_missing(ours: HFTokenizer, reference: Any) -> None:
    chat = [{"role": "user", "content": "hi", "reasoning_content": None}]
    expected = reference.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert ours.apply_chat_template(chat, add_generation_prompt=True) == expected


def test_byte_fallback_tokenizer_matches_transformers(sentencepiece_style_folder: Path) -> None:
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(sentencepiece_style_folder)
    ours = HFTokenizer.from_folder(sentencepiece_style_folder)
    assert ours.vocab_size == len(reference) and ours.bos_id == reference.bos_token_id
    for text in [*TEXTS, "rare 🦩🪐"]:
        ids = ours.encode(text)
        assert ids == reference.encode(text), text
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)
