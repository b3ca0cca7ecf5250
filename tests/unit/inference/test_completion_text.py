"""A sequence's text and stop strings, token by token, with a real byte-level BPE tokenizer
(the Qwen3-style folder of tests/hf_folders.py): streamed text equals the full decode,
and a stop string ends the sequence at the first token whose full decode contains it,
across BPE merges and characters split over tokens."""

from __future__ import annotations

import pytest

from tidal.inference.completion_text import CompletionText
from tidal.inference.sampling import SamplingParams
from tidal.inference.sequence import Sequence
from tidal.text.hf_tokenizer import HFTokenizer

REPLACEMENT = "\ufffd"


def run_sequence(tok: HFTokenizer, ids: list[int], params: SamplingParams) -> Sequence:
    """Append `ids` as if sampled, one per step, until the sequence stops."""
    text = CompletionText(tok, params.stop)
    seq = Sequence(None, 0, [1], params, [0.0] * len(ids), len(ids), text=text)
    for token in ids:
        seq.append(token, -1.0, None, version=0)
        if seq.done:
            break
    return seq


def first_token_containing(tok: HFTokenizer, ids: list[int], stop: str) -> int:
    """The index of the first token at which the full decode contains `stop`."""
    return next(i for i in range(len(ids)) if stop in tok.decode(ids[: i + 1]))


@pytest.mark.parametrize(
    "text",
    ["東京は🦀です。Emoji 😀 and 🚀 👍🏽 done", "漢字 façade → ©", "北京是中国的首都。"],
)
def test_streamed_text_equals_the_full_decode_for_split_characters(
    tok: HFTokenizer, text: str
) -> None:
    ids = tok.encode(text, add_special_tokens=False)
    assert any(REPLACEMENT in tok.decode([i]) for i in ids)  # characters do get split
    completion = CompletionText(tok)
    pieces = []
    for token in ids:
        completion.push(token)
        pieces.append(completion.take())
    completion.finish()
    pieces.append(completion.take())
    assert "".join(pieces) == tok.decode(ids) == text
    assert not any(REPLACEMENT in p for p in pieces)  # never half a character


def test_stop_string_spanning_a_bpe_merge_ends_at_the_token_completing_it(
    tok: HFTokenizer,
) -> None:
    ids = tok.encode("The quick brown fox jumps over the lazy dog.", add_special_tokens=False)
    stop = "ick bro"
    assert not any(stop in tok.decode([i]) for i in ids)  # no single token holds it
    seq = run_sequence(tok, ids, SamplingParams(max_tokens=len(ids), stop=("never", stop)))
    end = first_token_containing(tok, ids, stop)
    assert 0 < end < len(ids) - 1
    assert seq.token_ids == ids[: end + 1] and seq.finish_reason == "stop"
    assert seq.take_text() == tok.decode(seq.token_ids)


@pytest.mark.parametrize("stop", ["🦀", "🦀で", "です", "👍🏽"])
def test_stop_string_spanning_a_split_character_ends_where_the_full_decode_has_it(
    tok: HFTokenizer, stop: str
) -> None:
    ids = tok.encode("東京は🦀です。Emoji 😀 and 🚀 👍🏽 done", add_special_tokens=False)
    end = first_token_containing(tok, ids, stop)
    seq = run_sequence(tok, ids, SamplingParams(max_tokens=len(ids), stop=(stop,)))
    assert seq.token_ids == ids[: end + 1] and seq.finish_reason == "stop"
    assert seq.take_text() == tok.decode(seq.token_ids)


def test_stop_string_completed_by_a_token_that_also_starts_a_character(
    tok: HFTokenizer,
) -> None:
    """One token decodes to "で" plus the first byte of "す": the stop string "🦀で" is
    complete at that token although its text cannot be shown yet."""
    ids = tok.encode("東京は🦀です。", add_special_tokens=False)
    end = first_token_containing(tok, ids, "🦀で")
    assert tok.decode(ids[: end + 1]).endswith(REPLACEMENT)  # the token ends mid-character
    seq = run_sequence(tok, ids, SamplingParams(max_tokens=len(ids), stop=("🦀で",)))
    assert len(seq.token_ids) == end + 1
    assert seq.take_text() == tok.decode(ids[: end + 1])  # the partial byte, as decode has it


def test_without_a_stop_the_sequence_runs_to_its_budget_and_keeps_all_text(
    tok: HFTokenizer,
) -> None:
    ids = tok.encode("こんにちは世界。😀", add_special_tokens=False)
    seq = run_sequence(tok, ids, SamplingParams(max_tokens=len(ids)))
    assert seq.finish_reason == "length" and seq.token_ids == ids
    assert seq.take_text() == "こんにちは世界。😀"
