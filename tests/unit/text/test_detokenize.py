"""Incremental detokenization: at every step the emitted text is the full decode of the
ids so far (or, while a character is incomplete, a prefix of it without U+FFFD)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.text.byte import ByteTokenizer
from tidal.text.detokenize import REPLACEMENT, IncrementalDetokenizer
from tidal.text.hf_tokenizer import HFTokenizer
from tidal.text.tokenizer import Tokenizer

TEXTS = [
    "Café, naïve, résumé — façade.",
    "東京は日本の首都です。北京是中国的首都。",
    "Emoji 😀🚀 and 👍🏽, a family 👨‍👩‍👧, rare 🦩🪐.",
    "Mixed: The answer is 42 → 東京 😀 café\n\n<think>done</think>",
]


@pytest.fixture(params=["byte", "qwen3", "llama", "sentencepiece"])
def tokenizer(request: pytest.FixtureRequest, all_folders: dict[str, Path]) -> Tokenizer:
    """Byte ids, byte-level BPE (Qwen, Llama 3) and byte-fallback `▁` BPE (Llama 2)."""
    if request.param == "byte":
        return ByteTokenizer()
    return HFTokenizer.from_folder(all_folders[request.param])


def stream(tokenizer: Tokenizer, ids: list[int], *, skip_special: bool = True) -> int:
    """Feeds `ids` one at a time, checking every step; returns how many steps held text back.

    At each step the emitted text is the full decode of the ids so far; while that decode
    holds U+FFFD (an unfinished character; byte fallback replaces a whole unfinished byte
    run) the emitted text is a prefix of the final text instead."""
    final = tokenizer.decode(ids, skip_special=skip_special)
    detok = IncrementalDetokenizer(tokenizer, skip_special=skip_special)
    held_back = 0
    for n, token_id in enumerate(ids, 1):
        detok.push(token_id)
        full = tokenizer.decode(ids[:n], skip_special=skip_special)
        assert REPLACEMENT not in detok.text
        if REPLACEMENT in full:
            held_back += 1
            assert final.startswith(detok.text)
        else:
            assert detok.text == full
    detok.finish()
    assert detok.text == final
    return held_back


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_equal_the_full_decode_at_every_step(tokenizer: Tokenizer, text: str) -> None:
    stream(tokenizer, tokenizer.encode(text))


def test_characters_split_over_tokens_are_held_back_not_garbled(tokenizer: Tokenizer) -> None:
    # Rare emoji are not merges of the tiny BPE: their bytes are separate tokens.
    ids = tokenizer.encode("🦩🪐 東京 é", add_special_tokens=False)
    assert any(REPLACEMENT in tokenizer.decode([i]) for i in ids)  # the case is exercised
    assert stream(tokenizer, ids) > 0


def test_special_tokens_are_skipped_or_kept(tokenizer: Tokenizer) -> None:
    ids = [*tokenizer.encode("Café 😀"), *tokenizer.eos_ids]
    stream(tokenizer, ids, skip_special=True)
    stream(tokenizer, ids, skip_special=False)


def test_prefix_ids_give_context_but_are_not_emitted(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode("Question: café?")
    completion = tokenizer.encode(" Answer: 東京 😀", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prefix_ids=prompt[-3:])
    deltas = [detok.push(i) for i in completion]
    deltas.append(detok.finish())
    # The completion's text in context (SentencePiece keeps a space it drops at the start).
    context = tokenizer.decode(prompt[-3:])
    assert "".join(deltas) == tokenizer.decode(prompt[-3:] + completion)[len(context) :]


def test_a_generated_replacement_character_is_emitted_by_finish() -> None:
    tok = ByteTokenizer()
    ids = [*b"ok ", 0xF0, 0x9F]  # a truncated 4-byte character at the end
    detok = IncrementalDetokenizer(tok)
    assert "".join(detok.push(i) for i in ids) == "ok "
    assert detok.finish() == tok.decode(ids)[3:] and detok.text == tok.decode(ids)
