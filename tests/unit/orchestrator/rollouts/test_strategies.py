"""Each task's rollout strategy and scorer are chosen once, by what the task is: tools run
episodes of tool calls, a plain task runs a problem's own turns (one call for n
completions, n episodes when it has followups); a task with a model reward is scored by
it, any other by the verifier pool."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tidal.orchestrator.completions import Completion
from tidal.orchestrator.config import ChatConfig, ToolsConfig
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.rollouts.strategies import Turns, rollout_strategy
from tidal.orchestrator.scoring.scorers import ByAnswer, build_scorers
from tidal.orchestrator.task_config import LookupTaskConfig, ReversalTaskConfig
from tidal.orchestrator.tasks import build_task
from tidal.text.byte import ByteTokenizer
from tidal.text.tool_calls import tool_call_parser

TOK = ByteTokenizer()


class Recorder:
    """A sampler whose every call returns one-token completions and is recorded."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.prompts = PromptRenderer.from_config(TOK, ChatConfig())
        self.inference = SimpleNamespace(max_seq_len=None)

    async def complete(self, prompt_ids: list[int], *, n: int, **kw: Any) -> list[Completion]:
        self.calls.append({"n": n, **kw})
        return [Completion(i, (65,), (-0.1,), (0,), True) for i in range(n)]

    def answer_of(self, text: str) -> str:
        return text


def test_a_task_with_tools_runs_tool_episodes_and_a_plain_task_its_turns() -> None:
    parser = tool_call_parser(TOK)
    lookup = rollout_strategy(build_task(LookupTaskConfig()), parser, ToolsConfig(max_turns=2))
    assert isinstance(lookup, Turns) and lookup.tools is not None
    assert set(lookup.tools.tools) == {"lookup"} and lookup.tools.config.max_turns == 2
    plain = rollout_strategy(build_task(ReversalTaskConfig()), parser, ToolsConfig())
    assert isinstance(plain, Turns) and plain.tools is None


async def test_turns_ask_once_for_a_single_turn_problem_and_per_turn_for_followups() -> None:
    parser = tool_call_parser(TOK)
    sampling = {"n": 3, "temperature": 1.0, "seed": 7, "request_id": "r"}
    for turns, calls, per_call in ((1, 1, 3), (2, 6, 1)):
        task = build_task(ReversalTaskConfig(turns=turns))
        strategy = rollout_strategy(task, parser, ToolsConfig())
        sampler = Recorder()
        problem = task.problem(0)
        completions = await strategy(sampler, problem, [1, 2], **sampling)
        assert len(completions) == 3
        assert len(sampler.calls) == calls and {c["n"] for c in sampler.calls} == {per_call}
        assert all(bool(c.turns) == (turns > 1) for c in completions)


def test_a_task_with_a_model_reward_is_scored_by_it_and_the_others_by_the_verifier() -> None:
    judged, plain = build_task(ReversalTaskConfig(name="judged")), build_task(ReversalTaskConfig())
    verifier, reward = object(), object()
    scorers = build_scorers(
        {"judged": judged, "reversal": plain},
        verifier,  # type: ignore[arg-type]
        {"judged": reward},  # type: ignore[dict-item]
    )
    assert scorers == {"judged": ByAnswer(reward), "reversal": ByAnswer(verifier)}  # type: ignore[arg-type]
