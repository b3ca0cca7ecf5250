"""A tiny byte-level model fitted to one tool-using conversation, and its publication.

A random model writes no tool calls, so tests of the OpenAI endpoint's tools serve this:
plain supervised steps (a few seconds on CPU) on one conversation in the byte template,
where the assistant calls `lookup`, reads the tool's result and answers, until greedy
decoding reproduces both assistant turns with a wide logit margin (so bf16 inference and a
KV cache's rounding pick the same tokens). It stands in for nothing of ours: the endpoint,
the engine and the parsers under test are the real ones.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM
from tidal.text.byte import ByteTokenizer
from tidal.weights.client import WeightSyncClient
from tidal.weights.folder import write_version

MODEL = "tiny-tools"
TOK = ByteTokenizer()
ARGS = DecoderArgs(
    vocab_size=264, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=256
)
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "the value of a key",
            "strict": True,  # what the client's stream helper asks to parse the arguments
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
        },
    }
]
ASK = {"role": "user", "content": "What is the value of alpha?"}
ARGUMENTS = {"key": "alpha"}
RESULT = "7302"
ANSWER = "The value is 7302."


def demonstration() -> tuple[list[int], list[tuple[int, int]]]:
    """The conversation's ids and the spans of the two assistant turns in them."""
    call = {"type": "function", "function": {"name": "lookup", "arguments": ARGUMENTS}}
    turns = [
        ASK,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": RESULT},
        {"role": "assistant", "content": ANSWER},
    ]

    def length(n: int, *, prompt: bool) -> int:
        return len(TOK.encode_chat(turns[:n], add_generation_prompt=prompt, tools=TOOLS))

    ids = TOK.encode_chat(turns, add_generation_prompt=False, tools=TOOLS)
    spans = [(length(1, prompt=True), length(2, prompt=False))]
    spans.append((length(3, prompt=True), len(ids)))
    return ids, spans


@functools.cache
def trained_weights() -> dict[str, torch.Tensor]:
    """Weights that reproduce both assistant turns greedily, with a wide margin."""
    torch.manual_seed(0)
    model = DecoderLM(ARGS)
    model.init_weights(std=0.1)
    ids, spans = demonstration()
    tokens = torch.tensor([ids])  # (1, T)
    positions = torch.arange(len(ids))[None]  # (1, T)
    targets = torch.full_like(tokens, -100)
    for start, end in spans:
        targets[0, start:end] = tokens[0, start:end]
    inputs, labels = tokens[:, :-1], targets[:, 1:]  # predict token t from tokens < t
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(500):
        logits = model(inputs, positions[:, :-1])  # (1, T-1, V)
        if _margin(logits.detach()[0], labels[0]) > 4.0:
            break
        loss = F.cross_entropy(logits[0], labels[0], ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    else:
        raise AssertionError("the demonstration was not fitted in 500 steps")
    return {k: v.detach() for k, v in model.state_dict().items() if k != "lm_head.weight"}


def _margin(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Smallest lead of the target logit over the best other one, at trained positions."""
    at = labels >= 0
    rows, want = logits[at], labels[at]  # (N, V), (N,)
    target = rows.gather(1, want[:, None])[:, 0]
    others = rows.scatter(1, want[:, None], float("-inf")).max(dim=1).values
    return float((target - others).min())


async def publish_trained(weightsync: Any) -> None:
    """Version 0 of the fitted model, published to the (test's) weight-sync service."""
    manifest = write_version(
        weightsync.root,
        version=0,
        step=0,
        state_dict=trained_weights(),
        config=ARGS.to_hf_config(),
    )
    client = WeightSyncClient(weightsync.address, security=PLAINTEXT_LOOPBACK)
    await client.publish(manifest)
    await client.close()
