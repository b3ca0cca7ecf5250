"""`Tokenizer`: the one interface every service types against where text meets ids.

Decisions:
- A `typing.Protocol`, not a base class: the byte tokenizer and the Hugging Face one share
  no code beyond the chat-template renderer, and tests may pass any object with these
  members. `runtime_checkable` so a loader's result can be asserted cheaply.
- `encode(text, add_special_tokens=...)` follows Hugging Face's meaning: the tokenizer's
  own specials around plain text (Llama's BOS, the byte tokenizer's BOS, nothing for
  Qwen). Chat prompts are rendered by the template, which writes its specials itself,
  so `encode_chat` encodes the rendered text with `add_special_tokens=False` while still
  matching special-token strings in it (what `transformers` does).
- `eos_ids` is every id that ends generation: the tokenizer's EOS, the ids of
  `generation_config.json`'s `eos_token_id` (int or list) and the chat template's
  end-of-turn token, deduplicated, the tokenizer's own EOS first. `eos_id` is that first
  one: the id appended to a plain (non-chat) SFT completion.
- `pad_id` always exists: when a folder names no pad token, the EOS id pads (padding is
  masked out, so any id in range works; EOS is what `transformers` users usually pick).
- `special_ids` is the set of ids `decode(skip_special=True)` drops; samplers and loss
  masks can use it without knowing token strings.
- `name` says where the tokenizer came from ("byte", or the folder), for logs.
- Messages are plain dicts (`role`, `content`, optional `reasoning_content`,
  `tool_calls`, ...), the shape chat templates read; `None` values are dropped before
  rendering, as `transformers` does, because templates test for presence.
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


class ChatEncoding:
    """`encode_chat` for a tokenizer class that has `apply_chat_template` and
    `encode_template_text` (both tokenizers inherit it; the Protocol stays structural)."""

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool,
        system_prompt: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        raise NotImplementedError

    def encode_template_text(self, text: str) -> list[int]:
        raise NotImplementedError

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
        text = self.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            system_prompt=system_prompt,
            tools=tools,
            **template_kwargs,
        )
        return self.encode_template_text(text)
