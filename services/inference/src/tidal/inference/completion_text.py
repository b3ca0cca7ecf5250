"""A completion's text as its tokens arrive, and whether a stop string has ended it.

Decisions:
- One `IncrementalDetokenizer` (`tidal.text`) and one stop-string scan per completion,
  fed one token at a time: each token costs a decode of a window of a few ids, not of
  the whole completion (the engine used to decode everything generated so far at every
  step to look for stop strings, quadratic in the completion's length).
- The text is the decode of the completion's ids alone (not in the prompt's context),
  special tokens skipped, so the concatenated pieces always equal
  `tokenizer.decode(token_ids)`: the same text whether streamed or not, and whether or
  not a byte-level token split a character (the detokenizer holds an incomplete UTF-8
  character back until the token that completes it, and `finish` releases whatever is
  left at the end).
- Stop strings are looked for in the new text of each token plus the last
  (longest stop - 1) characters before it, so the cost per token is bounded by the stop
  strings' length, and a stop string is found at the token that completes it, across
  BPE merges and characters split over tokens: exactly the first token at which
  `decode(ids so far)` contains it. That includes a token whose text completes the stop
  string and then starts a character it does not finish (byte-level BPE merges across
  character boundaries: one token may decode to "で" plus the first byte of "す"). The
  detokenizer holds such a token's whole text back until the character completes, so
  the new text checked for a held token is its tentative decode in the context of the
  ids emitted before it, U+FFFD for the unfinished character included, just as the full
  decode has it (so even a stop string holding U+FFFD, from invalid bytes, is found at
  the same token). A matcher over the detokenizer's emitted deltas alone would find
  such a stop string one token late, which is why the scan lives here.
- The completion then ends with the token that completed the stop string, kept with
  everything its text holds: the returned text stays the decode of the returned ids
  (the trainer sees what was sampled). A caller wanting the text cut before the stop
  string cuts at its first occurrence.
"""

from __future__ import annotations

from collections.abc import Sequence

from tidal.text.detokenize import IncrementalDetokenizer
from tidal.text.tokenizer import Tokenizer


class CompletionText:
    """Text of one completion, built token by token; says when a stop string matched."""

    def __init__(self, tokenizer: Tokenizer, stops: Sequence[str] = ()) -> None:
        self._tokenizer = tokenizer
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self._stops = tuple(s for s in stops if s)
        self._overlap = max((len(s) for s in self._stops), default=1) - 1
        self._emitted_ids: list[int] = []  # ids of the newest emitted text: decoder context
        self._held_ids: list[int] = []  # ids whose text the detokenizer still holds back
        self._taken = 0  # characters of `text` already handed out by `take`
        self.finished = False

    @property
    def text(self) -> str:
        """Everything decoded so far (the whole completion's text once `finish` ran)."""
        return self._detokenizer.text

    def push(self, token_id: int) -> bool:
        """Add one generated token; True when the text now contains a stop string."""
        before = self._detokenizer.text
        delta = self._detokenizer.push(token_id)
        if delta:
            self._emitted_ids, self._held_ids = [*self._held_ids, token_id], []
        else:
            self._held_ids.append(token_id)
        if not self._stops:
            return False
        new = delta or self._tentative_text()
        window = before[max(0, len(before) - self._overlap) :] + new
        return any(stop in window for stop in self._stops)

    def _tentative_text(self) -> str:
        """The held-back ids' text as a full decode has it now (U+FFFD where unfinished)."""
        context = self._tokenizer.decode(self._emitted_ids)
        text = self._tokenizer.decode([*self._emitted_ids, *self._held_ids])
        return text[len(context) :] if text.startswith(context) else ""

    def finish(self) -> None:
        """The completion ended: release a character still held back (idempotent)."""
        if not self.finished:
            self._detokenizer.finish()
            self.finished = True

    def take(self) -> str:
        """Text added since the previous `take` (a streamed piece's share)."""
        text = self._detokenizer.text
        piece, self._taken = text[self._taken :], len(text)
        return piece
