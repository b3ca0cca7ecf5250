"""A reasoning model's completion split into its reasoning and its answer.

A thinking model writes `<think>…</think>` (or its tokenizer's own markers) before the
answer; a template may open the block in the prompt, so the completion holds only
`…</think>`. `ReasoningStream` splits text as it arrives and `ReasoningParser.split` is that
stream fed the whole text, so streamed and whole splits agree by construction. Text that
does not open with the start marker (and follows no opened block) is all answer, verbatim;
an unclosed block is all reasoning with an empty answer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tidal.common.errors import ConfigError
from tidal.text.byte import ByteTokenizer
from tidal.text.chat_template import PROBE_CHAT, ChatTemplateError
from tidal.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)
ReasoningMode = Literal["auto", "none", "think"]
THINK = ("<think>", "</think>")
RESPONSE_TEMPLATE_FIELDS = ("reasoning_content", "thinking", "reasoning")
"""Names a `response_template` (tokenizer_config.json, as `transformers` reads it) gives
its reasoning field."""


@dataclass(frozen=True)
class Reasoned:
    """One completion split: the reasoning (stripped), the answer, and whether the text
    opened a reasoning block (`thought`) and closed it (`closed`)."""

    reasoning: str
    answer: str
    thought: bool = False
    closed: bool = False

    @property
    def well_formed(self) -> bool:
        """Reasoning, then a closed block, then a non-empty answer."""
        return self.thought and self.closed and bool(self.answer.strip())


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningStream:
    """Splits one completion piece by piece: `push` returns (reasoning, answer) deltas,
    holding back what the next piece may change (a partial marker, trailing whitespace)."""

    def __init__(self, start: str, end: str, *, opened: bool) -> None:
        self.start, self.end = start, end
        self.state = "reasoning" if opened else "start"
        self.thought, self.closed = opened, False
        self._buf = ""
        self._reasoning_sent = False
        self.reasoning, self.answer = "", ""

    def push(self, piece: str) -> tuple[str, str]:
        self._buf += piece
        return self._advance(final=False)

    def finish(self) -> tuple[str, str]:
        """The text still held back, once the completion ended."""
        return self._advance(final=True)

    def result(self) -> Reasoned:
        return Reasoned(self.reasoning, self.answer, self.thought, self.closed)

    def _advance(self, *, final: bool) -> tuple[str, str]:
        reasoning, answer = "", ""
        while True:
            if self.state == "start":
                lead = self._buf.lstrip()
                if lead.startswith(self.start):
                    self._buf, self.state, self.thought = lead[len(self.start) :], "reasoning", True
                    continue
                if self.start.startswith(lead) and not final:
                    break  # whitespace or a partial start marker: not decided yet
                self.state = "answer"
            elif self.state == "reasoning":
                at = self._buf.find(self.end)
                if at >= 0:
                    reasoning += self._reasoning_piece(self._buf[:at].rstrip())
                    self._buf, self.state, self.closed = (
                        self._buf[at + len(self.end) :],
                        "lead",
                        True,
                    )
                    continue
                keep = 0 if final else _partial_suffix(self._buf, self.end)
                body = self._buf[: len(self._buf) - keep]
                safe = body.rstrip()
                reasoning += self._reasoning_piece(safe)
                self._buf = "" if final else self._buf[len(safe) :]
                break
            elif self.state == "lead":  # whitespace between the block and the answer
                self._buf = self._buf.lstrip()
                if not self._buf:
                    break
                self.state = "answer"
            else:
                answer, self._buf = answer + self._buf, ""
                break
        self.reasoning += reasoning
        self.answer += answer
        return reasoning, answer

    def _reasoning_piece(self, text: str) -> str:
        if not self._reasoning_sent:
            text = text.lstrip()
        self._reasoning_sent = self._reasoning_sent or bool(text)
        return text


@dataclass(frozen=True)
class ReasoningParser:
    """The markers of one template's reasoning blocks; `None` markers: no reasoning (every
    completion is all answer)."""

    markers: tuple[str, str] | None = None

    def opens(self, prompt_text: str) -> bool:
        """Whether `prompt_text` ends inside a reasoning block the template opened."""
        if self.markers is None:
            return False
        start, end = self.markers
        at = prompt_text.rfind(start)
        return at >= 0 and prompt_text.find(end, at) < 0

    def stream(self, *, opened: bool = False) -> ReasoningStream | None:
        """A splitter for one completion (None without markers: all of it is answer)."""
        return None if self.markers is None else ReasoningStream(*self.markers, opened=opened)

    def split(self, text: str, *, opened: bool = False) -> Reasoned:
        """`text` as reasoning and answer (`opened`: the prompt opened the block)."""
        stream = self.stream(opened=opened)
        if stream is None:
            return Reasoned("", text)
        stream.push(text)
        stream.finish()
        return stream.result()


def markers_of_response_template(template: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """The literal open/close of a `response_template`'s reasoning field, if it has one."""
    fields = (template or {}).get("fields")
    if not isinstance(fields, Mapping):
        return None
    for name in RESPONSE_TEMPLATE_FIELDS:
        field = fields.get(name)
        if isinstance(field, Mapping):
            start, end = field.get("open"), field.get("close")
            start = start[0] if isinstance(start, list) and start else start
            end = end[0] if isinstance(end, list) and end else end
            if isinstance(start, str) and isinstance(end, str) and start and end:
                return start, end
    return None


def detect_markers(tokenizer: Tokenizer) -> tuple[str, str] | None:
    """A tokenizer's reasoning markers: its `response_template`'s reasoning field, else
    `<think>`/`</think>` where they are tokens of its vocabulary or its chat template
    writes them; None for the byte tokenizer and for templates without reasoning."""
    if isinstance(tokenizer, ByteTokenizer):
        return None
    files = getattr(tokenizer, "files", None)
    found = markers_of_response_template(getattr(files, "response_template", None))
    if found is not None:
        return found
    token_to_id = getattr(tokenizer, "token_to_id", None)
    if token_to_id is not None and all(token_to_id(m) is not None for m in THINK):
        return THINK
    try:
        source = tokenizer.chat_template().source  # type: ignore[attr-defined]
    except (AttributeError, ChatTemplateError):
        return None
    return THINK if all(m in source for m in THINK) else None


def reasoning_parser(tokenizer: Tokenizer, mode: ReasoningMode = "auto") -> ReasoningParser:
    """The parser `mode` names: "none" (no reasoning), "think" (`<think>…</think>`), or
    "auto" (`detect_markers`). Markers that are special tokens are logged: decoding drops
    them, so the split cannot see them."""
    if mode == "auto":
        markers = detect_markers(tokenizer)
    elif mode in ("none", "think"):
        markers = THINK if mode == "think" else None
    else:
        raise ConfigError(f"reasoning parser {mode!r}: choose auto, none or think")
    token_to_id = getattr(tokenizer, "token_to_id", None)
    if markers is not None and token_to_id is not None:
        dropped = [m for m in markers if token_to_id(m) in tokenizer.special_ids]
        if dropped:
            log.warning(
                "reasoning markers %s of tokenizer %s are special tokens, which decoding "
                "drops: completions are not split and are scored whole",
                dropped,
                tokenizer.name,
            )
    return ReasoningParser(markers)


def generation_opens(parser: ReasoningParser, tokenizer: Tokenizer, **template_kwargs: Any) -> bool:
    """Whether the chat template's generation prompt opens a reasoning block (so every
    completion starts inside it), found by rendering a probe chat."""
    if parser.markers is None:
        return False
    try:
        text = tokenizer.apply_chat_template(
            PROBE_CHAT[:1], add_generation_prompt=True, **template_kwargs
        )
    except ChatTemplateError:
        return False
    return parser.opens(text)
