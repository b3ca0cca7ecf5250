"""Incremental detokenization: text deltas from ids arriving one at a time.

Decoding ids one by one splits UTF-8 characters and loses decoder context, so each step
decodes a short window of recent ids with and without the newest and emits the
difference, holding text back while it ends in an incomplete character (U+FFFD).
Invariant: the concatenated deltas, `finish()` included, equal `decode(all ids)`.
"""

from __future__ import annotations

from tidal.text.tokenizer import Tokenizer

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Feed ids with `push`; each call returns the text they completed (maybe "")."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        skip_special: bool = True,
        prefix_ids: list[int] | None = None,
    ) -> None:
        """`prefix_ids` (e.g. the prompt's last few ids) give the first window context;
        their text is not emitted."""
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._ids: list[int] = list(prefix_ids or [])
        self._prefix = 0
        self._read = len(self._ids)
        self.text = ""  # everything emitted so far

    @property
    def ids(self) -> list[int]:
        return self._ids

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special=self.skip_special)

    def push(self, token_id: int) -> str:
        """Add one id; return the new text it completes ("" while a character is partial)."""
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if after.endswith(REPLACEMENT) or len(after) < len(before):
            return ""
        delta = after[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        self.text += delta
        return delta

    def finish(self) -> str:
        """Text still held back (an incomplete character at the end); call once at the end."""
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        delta = after[len(before) :]
        self._prefix = self._read = len(self._ids)
        self.text += delta
        return delta
