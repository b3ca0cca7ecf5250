"""Stop strings on streamed text: what may be shown, and where generation must stop.

Decisions:
- Works on the text deltas of `IncrementalDetokenizer`, never on ids: a stop string may
  span several tokens and a token may hold a stop string plus more text.
- A suffix of the text that could still grow into a stop string is held back, so a
  client never sees text that later turns out to be the start of a stop string; the rest
  is released at once. `flush()` releases the held tail when generation ends otherwise.
- The earliest match wins (over all stop strings); the returned text ends before it, or
  after it with `include_stop=True` (OpenAI's default is to exclude it). Text after the
  match is dropped: the caller stops generating and keeps the ids up to and including
  the token whose delta completed the match (the policy did sample them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopCheck:
    text: str  # safe to show now
    stopped: bool  # a stop string matched: generation ends here


class StopStringMatcher:
    """Feed text deltas with `feed`; each call says what may be shown and whether to stop."""

    def __init__(self, stops: Sequence[str], *, include_stop: bool = False) -> None:
        self.stops = tuple(s for s in stops if s)
        self.include_stop = include_stop
        self._held = ""
        self.stopped = False

    def feed(self, delta: str) -> StopCheck:
        if self.stopped:
            return StopCheck("", True)
        text = self._held + delta
        matches = [(at, s) for s in self.stops if (at := text.find(s)) >= 0]
        if matches:
            at, stop = min(matches)
            self._held, self.stopped = "", True
            return StopCheck(text[: at + len(stop)] if self.include_stop else text[:at], True)
        keep = self._partial_suffix(text)
        self._held = text[len(text) - keep :] if keep else ""
        return StopCheck(text[: len(text) - keep], False)

    def flush(self) -> str:
        """The held-back tail, when generation ended without a stop string."""
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
