"""`Tokenizer`: the one interface every service types against where text meets ids.

A structural `typing.Protocol`, not a base class: the byte and Hugging Face tokenizers
share only chat encoding (`chat_template.ChatEncoding`), and tests may pass any object
with these members. Meanings follow Hugging Face's (`add_special_tokens`, chat text
encoded with the template's own specials), so ids agree with `transformers`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

Message = Mapping[str, Any]
"""One chat message: `{"role": "system" | "user" | "assistant" | "tool", "content": ...}`."""


@runtime_checkable
class Tokenizer(Protocol):
    """Text ⇄ ids, special tokens and chat templates (byte or Hugging Face folder)."""

    @property
    def name(self) -> str:
        """Where this tokenizer came from, for logs ("byte", or a folder path)."""
        ...

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included: every id is `< vocab_size`."""
        ...

    @property
    def bos_id(self) -> int | None:
        """The beginning-of-sequence id, or None when the tokenizer has none (Qwen)."""
        ...

    @property
    def eos_id(self) -> int:
        """The tokenizer's own end-of-sequence id (first of `eos_ids`)."""
        ...

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Every id that ends generation, the tokenizer's EOS first."""
        ...

    @property
    def pad_id(self) -> int:
        """The id that pads; the EOS id when the tokenizer names no pad token."""
        ...

    @property
    def special_ids(self) -> frozenset[int]:
        """Ids `decode(skip_special=True)` drops (BOS, EOS, PAD, chat markers)."""
        ...

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Ids of `text`; `add_special_tokens` adds the tokenizer's own BOS/EOS."""
        ...

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        """Text of `ids`; special tokens dropped unless `skip_special=False`."""
        ...

    def encode_template_text(self, text: str) -> list[int]:
        """Ids of text a chat template wrote: its special-token strings become their ids
        and nothing is added (what `encode_chat` uses; the episode renderer encodes the
        new turns it appends with it)."""
        ...

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool,
        system_prompt: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The chat rendered as text by the tokenizer's template.

        `system_prompt` is prepended as a system message unless the messages open with
        one; `template_kwargs` (e.g. `enable_thinking=False`) reach the template."""
        ...

    def encode_chat(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool,
        system_prompt: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> list[int]:
        """Ids of `apply_chat_template(...)`: the template's own specials, nothing added."""
        ...
