"""The byte tokenizer behind the `Tokenizer` interface (the embedded default).

Decisions:
- Why bytes: the embedded default must run with no model hub, and a byte vocabulary needs
  no trained merges, round-trips any text exactly, and keeps the tiny default model's
  embedding small. Ids 0..255 are bytes; BOS=256, EOS=257, PAD=258 follow (the ids of
  the codec that used to live in `tidal.common.tokenizer`, folded in here once every
  service typed against `Tokenizer`, so the default model's checkpoints keep their ids).
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

BOS_ID, EOS_ID, PAD_ID = 256, 257, 258
VOCAB_SIZE = 259
_SPECIAL_TEXT = {BOS_ID: b"<bos>", EOS_ID: b"<eos>", PAD_ID: b"<pad>"}

_MARKERS = re.compile(f"({re.escape(BOS_TEXT)}|{re.escape(EOS_TEXT)})")


class ByteTokenizer(ChatEncoding):
    """Bytes 0..255 plus BOS=256, EOS=257, PAD=258, with a built-in chat template."""

    def __init__(self) -> None:
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
        return VOCAB_SIZE

    @property
    def bos_id(self) -> int:
        return BOS_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return (EOS_ID,)

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset({BOS_ID, EOS_ID, PAD_ID})

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_special_tokens else ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        data = bytearray()
        for i in ids:
            if 0 <= i < 256:
                data.append(i)
            elif not skip_special:
                data.extend(_SPECIAL_TEXT.get(i, b"<pad>"))
        return data.decode("utf-8", errors="replace")

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
                ids.append(BOS_ID)
            elif part == EOS_TEXT:
                ids.append(EOS_ID)
            else:
                ids.extend(part.encode("utf-8"))
        return ids

    def __repr__(self) -> str:
        return "ByteTokenizer()"
