"""One completion's text, piece by piece, split into content and the tool calls in it.

The calls are read by the served template's parser (`tidal.text.tool_calls`, the one the
orchestrator uses); this module only finds where a call starts and ends. A call is sent
once it is closed and checked, so a malformed one (bad JSON, an unknown tool, arguments
off its schema, never closed) is sent as content instead. Text that may be the start of
a call marker is held back, and so is whitespace that may only separate content from a
call, so the streamed pieces join to what one push of the whole text returns.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import SchemaError
from referencing.exceptions import Unresolvable

from tidal.text.tool_calls import InvalidCall, ParsedTurn, ToolCall, ToolCallParser


@dataclass(frozen=True)
class StreamedCall:
    """A checked call: its position among the completion's calls and its id."""

    index: int
    id: str
    call: ToolCall


class ToolCallStream:
    """Content and calls of one completion; `push` each piece, `last=True` for the end."""

    def __init__(self, parser: ToolCallParser, tools: Sequence[Mapping[str, Any]]) -> None:
        self.parser, self.tools = parser, tools
        # Tagged formats (hermes, byte) mark each call; the rest (llama3_json) make the
        # whole turn either calls or content, decided at its first non-blank character.
        self.open_tag: str | None = getattr(parser, "open_tag", None)
        self.close_tag: str = getattr(parser, "close_tag", "")
        self.calls = 0
        self._text = ""  # received, not yet sent or resolved
        self._blank = ""  # trailing whitespace of sent content, held back
        self._after_call = False  # whitespace right after a call is dropped
        self._close_from = 0  # where the open call's close tag may start, at the earliest
        self._whole_turn: bool | None = None

    def push(self, piece: str, *, last: bool) -> tuple[str, list[StreamedCall]]:
        """The content to send for this piece, and the calls it completed."""
        self._text += piece
        if self.open_tag is None:
            return self._push_whole_turn(last)
        content: list[str] = []
        calls: list[StreamedCall] = []
        while True:
            start = self._text.find(self.open_tag)
            if start < 0:
                keep = 0 if last else _marker_prefix(self._text, self.open_tag)
                content.append(self._content(self._text[: len(self._text) - keep]))
                self._text = self._text[len(self._text) - keep :]
                break
            scan = max(start + len(self.open_tag), self._close_from if start == 0 else 0)
            end = self._text.find(self.close_tag, scan)
            if end < 0 and not last:
                content.append(self._content(self._text[:start]))
                self._text = self._text[start:]
                self._close_from = len(self._text) - len(self.close_tag) + 1
                break
            self._close_from = 0
            content.append(self._content(self._text[:start]))
            stop = len(self._text) if end < 0 else end + len(self.close_tag)
            call_text, self._text = self._text[start:stop], self._text[stop:]
            content.append(self._resolve(call_text, calls))
        if last:
            content.append(self._end())
        return "".join(content), calls

    def _push_whole_turn(self, last: bool) -> tuple[str, list[StreamedCall]]:
        if self._whole_turn is None:
            self._whole_turn = self._opens_calls(self._text.lstrip())
        if not self._whole_turn and (self._whole_turn is False or last):
            text, self._text = self._text, ""
            return text, []
        if not last:
            return "", []
        text, self._text = self._text, ""
        turn = self._parse(text)
        calls = [self._streamed(c) for c in turn.calls if isinstance(c, ToolCall)]
        invalid = "".join(c.text for c in turn.calls if isinstance(c, InvalidCall))
        return (invalid if calls else text), calls

    def _opens_calls(self, head: str) -> bool | None:
        """Whether a turn starting with `head` is calls; None while it cannot tell."""
        tag = getattr(self.parser, "python_tag", "")
        if head.startswith("{") or (tag and head.startswith(tag)):
            return True
        return None if not head or (tag and tag.startswith(head)) else False

    def _content(self, text: str) -> str:
        """Text outside calls; a blank run at its end is held (a call may follow it)."""
        if self._after_call:
            text = text.lstrip()
            self._after_call = not text
        stripped = text.rstrip()
        if not stripped:
            self._blank += text
            return ""
        out, self._blank = self._blank + stripped, text[len(stripped) :]
        return out

    def _resolve(self, call_text: str, calls: list[StreamedCall]) -> str:
        """A call's text: a checked call (content "") or, when it cannot run, content."""
        turn = self._parse(call_text)
        if len(turn.calls) == 1 and isinstance(turn.calls[0], ToolCall):
            calls.append(self._streamed(turn.calls[0]))
            self._blank, self._after_call = "", True
            return ""
        blank, self._blank, self._after_call = self._blank, "", False
        return blank + call_text

    def _parse(self, text: str) -> ParsedTurn:
        try:
            return self.parser.parse(text, self.tools)
        except (SchemaError, Unresolvable) as e:  # a request's schema the parser cannot use
            return ParsedTurn("", (InvalidCall(text, f"cannot check the call: {e}"),))

    def _streamed(self, call: ToolCall) -> StreamedCall:
        self.calls += 1
        return StreamedCall(self.calls - 1, f"call_{uuid.uuid4().hex[:24]}", call)

    def _end(self) -> str:
        """The completion ended: held whitespace is content only in a turn without calls."""
        blank, self._blank = self._blank, ""
        return "" if self.calls else blank


def _marker_prefix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0
