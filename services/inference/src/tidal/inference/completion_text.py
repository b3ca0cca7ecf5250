"""A completion's text as its tokens arrive, and whether a stop string has ended it.

One incremental detokenizer and one stop-string scan per completion: each token costs a
decode of a few ids, not of the whole completion. The text is the decode of the
completion's ids alone (special tokens skipped), so streamed pieces concatenate to
`tokenizer.decode(token_ids)`. A stop string is found at exactly the first token at which
the decode of the ids so far contains it, across BPE merges and characters split over
tokens (a held-back token's tentative text is scanned), and that token is kept: the
returned text stays the decode of the returned ids.
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
