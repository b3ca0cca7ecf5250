"""The byte tokenizer behind the `Tokenizer` interface (the embedded default).

Decisions:
- Ids and text are exactly `tidal.common.tokenizer.ByteTokenizer`'s (bytes 0..255,
  BOS=256, EOS=257, PAD=258): this adapter delegates to it rather than copying it, so the
  tiny default model, its checkpoints and every test written against the old class keep
  their ids. `tidal.common` cannot import this package (it would make the shared runtime
  depend on `tokenizers` and jinja2 and create a package cycle), so the old module stays
  the codec and this one adds the interface; once the services type against `Tokenizer`
  the old module can fold into this one.
- Plain `encode` never treats text as special: "<eos>" typed by a user is five bytes, as
  before. Only `encode_chat` maps the template's markers "<bos>" and "<eos>" (the strings
  `decode(skip_special=False)` already prints) to BOS and EOS, so
  `decode(encode_chat(m), skip_special=False) == apply_chat_template(m)`.
- The built-in template is ChatML-like but spelled in bytes, with EOS ending each turn:
  `<bos><|user|>\\nHi<eos><|assistant|>\\n`. EOS is therefore both the end of sequence and
  the end of turn, so generation stops where it does today.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tidal.common.tokenizer import ByteTokenizer as ByteCodec
from tidal.text.chat_template import ChatTemplate
from tidal.text.protocol import ChatEncoding, Message

BOS_TEXT = "<bos>"
EOS_TEXT = "<eos>"

BYTE_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_MARKERS = re.compile(f"({re.escape(BOS_TEXT)}|{re.escape(EOS_TEXT)})")


class ByteTokenizer(ChatEncoding):
    """Bytes 0..255 plus BOS=256, EOS=257, PAD=258, with a built-in chat template."""

    def __init__(self) -> None:
        self._codec = ByteCodec()
        self._template = ChatTemplate(
            BYTE_CHAT_TEMPLATE,
            origin="the byte tokenizer",
            special_tokens={"bos_token": BOS_TEXT, "eos_token": EOS_TEXT},
        )

    @property
    def name(self) -> str:
        return "byte"

    @property
    def vocab_size(self) -> int:
        return ByteCodec.vocab_size

    @property
    def bos_id(self) -> int:
        return ByteCodec.bos_id

    @property
    def eos_id(self) -> int:
        return ByteCodec.eos_id

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return (ByteCodec.eos_id,)

    @property
    def pad_id(self) -> int:
        return ByteCodec.pad_id

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset({ByteCodec.bos_id, ByteCodec.eos_id, ByteCodec.pad_id})

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self._codec.encode(text, add_bos=add_special_tokens)

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        return self._codec.decode(ids, skip_special=skip_special)

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool,
        system_prompt: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        return self._template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            system_prompt=system_prompt,
            tools=tools,
            **template_kwargs,
        )

    def encode_template_text(self, text: str) -> list[int]:
        """Ids of rendered chat text: "<bos>"/"<eos>" become BOS/EOS, the rest bytes."""
        ids: list[int] = []
        for part in _MARKERS.split(text):
            if part == BOS_TEXT:
                ids.append(ByteCodec.bos_id)
            elif part == EOS_TEXT:
                ids.append(ByteCodec.eos_id)
            else:
                ids.extend(part.encode("utf-8"))
        return ids

    def __repr__(self) -> str:
        return "ByteTokenizer()"
