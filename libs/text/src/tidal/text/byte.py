"""The byte tokenizer: the embedded default, ids 0..255 for bytes, then BOS, EOS, PAD.

Bytes need no trained merges and no model hub, round-trip any text exactly and keep the
tiny default model's embedding small. Plain `encode` never treats text as special (a
typed "<eos>" is five bytes); only chat text maps the template's "<bos>"/"<eos>" markers
to their ids, so `decode(encode_chat(m), skip_special=False) == apply_chat_template(m)`.
The built-in template closes every turn with EOS, so EOS also ends an assistant turn; it
lists tools as `name: description` lines and writes calls as `<call>name {json}</call>`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tidal.text.chat_template import ChatEncoding, ChatTemplate

BOS_TEXT, EOS_TEXT, PAD_TEXT = "<bos>", "<eos>", "<pad>"

BYTE_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|tools|>\n{% for tool in tools %}{% set f = tool.function or tool %}"
    "{{ f.name }}: {{ f.description }}\n{% endfor %}{{ eos_token }}{% endif %}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}"
    "{% for call in message.tool_calls or [] %}{% set f = call.function or call %}"
    "<call>{{ f.name }} {% if f.arguments is string %}{{ f.arguments }}"
    "{% else %}{{ f.arguments | tojson }}{% endif %}</call>{% endfor %}"
    "{{ eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

BOS_ID, EOS_ID, PAD_ID = 256, 257, 258
VOCAB_SIZE = 259
_SPECIAL_TEXT = {BOS_ID: BOS_TEXT.encode(), EOS_ID: EOS_TEXT.encode(), PAD_ID: PAD_TEXT.encode()}

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
                data.extend(_SPECIAL_TEXT.get(i, _SPECIAL_TEXT[PAD_ID]))
        return data.decode("utf-8", errors="replace")

    def chat_template(self, *, tools: object = None) -> ChatTemplate:
        return self._template

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
