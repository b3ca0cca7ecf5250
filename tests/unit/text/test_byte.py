"""The byte tokenizer behind the `Tokenizer` interface: bytes plus BOS/EOS/PAD (the ids the
default model's checkpoints use), plus a built-in chat template."""

from __future__ import annotations

import pytest

from tidal.text.byte import ByteTokenizer
from tidal.text.tokenizer import Tokenizer

TEXTS = ["", "hello", "héllo> 東京 😀", "<eos> typed by a user", "a\nb\tc"]


def test_satisfies_the_tokenizer_protocol() -> None:
    assert isinstance(ByteTokenizer(), Tokenizer)


@pytest.mark.parametrize("text", TEXTS)
def test_ids_are_utf8_bytes_after_bos_and_decode_round_trips(text: str) -> None:
    tok = ByteTokenizer()
    assert tok.encode(text) == [256, *text.encode("utf-8")]
    assert tok.encode(text, add_special_tokens=False) == list(text.encode("utf-8"))
    ids = [*tok.encode(text), tok.eos_id, tok.pad_id]
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special=False) == f"<bos>{text}<eos><pad>"


def test_special_ids_are_bos_eos_pad() -> None:
    tok = ByteTokenizer()
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (256, 257, 258, 259)
    assert tok.eos_ids == (257,) and tok.special_ids == {256, 257, 258}


def test_chat_template_renders_turns_closed_by_eos() -> None:
    tok = ByteTokenizer()
    chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    text = tok.apply_chat_template(chat, add_generation_prompt=False, system_prompt="Be brief.")
    assert text == "<bos><|system|>\nBe brief.<eos><|user|>\n2+2?<eos><|assistant|>\n4<eos>"
    prompt = tok.apply_chat_template(chat[:1], add_generation_prompt=True)
    assert prompt == "<bos><|user|>\n2+2?<eos><|assistant|>\n"


def test_encode_chat_maps_markers_to_special_ids_and_decodes_back() -> None:
    tok = ByteTokenizer()
    chat = [{"role": "user", "content": "héllo 😀"}]
    ids = tok.encode_chat(chat, add_generation_prompt=True)
    assert ids[0] == tok.bos_id and ids.count(tok.eos_id) == 1
    assert all(0 <= i < tok.vocab_size for i in ids)
    rendered = tok.apply_chat_template(chat, add_generation_prompt=True)
    assert tok.decode(ids, skip_special=False) == rendered


def test_plain_encode_never_reads_markers() -> None:
    tok = ByteTokenizer()
    assert tok.eos_id not in tok.encode("<eos>")
    assert tok.encode_template_text("<eos>") == [tok.eos_id]
