"""A byte-level tokenizer with three special tokens, shared by every service.

Why bytes: the embedded default must run with no model hub, and a byte vocabulary needs
no trained merges, round-trips any text exactly, and keeps the tiny default model's
embedding small. Ids 0..255 are bytes; BOS, EOS and PAD follow. Pure Python, no torch,
so the orchestrator can tokenize prompts and decode completions itself.
"""

from __future__ import annotations

from collections.abc import Iterable


class ByteTokenizer:
    """Bytes 0..255 plus BOS=256, EOS=257, PAD=258."""

    bos_id = 256
    eos_id = 257
    pad_id = 258
    vocab_size = 259

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = True) -> str:
        data = bytearray()
        for i in ids:
            if 0 <= i < 256:
                data.append(i)
            elif not skip_special:
                data.extend({self.bos_id: b"<bos>", self.eos_id: b"<eos>"}.get(i, b"<pad>"))
        return data.decode("utf-8", errors="replace")


def get_tokenizer(name: str = "byte") -> ByteTokenizer:
    """Transitional (issue 15): the byte tokenizer for "byte" or "auto" while the services
    move to `tidal.text.load_tokenizer`, which reads model folders; removed after."""
    if name not in ("byte", "auto"):
        raise ValueError(f"unknown tokenizer {name!r}; supported: ['auto', 'byte']")
    return ByteTokenizer()
