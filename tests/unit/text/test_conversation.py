"""Template mode resolution and whole conversations as ids with a mask on assistant turns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidal.common.errors import ConfigError
from tidal.text.byte import ByteTokenizer
from tidal.text.conversation import ChatRendering, uses_template
from tidal.text.hf_tokenizer import HFTokenizer

from ...hf_folders import build_model_folder

KEY = "x.chat.template"


def test_auto_uses_a_folder_template_but_not_the_byte_one(folders: dict[str, Path]) -> None:
    assert uses_template(HFTokenizer.from_folder(folders["llama"]), "auto", key=KEY)
    assert not uses_template(ByteTokenizer(), "auto", key=KEY)
    assert uses_template(ByteTokenizer(), "on", key=KEY)
    assert not uses_template(HFTokenizer.from_folder(folders["qwen3"]), "off", key=KEY)


def test_on_without_a_template_names_the_key(tmp_path: Path) -> None:
    folder = build_model_folder(tmp_path / "m", "llama", weights=False)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"x\.chat\.template = \"on\" but tokenizer .* no chat"):
        uses_template(HFTokenizer.from_folder(folder), "on", key=KEY)


def test_llama_conversation_trains_assistant_turns_through_eot_only(
    folders: dict[str, Path],
) -> None:
    tok = HFTokenizer.from_folder(folders["llama"])
    chat = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Bye!"},
    ]
    episode = ChatRendering(tok, template=True).conversation(chat)
    trained = [i for i, m in zip(episode.ids, episode.loss_mask, strict=True) if m]
    assert tok.decode(trained, skip_special=False) == "Hello!<|eot_id|>Bye!<|eot_id|>"
    headers = tok.decode(
        [i for i, m in zip(episode.ids, episode.loss_mask, strict=True) if not m],
        skip_special=False,
    )
    assert headers.count("<|start_header_id|>assistant<|end_header_id|>") == 2
    assert headers.startswith("<|begin_of_text|>")


def test_a_conversation_opening_with_the_assistant_is_refused() -> None:
    rendering = ChatRendering(ByteTokenizer(), template=True)
    with pytest.raises(ValueError, match="cannot open with an assistant"):
        rendering.conversation([{"role": "assistant", "content": "hi"}])
