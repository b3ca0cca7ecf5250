"""Tiny GGUF files written with `gguf`'s own writer, for the import tests: `header_only`
(a Llama-like header, a 4-token tokenizer, one tensor: enough for the refusals) and
`tiny_llama` (a complete 2-layer Llama with a byte-level BPE tokenizer, a ChatML template
and Q8_0 and F32 tensors: enough for a whole conversion in seconds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the gguf extra is not installed")

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOKENS = [*SPECIALS, *(chr(c) for c in range(ord("a"), ord("z") + 1)), "Ġ", "ab", "Ġa"]


def header_only(
    path: Path,
    arch: str,
    *,
    name: str = "tiny",
    tensor_type: str = "F32",
    tokenizer: str | None = "gpt2",
) -> Path:
    """A GGUF with a Llama-like header, a 4-token tokenizer and one 4x8 tensor of
    `tensor_type`."""
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(name)
    if tokenizer is not None:
        writer.add_tokenizer_model(tokenizer)
        writer.add_token_list(["a", "b", "c", "<|end|>"])
        writer.add_token_merges(["a b"])
        writer.add_eos_token_id(3)
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(4)
    qtype = gguf.GGMLQuantizationType[tensor_type]
    data = np.zeros((4, 8), dtype=np.int8 if tensor_type == "I8" else np.float32)
    writer.add_tensor("token_embd.weight", data, raw_dtype=qtype)
    _close(writer)
    return path


def tiny_llama(
    path: Path,
    *,
    dim: int = 32,
    ffn: int = 64,
    heads: int = 4,
    kv: int = 2,
    without: str | None = None,
) -> Path:
    """A complete 2-layer Llama (tied head, grouped-query attention), random weights, the
    q/k/gate/down projections and the embedding in Q8_0 (rows of 32), the rest F32; the
    tensor named `without` left out."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny")
    for add, value in (
        (writer.add_block_count, 2), (writer.add_context_length, 64),
        (writer.add_embedding_length, dim), (writer.add_feed_forward_length, ffn),
        (writer.add_head_count, heads), (writer.add_head_count_kv, kv),
        (writer.add_rope_dimension_count, dim // heads), (writer.add_rope_freq_base, 1e4),
        (writer.add_layer_norm_rms_eps, 1e-5), (writer.add_vocab_size, len(TOKENS)),
    ):  # fmt: skip
        add(value)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3] * len(SPECIALS) + [1] * (len(TOKENS) - len(SPECIALS)))
    writer.add_token_merges(["a b", "Ġ a"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)
    rng = np.random.default_rng(0)

    def tensor(name: str, shape: tuple[int, ...], *, q8: bool = False) -> None:
        x = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        if name == without:
            return
        if q8:
            q8_0 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(x, q8_0), raw_dtype=q8_0)
        else:
            writer.add_tensor(name, x)

    tensor("token_embd.weight", (len(TOKENS), dim), q8=True)
    for i in range(2):
        tensor(f"blk.{i}.attn_norm.weight", (dim,))
        tensor(f"blk.{i}.attn_q.weight", (dim, dim), q8=True)
        tensor(f"blk.{i}.attn_k.weight", (kv * dim // heads, dim), q8=True)
        tensor(f"blk.{i}.attn_v.weight", (kv * dim // heads, dim))
        tensor(f"blk.{i}.attn_output.weight", (dim, dim))
        tensor(f"blk.{i}.ffn_norm.weight", (dim,))
        tensor(f"blk.{i}.ffn_gate.weight", (ffn, dim), q8=True)
        tensor(f"blk.{i}.ffn_up.weight", (ffn, dim))
        tensor(f"blk.{i}.ffn_down.weight", (dim, ffn), q8=True)
    tensor("output_norm.weight", (dim,))
    _close(writer)
    return path


def _close(writer: object) -> None:
    writer.write_header_to_file()  # type: ignore[attr-defined]
    writer.write_kv_data_to_file()  # type: ignore[attr-defined]
    writer.write_tensors_to_file()  # type: ignore[attr-defined]
    writer.close()  # type: ignore[attr-defined]
