"""Episodes with tools: calls parsed from the policy's text run concurrently under a
deadline, their results come back as tool messages, malformed calls are answered and
counted, and the trainer gets exactly the ids the policy saw with only its tokens trained."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tidal.common.errors import ConfigError
from tidal.orchestrator.completions import Completion, ToolStats
from tidal.orchestrator.config import ChatConfig, ToolsConfig
from tidal.orchestrator.rollouts.episodes import run_episode
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.rollouts.tool_execution import ToolUse
from tidal.orchestrator.task_config import LookupTaskConfig
from tidal.orchestrator.tasks import Problem, Task, build_task
from tidal.orchestrator.tasks.base import Tool
from tidal.orchestrator.tasks.lookup import KEY_SCHEMA, NOT_FOUND
from tidal.text.byte import ByteTokenizer
from tidal.text.hf_tokenizer import HFTokenizer
from tidal.text.tokenizer import Tokenizer
from tidal.text.tool_calls import tool_call_parser

from ....hf_folders import build_model_folder

TOK = ByteTokenizer()
BYTE_CHAT = PromptRenderer.from_config(TOK, ChatConfig(template="on"))


def _lookup_task() -> Task:
    return build_task(LookupTaskConfig(), seed=0)


def _policy(tokenizer: Tokenizer, turns: list[str], sent: list[list[int]]):  # type: ignore[no-untyped-def]
    """Stands in for inference: answers turn k with turns[k] and its end-of-turn token,
    recording every context it was sent."""
    end_of_turn = tokenizer.eos_ids[0]

    async def complete(context: list[int], **kwargs: object) -> list[Completion]:
        sent.append(list(context))
        text = tokenizer.encode(turns[len(sent) - 1], add_special_tokens=False)
        ids = (*text, end_of_turn)
        return [Completion(0, ids, (-0.5,) * len(ids), (4,) * len(ids), True)]

    return complete


async def _episode(
    prompts: PromptRenderer,
    task: Task,
    problem: Problem,
    turns: list[str],
    sent: list[list[int]],
    config: ToolsConfig | None = None,
) -> Completion:
    tools = ToolUse.of(task.tools, tool_call_parser(prompts.tokenizer), config or ToolsConfig())
    return await run_episode(
        _policy(prompts.tokenizer, turns, sent),
        task,
        problem,
        prompts.prompt_ids(problem),
        prompts.episode_turns(problem),
        prompts.tokenizer,
        index=0,
        temperature=1.0,
        seed=1,
        request_id="r",
        tools=tools,
    )


def _call(key: str) -> str:
    return f'<call>lookup {{"key": "{key}"}}</call>'


async def test_a_lookup_episode_reports_the_tool_result_and_scores_it() -> None:
    task = _lookup_task()
    problem = task.problem(0)
    key, value = problem.prompt, problem.reference
    sent: list[list[int]] = []
    episode = await _episode(BYTE_CHAT, task, problem, [_call(key), value], sent)
    assert len(sent) == 2
    second = TOK.decode(sent[1], skip_special=False)
    assert second.startswith("<bos><|tools|>\nlookup: value of a key\n<eos>")
    assert second.endswith(f"<|tool|>\n{value}<eos><|assistant|>\n")
    assert list(episode.turns) == [_call(key), value]
    assert episode.tools.calls == 1 and episode.tools.parse_failures == 0
    assert episode.tools.errors == 0 and episode.tools.seconds >= 0.0
    assert task.verify_turns(problem, list(episode.turns)) == 1.0


async def test_the_trainer_gets_the_ids_the_policy_saw_with_only_its_tokens_trained() -> None:
    task = _lookup_task()
    problem = task.problem(1)
    turns = [_call("zz"), _call(problem.prompt), problem.reference]
    sent: list[list[int]] = []
    episode = await _episode(BYTE_CHAT, task, problem, turns, sent)
    prompt = BYTE_CHAT.prompt_ids(problem)
    ids = [*prompt, *episode.token_ids]
    # each context the policy was sent is a prefix of what the trainer gets
    assert all(ids[: len(context)] == context for context in sent) and len(sent) == 3
    # the ids are: prompt, then (policy turn, tool message + next header) alternating
    policy = [[*TOK.encode(t, add_special_tokens=False), TOK.eos_id] for t in turns]
    tool_parts = [sent[k][len(sent[k - 1]) + len(policy[k - 1]) :] for k in (1, 2)]
    assert (
        TOK.decode(tool_parts[0], skip_special=False)
        == f"<|tool|>\n{NOT_FOUND}<eos><|assistant|>\n"
    )
    expected = [*policy[0], *tool_parts[0], *policy[1], *tool_parts[1], *policy[2]]
    assert list(episode.token_ids) == expected
    mask = [1.0] * len(policy[0]) + [0.0] * len(tool_parts[0]) + [1.0] * len(policy[1])
    mask += [0.0] * len(tool_parts[1]) + [1.0] * len(policy[2])
    assert list(episode.loss_mask) == mask
    assert len(episode.policy_versions) == sum(map(len, policy))
    env = [lp for lp, m in zip(episode.logprobs, episode.loss_mask, strict=True) if m == 0]
    assert all(lp == 0.0 for lp in env)


async def test_malformed_and_unknown_calls_are_answered_with_errors_and_counted() -> None:
    task = _lookup_task()
    problem = task.problem(2)
    bad = (
        '<call>lookup {"key": </call><call>search {"q": "x"}</call>'
        + '<call>lookup {"k": 1}</call>'
    )
    sent: list[list[int]] = []
    episode = await _episode(BYTE_CHAT, task, problem, [bad, "abc"], sent)
    reply = TOK.decode(sent[1][len(sent[0]) :], skip_special=False)
    assert reply.count("<|tool|>\nerror: ") == 3
    assert "not JSON" in reply and "unknown tool 'search'" in reply
    assert "'key' is a required property" in reply
    assert episode.tools == ToolStats(3, 3, 0, episode.tools.seconds)
    assert len(episode.turns) == 2


def _slow_task(delay_s: float, *, fail: bool = False) -> Task:
    async def wait(problem: Problem, key: str) -> str:
        await asyncio.sleep(delay_s)
        if fail:
            raise RuntimeError("backend down")
        return key.upper()

    task = _lookup_task()
    task.tools = (Tool("lookup", "value of a key", KEY_SCHEMA, wait),)
    return task


async def test_calls_of_one_turn_run_concurrently() -> None:
    task = _slow_task(0.3)
    problem = task.problem(3)
    turns = [_call("ab") + _call("cd") + _call("ef"), "done"]
    started = time.monotonic()
    sent: list[list[int]] = []
    episode = await _episode(BYTE_CHAT, task, problem, turns, sent)
    assert time.monotonic() - started < 0.8  # three 0.3 s calls side by side, not 0.9 s
    reply = TOK.decode(sent[1][len(sent[0]) :], skip_special=False)
    assert reply.index("AB") < reply.index("CD") < reply.index("EF")  # in the order called
    assert episode.tools.calls == 3 and episode.tools.seconds >= 0.3


@pytest.mark.parametrize(
    ("task", "error"),
    [(_slow_task(5.0), "lookup timed out after 0.2s"), (_slow_task(0, fail=True), "RuntimeError")],
)
async def test_a_slow_or_failing_tool_is_an_error_result(task: Task, error: str) -> None:
    problem = task.problem(4)
    sent: list[list[int]] = []
    config = ToolsConfig(call_timeout_s=0.2)
    episode = await _episode(BYTE_CHAT, task, problem, [_call("ab"), "x"], sent, config)
    assert error in TOK.decode(sent[1], skip_special=False)
    assert episode.tools.errors == 1 and episode.tools.parse_failures == 0


async def test_the_turn_budget_ends_an_episode_that_keeps_calling() -> None:
    task = _lookup_task()
    problem = task.problem(5)
    sent: list[list[int]] = []
    config = ToolsConfig(max_turns=2)
    episode = await _episode(BYTE_CHAT, task, problem, [_call("ab")] * 5, sent, config)
    assert len(sent) == 2 and episode.tools.calls == 1  # the second call is not answered
    assert task.verify_turns(problem, list(episode.turns)) < 1.0


async def test_the_token_budget_ends_an_episode_after_the_results() -> None:
    task = _lookup_task()
    problem = task.problem(5)
    sent: list[list[int]] = []
    episode = await _episode(
        BYTE_CHAT, task, problem, [_call("ab")] * 5, sent, ToolsConfig(max_episode_tokens=40)
    )
    assert len(sent) == 1 and episode.tools.calls == 1
    assert episode.loss_mask[-1] == 0.0  # ends with the unanswered result, never trained


async def test_qwen_episode_renders_calls_and_results_through_its_template(
    tmp_path: Path,
) -> None:
    tok = HFTokenizer.from_folder(build_model_folder(tmp_path / "qwen3", "qwen3", weights=False))
    prompts = PromptRenderer.from_config(tok, ChatConfig())
    task = _lookup_task()
    problem = task.problem(6)
    arguments = f'{{"key": "{problem.prompt}"}}'
    call = f'<tool_call>\n{{"name": "lookup", "arguments": {arguments}}}\n</tool_call>'
    sent: list[list[int]] = []
    episode = await _episode(prompts, task, problem, [call, problem.reference], sent)
    ids = [*prompts.prompt_ids(problem), *episode.token_ids]
    assert all(ids[: len(context)] == context for context in sent) and len(sent) == 2
    first = tok.decode(sent[0], skip_special=False)
    assert first.startswith("<|im_start|>system\n# Tools\n") and '"name": "lookup"' in first
    second = tok.decode(sent[1][len(sent[0]) :], skip_special=False)
    result = f"<|im_start|>user\n<tool_response>\n{problem.reference}\n</tool_response><|im_end|>"
    assert result in second and second.endswith("<|im_start|>assistant\n")
    assert episode.tools.calls == 1 and task.verify_turns(problem, list(episode.turns)) == 1.0


def test_the_warm_up_target_is_the_demonstration_under_the_policy_mask() -> None:
    task = _lookup_task()
    problem = task.problem(7)
    sample = BYTE_CHAT.reference_sample(problem)
    assert list(sample.prompt_ids) == BYTE_CHAT.prompt_ids(problem)
    tool = f"<|tool|>\n{problem.reference}<eos><|assistant|>\n"
    parts = [
        (_call(problem.prompt) + "<eos>", 1.0),
        (tool, 0.0),
        (problem.reference + "<eos>", 1.0),
    ]
    ids = [TOK.encode_template_text(text) for text, _ in parts]
    assert list(sample.completion_ids) == [i for p in ids for i in p]
    assert list(sample.completion_mask) == [
        m for (_, m), p in zip(parts, ids, strict=True) for _ in p
    ]


def test_guessing_demonstrations_answer_without_a_call_and_keep_the_problems() -> None:
    config = LookupTaskConfig(key_len=1, value_len=1, guess_fraction=0.5)
    calling = build_task(config.model_copy(update={"guess_fraction": 0.0}), seed=0)
    mixed = build_task(config, seed=0)
    pairs = [(calling.problem(i), mixed.problem(i)) for i in range(200)]
    # the same problems (key, table, value); only the warm-up target differs
    assert all(
        (a.prompt, a.reference, a.metadata) == (b.prompt, b.reference, b.metadata) for a, b in pairs
    )
    assert all(len(a.demonstration) == 3 for a, _ in pairs)
    guesses = [b for _, b in pairs if len(b.demonstration) == 1]
    assert 70 < len(guesses) < 130  # about half
    for problem in guesses:
        (answer,) = problem.demonstration
        assert answer["role"] == "assistant" and "tool_calls" not in answer
        assert len(answer["content"]) == 1 and answer["content"] in config.alphabet
        sample = BYTE_CHAT.reference_sample(problem)  # one answer turn, all trained
        target = TOK.encode_template_text(answer["content"] + "<eos>")
        assert list(sample.completion_ids) == target and not sample.completion_mask


def test_a_tool_task_with_plain_text_prompts_fails_at_start() -> None:
    plain = PromptRenderer.from_config(TOK, ChatConfig())
    with pytest.raises(ConfigError, match=r'orchestrator\.chat\.template = "on"'):
        plain.check_tasks([_lookup_task()])
    BYTE_CHAT.check_tasks([_lookup_task()])


def test_without_the_tool_the_answer_is_not_in_the_prompt() -> None:
    task = _lookup_task()
    problems = [task.problem(i) for i in range(20)]
    assert all(p.reference not in TOK.decode(BYTE_CHAT.prompt_ids(p)) for p in problems)
    assert len({p.reference for p in problems}) > 10
