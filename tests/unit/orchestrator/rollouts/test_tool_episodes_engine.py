"""A tool episode against a real native engine serving a tiny byte-vocabulary model: the
ids the trainer gets are the engine's generated ids (mask 1, their logprobs and versions)
with the tool messages' ids between them (mask 0), and every turn's context is a prefix."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest
import torch

from tidal.inference.config import InferenceConfig
from tidal.inference.native import NativeEngine
from tidal.inference.sampling import SamplingParams
from tidal.models.args import DecoderArgs
from tidal.models.layers import DecoderLM
from tidal.orchestrator.completions import Completion
from tidal.orchestrator.config import ChatConfig, ToolsConfig
from tidal.orchestrator.rollouts.episodes import CompleteFn, run_episode
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.rollouts.tool_execution import ToolUse
from tidal.orchestrator.task_config import LookupTaskConfig
from tidal.orchestrator.tasks import build_task
from tidal.text.byte import VOCAB_SIZE, ByteTokenizer
from tidal.text.tool_calls import ParsedTurn, ToolCall, ToolCallParser

TOK = ByteTokenizer()
STOP = (*TOK.eos_ids, *range(0, 256, 2))  # an untrained model's turns end within a few ids
ARGS = DecoderArgs(
    vocab_size=VOCAB_SIZE, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64,
    max_seq_len=512,
)  # fmt: skip


class CallsEveryTurn(ToolCallParser):
    """Reads every turn of an untrained model (random text) as a call of `lookup(key)`,
    so the episode runs its whole turn budget through the real engine."""

    name = "calls-every-turn"

    def __init__(self, key: str) -> None:
        self.key = key

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]]) -> ParsedTurn:
        return ParsedTurn(text, (ToolCall("lookup", {"key": self.key}),))


@contextlib.asynccontextmanager
async def serving(max_model_len: int | None = None) -> AsyncIterator[NativeEngine]:
    """A native engine serving a random tiny model as version 3."""
    torch.manual_seed(0)
    model = DecoderLM(ARGS)
    model.init_weights(std=0.02)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    defaults = InferenceConfig()
    engine = NativeEngine(
        device=torch.device("cpu"),
        dtype=torch.float32,
        max_batch_size=8,
        max_queue=8,
        max_step_tokens=defaults.max_step_tokens,
        kv_cache_mb=16,
        max_model_len=max_model_len,
    )
    await engine.start()
    try:
        await engine.update_weights(3, ARGS.to_hf_config(), state)
        yield engine
    finally:
        await engine.close()


@pytest.fixture
async def engine() -> AsyncIterator[NativeEngine]:
    async with serving() as engine:
        yield engine


def _engine_policy(
    engine: NativeEngine, sent: list[list[int]], generated: list[list[int]]
) -> CompleteFn:
    """Inference for `run_episode`: one sampled turn of at most 12 tokens per call."""

    async def complete(context: list[int], **kw: Any) -> list[Completion]:
        sent.append(list(context))
        params = SamplingParams(
            max_tokens=12, temperature=1.0, n=1, seed=kw["seed"], stop_token_ids=STOP
        )
        (out,) = [c async for c in engine.generate(context, params)]
        generated.append(list(out.token_ids))
        return [
            Completion(
                0,
                tuple(out.token_ids),
                tuple(out.logprobs),
                tuple(out.policy_versions),
                out.finish_reason == "stop",
            )
        ]

    return complete


async def test_a_tool_episode_on_a_real_engine_keeps_the_ids_the_policy_saw(
    engine: NativeEngine,
) -> None:
    prompts = PromptRenderer.from_config(TOK, ChatConfig(template="on"))
    task = build_task(LookupTaskConfig(), seed=0)
    problem = task.problem(0)
    sent: list[list[int]] = []
    generated: list[list[int]] = []
    complete = _engine_policy(engine, sent, generated)
    prompt = prompts.prompt_ids(problem)
    tools = ToolUse.of(task.tools, CallsEveryTurn(problem.prompt), ToolsConfig(max_turns=3))
    episode = await run_episode(
        complete, task, problem, prompt, prompts.episode_turns(problem), TOK,
        index=0, temperature=1.0, seed=5, request_id="r", tools=tools,
    )  # fmt: skip
    ids = [*prompt, *episode.token_ids]
    assert all(ids[: len(context)] == context for context in sent)
    trained = [t for t, m in zip(episode.token_ids, episode.loss_mask, strict=True) if m == 1]
    assert trained == [t for turn in generated for t in turn]
    assert len(episode.policy_versions) == len(trained) and set(episode.policy_versions) == {3}
    assert len(sent) == 3 and episode.tools.calls == 2 and episode.stopped
    # between the policy's turns: the closing of its turn (unless it wrote the end-of-turn
    # token itself), its tool message and the next assistant header, all under mask 0
    for k in (1, 2):
        between = sent[k][len(sent[k - 1]) + len(generated[k - 1]) :]
        closing = "" if generated[k - 1][-1] == TOK.eos_id else "<eos>"
        expected = f"{closing}<|tool|>\n{problem.reference}<eos><|assistant|>\n"
        assert TOK.decode(between, skip_special=False) == expected


async def test_an_episode_ends_before_its_context_outgrows_the_served_model() -> None:
    prompts = PromptRenderer.from_config(TOK, ChatConfig(template="on"))
    task = build_task(LookupTaskConfig(), seed=0)
    problem = task.problem(0)
    prompt = prompts.prompt_ids(problem)
    sent: list[list[int]] = []
    generated: list[list[int]] = []
    async with serving(max_model_len=len(prompt) + 40) as engine:
        tools = ToolUse.of(task.tools, CallsEveryTurn(problem.prompt), ToolsConfig(max_turns=50))
        episode = await run_episode(
            _engine_policy(engine, sent, generated), task, problem, prompt,
            prompts.episode_turns(problem), TOK, index=0, temperature=1.0, seed=5,
            request_id="r", tools=tools, max_context=engine.max_seq_len,
        )  # fmt: skip
        context = engine.max_seq_len
    # the turn budget was far off: the context ended it, before inference had to refuse it
    assert episode.context_full and 2 <= len(sent) < 50
    assert all(len(c) < context for c in sent)
    assert len(prompt) + len(episode.token_ids) < context
    # it ends with the policy's last turn; that turn's calls ran but their results, which
    # did not fit, are not in the episode
    assert episode.loss_mask[-1] == 1.0 and episode.tools.calls == len(sent)
    trained = [t for t, m in zip(episode.token_ids, episode.loss_mask, strict=True) if m == 1]
    assert trained == [t for turn in generated for t in turn]
