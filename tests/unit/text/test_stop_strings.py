"""Stop strings matched on streamed deltas from a real tokenizer."""

from __future__ import annotations

from pathlib import Path

from tidal.text.detokenize import IncrementalDetokenizer
from tidal.text.hf import HFTokenizer
from tidal.text.stop_strings import StopStringMatcher


def run(matcher: StopStringMatcher, deltas: list[str]) -> tuple[str, bool, int]:
    """Feeds deltas until a stop; returns (shown text, stopped, deltas consumed)."""
    shown = ""
    for n, delta in enumerate(deltas, 1):
        check = matcher.feed(delta)
        shown += check.text
        if check.stopped:
            return shown, True, n
    return shown + matcher.flush(), False, len(deltas)


def test_a_stop_string_split_over_deltas_stops_before_it() -> None:
    shown, stopped, used = run(StopStringMatcher(["</answer>"]), ["42</", "ans", "wer> more", "x"])
    assert (shown, stopped, used) == ("42", True, 3)


def test_include_stop_keeps_the_stop_string() -> None:
    shown, stopped, _ = run(StopStringMatcher(["STOP"], include_stop=True), ["aST", "OPb"])
    assert (shown, stopped) == ("aSTOP", True)


def test_the_earliest_of_several_stop_strings_wins() -> None:
    shown, stopped, _ = run(StopStringMatcher(["world", "lo w"]), ["hello world"])
    assert (shown, stopped) == ("hel", True)


def test_text_that_only_looks_like_a_stop_prefix_is_released() -> None:
    matcher = StopStringMatcher(["</answer>"])
    assert matcher.feed("a </an").text == "a "  # held: could become the stop string
    assert matcher.feed("d b").text == "</and b"  # it did not
    assert matcher.feed("</").text == "" and matcher.flush() == "</"


def test_stop_strings_on_streamed_bpe_deltas(qwen3_folder: Path) -> None:
    tok = HFTokenizer.from_folder(qwen3_folder)
    text = "The answer is 東京 😀. Let me think step by step."
    ids = tok.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push(i) for i in ids] + [detok.finish()]
    assert "".join(deltas) == text
    for stop in ["😀.", "Let me", "東", " step."]:
        shown, stopped, used = run(StopStringMatcher([stop]), deltas)
        assert stopped and shown == text[: text.index(stop)]
        assert stop in "".join(deltas[:used]) and stop not in "".join(deltas[: used - 1])
