"""The reasoning parser: a completion split into reasoning and answer (closed, unclosed,
opened by the prompt, absent, odd text), the same split streamed piece by piece, and the
markers found from a tokenizer (its `response_template`, its `<think>` tokens, its chat
template) or named by config; the split agrees with `transformers`' `parse_response`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tidal.common.errors import ConfigError
from tidal.text.byte import ByteTokenizer
from tidal.text.hf_tokenizer import HFTokenizer
from tidal.text.reasoning import (
    THINK,
    Reasoned,
    ReasoningParser,
    generation_opens,
    reasoning_parser,
)

THINKING = ReasoningParser(THINK)

CASES = [  # (text, prompt opened the block, expected split)
    ("<think>\nadd them\n</think>\n\n42", False, Reasoned("add them", "42", True, True)),
    ("  \n<think>a</think>42", False, Reasoned("a", "42", True, True)),
    ("<think>\nstill going", False, Reasoned("still going", "", True, False)),
    ("add them\n</think>\n\n42", True, Reasoned("add them", "42", True, True)),
    ("never closed", True, Reasoned("never closed", "", True, False)),
    (" 42 is it\n", False, Reasoned("", " 42 is it\n", False, False)),
    ("42 </think> 7", False, Reasoned("", "42 </think> 7", False, False)),
    ("42 <think>x</think>", False, Reasoned("", "42 <think>x</think>", False, False)),
    ("<think>a<think>b</think>c</think>d", False, Reasoned("a<think>b", "c</think>d", True, True)),
    ("<think>a</think>b<think>c</think>", False, Reasoned("a", "b<think>c</think>", True, True)),
    ("<think></think>42", False, Reasoned("", "42", True, True)),
    ("<thi", False, Reasoned("", "<thi", False, False)),
    ("<think>a</thi", False, Reasoned("a</thi", "", True, False)),
    ("", False, Reasoned("", "", False, False)),
    ("", True, Reasoned("", "", True, False)),
]


@pytest.mark.parametrize(("text", "opened", "expected"), CASES)
def test_split(text: str, opened: bool, expected: Reasoned) -> None:
    assert THINKING.split(text, opened=opened) == expected


@pytest.mark.parametrize(("text", "opened", "expected"), CASES)
@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_streamed_pieces_join_to_the_whole_split(
    text: str, opened: bool, expected: Reasoned, size: int
) -> None:
    stream = THINKING.stream(opened=opened)
    assert stream is not None
    reasoning, answer = [], []
    for at in range(0, len(text), size):
        r, a = stream.push(text[at : at + size])
        reasoning.append(r)
        answer.append(a)
    r, a = stream.finish()
    assert ("".join(reasoning) + r, "".join(answer) + a) == (expected.reasoning, expected.answer)
    assert stream.result() == expected


def test_a_partial_end_marker_and_trailing_space_are_held_back_until_decided() -> None:
    stream = THINKING.stream()
    assert stream is not None
    assert stream.push("<think>ab </") == ("ab", "")
    assert stream.push("x") == (" </x", "")  # not the marker after all: sent on
    assert stream.push(" </think>\n") == ("", "")
    assert stream.push("\n42") == ("", "42")


def test_well_formed_needs_a_closed_block_then_an_answer() -> None:
    assert THINKING.split("<think>a</think> 42").well_formed
    assert not THINKING.split("<think>a</think>  ").well_formed
    assert not THINKING.split("<think>a").well_formed
    assert not THINKING.split("42").well_formed


def test_without_markers_everything_is_the_answer() -> None:
    none = ReasoningParser(None)
    assert none.split("<think>a</think>42", opened=True) == Reasoned("", "<think>a</think>42")
    assert none.stream() is None and not none.opens("<think>")


def test_opens_reads_the_last_block_of_the_prompt() -> None:
    assert THINKING.opens("<|im_start|>assistant\n<think>\n")
    assert not THINKING.opens("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not THINKING.opens("<think>a</think> then <|im_start|>assistant\n")
    assert THINKING.opens("<think>a</think> user\n<think>")


def _folder_with(src: Path, dst: Path, **config: Any) -> Path:
    """A copy of tokenizer folder `src` whose tokenizer_config.json has `config` keys set."""
    shutil.copytree(src, dst)
    path = dst / "tokenizer_config.json"
    data = json.loads(path.read_text())
    data.update(config)
    path.write_text(json.dumps(data))
    return dst


def test_auto_finds_think_tokens_and_none_for_bytes_or_plain_templates(
    qwen3_folder: Path, llama_folder: Path
) -> None:
    assert reasoning_parser(HFTokenizer.from_folder(qwen3_folder)).markers == THINK
    assert reasoning_parser(HFTokenizer.from_folder(llama_folder)).markers is None
    assert reasoning_parser(ByteTokenizer()).markers is None
    assert reasoning_parser(ByteTokenizer(), "think").markers == THINK
    assert reasoning_parser(HFTokenizer.from_folder(qwen3_folder), "none").markers is None
    with pytest.raises(ConfigError, match="auto, none or think"):
        reasoning_parser(ByteTokenizer(), "deep")  # type: ignore[arg-type]


def test_auto_reads_the_response_templates_reasoning_field(
    qwen3_folder: Path, tmp_path: Path
) -> None:
    response_template = {
        "start_anchor": "<|im_start|>assistant\n",
        "fields": {
            "reasoning_content": {"open": ["[THINK]"], "close": "[/THINK]"},
            "content": {"close": "<|im_end|>"},
        },
    }
    folder = _folder_with(qwen3_folder, tmp_path / "f", response_template=response_template)
    parser = reasoning_parser(HFTokenizer.from_folder(folder))
    assert parser.markers == ("[THINK]", "[/THINK]")
    assert parser.split("[THINK]hm[/THINK] 42") == Reasoned("hm", "42", True, True)


def test_auto_finds_think_in_a_chat_template_without_think_tokens(
    llama_folder: Path, tmp_path: Path
) -> None:
    template = "{% for m in messages %}{{ m.content }}{% endfor %}<think>\n"
    folder = _folder_with(llama_folder, tmp_path / "f", chat_template=template + "</think>")
    assert reasoning_parser(HFTokenizer.from_folder(folder)).markers == THINK


def test_generation_opens_when_the_template_writes_think_into_the_prompt(
    qwen3_folder: Path, tmp_path: Path
) -> None:
    qwen = HFTokenizer.from_folder(qwen3_folder)
    parser = reasoning_parser(qwen)
    assert not generation_opens(parser, qwen)  # thinking on: the model writes <think>
    assert not generation_opens(parser, qwen, enable_thinking=False)  # an empty closed block
    config = json.loads((qwen3_folder / "tokenizer_config.json").read_text())
    opening = config["chat_template"] + "{% if add_generation_prompt %}<think>\n{% endif %}"
    r1_style = HFTokenizer.from_folder(
        _folder_with(qwen3_folder, tmp_path / "f", chat_template=opening)
    )
    assert generation_opens(reasoning_parser(r1_style), r1_style)
    assert not generation_opens(ReasoningParser(None), r1_style)


def test_markers_that_are_special_tokens_are_named_in_a_warning(
    qwen3_folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "special-think"
    shutil.copytree(qwen3_folder, folder)
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text())
    for token in data["added_tokens"]:
        token["special"] = token["special"] or token["content"] in THINK
    path.write_text(json.dumps(data))
    with caplog.at_level("WARNING", logger="tidal.text.reasoning"):
        reasoning_parser(HFTokenizer.from_folder(qwen3_folder))
        assert not caplog.records
        parser = reasoning_parser(HFTokenizer.from_folder(folder))
    assert parser.markers == THINK
    assert "['<think>', '</think>']" in caplog.text and "decoding drops" in caplog.text


QWEN_RESPONSE_TEMPLATE = {  # the fields of `transformers`' own Qwen3 reply format
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close": "</think>", "content": "text"},
        "content": {"close_pattern": r"\s*(?:<\|im_end\|>|<\|endoftext\|>)", "content": "text"},
    },
}


READ_OTHERWISE = {"42 <think>x</think>", "<think>a</think>b<think>c</think>"}
"""Where `transformers` reads any block as reasoning (one after other text, a second one),
and only a leading block is reasoning here."""


@pytest.mark.parametrize(
    ("text", "opened"),
    [(text, opened) for text, opened, _ in CASES if text.strip() and text not in READ_OTHERWISE],
)
def test_the_split_agrees_with_transformers_parse_response(
    qwen3_folder: Path, text: str, opened: bool
) -> None:
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(qwen3_folder)
    chat = [{"role": "user", "content": "What is 12 + 30?"}]
    prompt = reference.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    prompt += "<think>\n" if opened else ""
    parsed = reference.parse_response(
        text + "<|im_end|>", schema=QWEN_RESPONSE_TEMPLATE, prefix=prompt
    )
    ours = THINKING.split(text, opened=opened)
    # there an unclosed block runs to the end of the reply, end-of-turn text included, and
    # a plain reply is stripped (ours keeps a reply without reasoning verbatim)
    reasoning = (parsed.get("reasoning_content") or "").removesuffix("<|im_end|>").strip()
    assert ours.reasoning == reasoning
    assert ours.answer.strip() == parsed.get("content", "")
