"""Incremental detokenization: text deltas from ids arriving one at a time.

Decisions:
- Decoding each id on its own is wrong twice over: a byte-level BPE token may hold half
  of a UTF-8 character (an emoji split over two tokens decodes to U+FFFD twice), and
  some decoders treat the start of a sequence specially (SentencePiece's Metaspace drops
  the leading space). So each step decodes a short window of ids twice, with and without
  the newest ids, and emits the difference: the window's first ids give the decoder its
  context, and the difference is only what the new ids added.
- Two offsets move forward: `_prefix` (start of the window) and `_read` (the ids whose
  text was emitted). While the window's text ends in U+FFFD the newest ids are an
  incomplete character (byte-level BPE leaves one U+FFFD; a byte-fallback decoder
  replaces the whole unfinished run of `<0x..>` tokens, so even the complete characters
  before it read as U+FFFD until the run completes); nothing is emitted and the offsets
  stay, so the next id completes it. When text is emitted, the window moves up to the
  old `_read`: it starts at an id boundary whose text was complete, so it never begins
  inside a character.
- A real U+FFFD that the model generated is indistinguishable from an incomplete
  character until more ids arrive; `finish()` emits whatever is held back, so the
  concatenated deltas always equal `decode(all ids)`, and each step's text equals the
  decode of the ids so far whenever that decode is free of U+FFFD (tests check both).
- Works with any `Tokenizer`: only `decode` is used. Cost per id is one or two decodes
  of a window of a few ids, not of the whole sequence.
"""

from __future__ import annotations

from tidal.text.protocol import Tokenizer

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
