"""`reasoning_content` of chat choices: a reasoning model's thinking split off its answer.

One `ReasoningStream` per choice, fed the text the choice sends (after stop strings are
cut), so a streamed choice's `reasoning_content` and `content` deltas join to the
unstreamed message's. Whether the prompt opened the block (a template that writes
`<think>` into the generation prompt) is read from the prompt's own text. Without
reasoning markers (`[inference.http] reasoning_parser`), messages are only `content`.
"""

from __future__ import annotations

from typing import Any

from tidal.text.reasoning import ReasoningParser, ReasoningStream
from tidal.text.tokenizer import Tokenizer


class ChoiceReasoning:
    """Splits the text of each of a request's choices into reasoning and content."""

    def __init__(
        self, parser: ReasoningParser, tokenizer: Tokenizer, prompt_ids: list[int], n: int
    ) -> None:
        self.active = parser.markers is not None
        opened = self.active and parser.opens(tokenizer.decode(prompt_ids, skip_special=False))
        self._streams: list[ReasoningStream | None] = [
            parser.stream(opened=opened) for _ in range(n)
        ]

    def message(self, index: int, text: str, *, last: bool, stream: bool) -> dict[str, Any]:
        """The `content` (and `reasoning_content`) of this piece of choice `index`'s text.

        A whole message always carries `reasoning_content` (null without a reasoning block);
        a streamed delta carries it when it has reasoning text."""
        splitter = self._streams[index]
        if splitter is None:
            return {"content": text}
        reasoning, answer = splitter.push(text)
        if last:
            more_reasoning, more_answer = splitter.finish()
            reasoning, answer = reasoning + more_reasoning, answer + more_answer
        if stream:
            return {"content": answer, **({"reasoning_content": reasoning} if reasoning else {})}
        return {"content": answer, "reasoning_content": reasoning if splitter.thought else None}
