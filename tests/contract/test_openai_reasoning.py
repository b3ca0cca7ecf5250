"""`reasoning_content` on the OpenAI endpoint, driven by the official `openai` client.

The Qwen3-style folder with a template that opens `<think>` in the generation prompt (as
DeepSeek-R1's does) is served by the real inference service: a chat message's reasoning
and content are the parser's split of the generated ids' text, and streamed deltas join to
the whole message. With thinking off (Qwen3's `enable_thinking = false` closes the block
in the prompt) every choice is content, with no reasoning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tidal.text.hf_tokenizer import HFTokenizer
from tidal.text.reasoning import THINK, ReasoningParser

from .test_openai_endpoint import CHAT, MODEL, extension, openai_replica, qwen3_folder

__all__ = ["qwen3_folder"]

ARGS: dict[str, Any] = {
    "model": MODEL,
    "messages": CHAT,
    "max_completion_tokens": 24,
    "seed": 5,
    "extra_body": {"ignore_eos": True},
}


@pytest.fixture
def opening_folder(qwen3_folder: Path, tmp_path: Path) -> Path:
    """The Qwen3-style folder whose generation prompt ends with `<think>\\n`."""
    folder = tmp_path / "opens-think"
    shutil.copytree(qwen3_folder, folder)
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] += "{% if add_generation_prompt %}<think>\n{% endif %}"
    path.write_text(json.dumps(config))
    return folder


async def test_reasoning_content_streamed_and_not(
    weightsync_server: Any, tmp_path: Path, opening_folder: Path
) -> None:
    tok = HFTokenizer.from_folder(opening_folder)
    async with openai_replica(weightsync_server, tmp_path, opening_folder) as (_, client):
        whole = (await client.chat.completions.create(**ARGS)).choices[0]
        stream = await client.chat.completions.create(**ARGS, stream=True)
        deltas = [c.choices[0].delta async for c in stream if c.choices]
    split = ReasoningParser(THINK).split(tok.decode(extension(whole)["token_ids"]), opened=True)
    assert split.thought and split.reasoning  # the prompt opened the block
    assert whole.message.model_extra["reasoning_content"] == split.reasoning
    assert whole.message.content == split.answer
    streamed = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert streamed == split.reasoning
    assert "".join(d.content or "" for d in deltas) == split.answer


async def test_with_thinking_off_there_is_no_reasoning(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    off = {
        **ARGS,
        "extra_body": {**ARGS["extra_body"], "chat_template_kwargs": {"enable_thinking": False}},
    }
    tok = HFTokenizer.from_folder(qwen3_folder)
    async with openai_replica(weightsync_server, tmp_path, qwen3_folder) as (_, client):
        choice = (await client.chat.completions.create(**off)).choices[0]
    assert choice.message.model_extra["reasoning_content"] is None
    assert choice.message.content == tok.decode(extension(choice)["token_ids"])
