"""Reasoning models in the orchestrator: with a Qwen3-like template thinking, verifiers
(an exact one, a tool episode's answer) see the answer, not the `<think>` block, while the
ids and loss mask stay the policy's; the format reward; the per-step reasoning and answer
lengths in the run log's extras and on Prometheus."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from tidal.common.observability.prometheus import ServiceMetrics
from tidal.orchestrator.completions import Completion
from tidal.orchestrator.config import ChatConfig, OrchestratorConfig, ReasoningConfig
from tidal.orchestrator.peers.inflight import InflightLimiter
from tidal.orchestrator.records.prometheus import OrchestratorMetrics
from tidal.orchestrator.records.run_log import StepRecord
from tidal.orchestrator.records.step_stats import reasoning_stats
from tidal.orchestrator.rollouts.generator import Generation, Group, RolloutGenerator
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.scoring.scorers import build_scorers
from tidal.orchestrator.scoring.verifier_pool import VerifierPool
from tidal.orchestrator.task_config import LookupTaskConfig
from tidal.orchestrator.tasks import Problem, Task, build_task
from tidal.text.byte import ByteTokenizer
from tidal.text.hf_tokenizer import HFTokenizer
from tidal.text.tokenizer import Tokenizer

from ....hf_folders import qwen3_folder

__all__ = ["qwen3_folder"]

THOUGHT_RIGHT = "<think>\nTwelve and thirty: 12 + 30 = 42?\n</think>\n\n42"
THOUGHT_WRONG = "<think>\nIt is 42, surely.\n</think>\n\n41"
UNCLOSED = "<think>\nMaybe 42, let me check"
PLAIN = "42"


class ExactTask(Task):
    """Reward 1 only when the completion is exactly the answer (stripped)."""

    name = "exact"

    def problem(self, index: int, *, split: str = "train") -> Problem:  # type: ignore[override]
        return Problem("What is 12 + 30?", "42", "42", task=self.name, uid=f"exact/{index}")

    def verify(self, problem: Problem, completion: str) -> float:
        return float(completion.strip() == problem.answer)

    @property
    def max_completion_chars(self) -> int:
        return 64


class ScriptedGenerator(RolloutGenerator):
    """The generator under test with inference replaced by scripted turns: call k of a
    prompt is answered with texts[k] (all n at once for a single-turn group), each
    closed by the tokenizer's end-of-turn id."""

    texts: list[str]

    async def complete(self, prompt_ids: list[int], *, n: int, **_: object) -> list[Completion]:
        out = []
        for i in range(n):
            text = self.texts.pop(0)
            ids = (*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_id)
            out.append(Completion(i, ids, (-0.5,) * len(ids), (0,) * len(ids), True))
        return out


@pytest.fixture
async def pools() -> AsyncIterator[dict[str, VerifierPool]]:
    opened: dict[str, VerifierPool] = {}
    yield opened
    for pool in opened.values():
        pool.close()


def _generator(
    tokenizer: Tokenizer,
    task: Task,
    pools: dict[str, VerifierPool],
    *,
    texts: list[str],
    reasoning: ReasoningConfig,
    template_kwargs: dict[str, object] | None = None,
) -> ScriptedGenerator:
    chat = ChatConfig(template="on", template_kwargs=template_kwargs or {})
    config = OrchestratorConfig(group_size=len(texts), chat=chat, reasoning=reasoning)
    pool = pools.setdefault(task.name, VerifierPool({task.name: task}, timeout_s=30))
    generator = ScriptedGenerator(
        config,
        seed=0,
        # `complete` is scripted; the served context length is unknown
        inference=SimpleNamespace(max_seq_len=None),  # type: ignore[arg-type]
        limiter=InflightLimiter(4, queue_target=4),
        prompts=PromptRenderer.from_config(tokenizer, chat),
        max_tokens=128,
        tasks={task.name: task},
        scorers=build_scorers({task.name: task}, pool, {}),
    )
    generator.texts = list(texts)
    return generator


async def _qwen_group(
    qwen3_folder: Path,
    pools: dict[str, VerifierPool],
    texts: list[str],
    reasoning: ReasoningConfig = ReasoningConfig(),  # noqa: B008
) -> tuple[Group, ScriptedGenerator]:
    tokenizer = HFTokenizer.from_folder(qwen3_folder)
    generator = _generator(
        tokenizer,
        ExactTask(),
        pools,
        texts=texts,
        reasoning=reasoning,
        template_kwargs={"enable_thinking": True},
    )
    return await generator.group(1, 0, 0, ExactTask().problem(0)), generator


async def test_an_exact_verifier_scores_the_answer_not_the_reasoning(
    qwen3_folder: Path, pools: dict[str, VerifierPool]
) -> None:
    texts = [THOUGHT_RIGHT, THOUGHT_WRONG, UNCLOSED, PLAIN]
    group, generator = await _qwen_group(qwen3_folder, pools, texts)
    assert generator.reasoning.markers == ("<think>", "</think>")  # auto: the folder's tokens
    assert group.rewards == [1.0, 0.0, 0.0, 1.0]
    assert [s[0].answer for s in group.splits] == ["42", "41", "", "42"]
    assert group.splits[0][0].reasoning == "Twelve and thirty: 12 + 30 = 42?"
    # the reasoning stays trained: the ids are the policy's own, every one under the loss
    think = generator.tokenizer.token_to_id("<think>")  # type: ignore[attr-defined]
    for completion, text in zip(group.completions, texts, strict=True):
        assert generator.tokenizer.decode(completion.token_ids) == text
        assert completion.loss_mask == ()
    assert group.completions[0].token_ids[0] == think


async def test_without_the_parser_the_think_block_fails_an_exact_verifier(
    qwen3_folder: Path, pools: dict[str, VerifierPool]
) -> None:
    group, _ = await _qwen_group(
        qwen3_folder, pools, [THOUGHT_RIGHT, PLAIN], ReasoningConfig(parser="none")
    )
    assert group.rewards == [0.0, 1.0]


async def test_the_format_reward_mixes_into_the_shaped_reward(
    qwen3_folder: Path, pools: dict[str, VerifierPool]
) -> None:
    texts = [THOUGHT_RIGHT, THOUGHT_WRONG, UNCLOSED, PLAIN]
    group, _ = await _qwen_group(qwen3_folder, pools, texts, ReasoningConfig(format_weight=0.25))
    assert group.rewards == [1.0, 0.0, 0.0, 1.0]  # reported: the verifier's
    assert group.shaped == pytest.approx([1.0, 0.25, 0.0, 0.75])


async def test_a_template_that_opens_the_block_in_the_prompt(
    qwen3_folder: Path, pools: dict[str, VerifierPool], tmp_path: Path
) -> None:
    folder = tmp_path / "r1-style"
    shutil.copytree(qwen3_folder, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] += "{% if add_generation_prompt %}<think>\n{% endif %}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = HFTokenizer.from_folder(folder)
    texts = ["Twelve and thirty.\n</think>\n\n42", "no end to it 42"]
    generator = _generator(tokenizer, ExactTask(), pools, texts=texts, reasoning=ReasoningConfig())
    assert generator.reasoning_opened
    group = await generator.group(1, 0, 0, ExactTask().problem(0))
    assert group.rewards == [1.0, 0.0]
    assert group.splits[1][0].reasoning == "no end to it 42"


async def test_a_tool_episode_calls_and_answers_outside_its_reasoning(
    pools: dict[str, VerifierPool],
) -> None:
    task = build_task(LookupTaskConfig(), seed=0)
    problem = task.problem(0)
    key, value = problem.prompt, problem.reference
    turns = [
        '<think>try <call>lookup {"key": "zz"}</call>?</think>'
        + f'<call>lookup {{"key": "{key}"}}</call>',
        f"<think>The tool said {value}; report it.</think>{value}",
    ]
    generator = _generator(
        ByteTokenizer(), task, pools, texts=turns, reasoning=ReasoningConfig(parser="think")
    )
    generator.config = generator.config.model_copy(update={"group_size": 1})
    group = await generator.group(1, 0, 0, problem)
    (episode,) = group.completions
    assert episode.tools.calls == 1  # the call inside the reasoning is not run
    assert list(episode.turns) == turns
    assert [t.answer for t in group.splits[0]] == [f'<call>lookup {{"key": "{key}"}}</call>', value]
    assert group.rewards == [1.0]


async def test_reasoning_lengths_reach_the_run_log_and_prometheus(
    qwen3_folder: Path, pools: dict[str, VerifierPool]
) -> None:
    texts = [THOUGHT_RIGHT, UNCLOSED]
    group, _ = await _qwen_group(qwen3_folder, pools, texts)
    generation = Generation([group], [group.problem], {}, {}, 0, 0.0, 0.0)
    stats = reasoning_stats(generation, parsed=True)
    reasoning = [len("Twelve and thirty: 12 + 30 = 42?"), len("Maybe 42, let me check")]
    assert stats == {
        "reasoning/reasoning_chars_mean": sum(reasoning) / 2,
        "reasoning/answer_chars_mean": 1.0,
        "reasoning/well_formed_fraction": 0.5,
    }
    assert reasoning_stats(generation, parsed=False) == {}
    record = replace(StepRecord.lost(7), phase="rl", extra=stats)
    assert json.loads(record.to_json())["reasoning/answer_chars_mean"] == 1.0
    service = ServiceMetrics("orchestrator")
    OrchestratorMetrics(service).step_finished(record)
    value = service.registry.get_sample_value
    assert value("tidal_orchestrator_reasoning_chars_mean") == sum(reasoning) / 2
    assert value("tidal_orchestrator_answer_chars_mean") == 1.0
    assert value("tidal_orchestrator_reasoning_well_formed_fraction") == 0.5
