"""The task interface: problems by index, prompts as text, verdicts with named sub-scores.

`problem(i, split)` is always the same problem, so a run's progress is a cursor per task;
generated tasks implement `sample(rng)` with an RNG seeded by (run seed, task, split, i). A
task works on text, never tokens, and `verify` returns a reward in [0, 1] or a `Verdict`.
Multi-turn problems carry `followups`, answered by `env_step` and scored by
`verify_turns`; chat `messages` are rendered by the template when it is on. A task with
`tools` runs episodes in which the policy calls them (docs/agents.md).
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from tidal.orchestrator.seeds import derive_seed, text_key

Split = Literal["train", "eval"]
SPLIT_KEYS = {"train": 1, "eval": 2}


@dataclass(frozen=True)
class Problem:
    """One prompt with what is needed to check an answer to it."""

    prompt: str
    """Prompt text (the tokenizer adds BOS)."""
    reference: str
    """A correct completion, without the end-of-sequence token (used for SFT warm start)."""
    answer: str = ""
    """What the verifier checks against, when it differs from `reference`."""
    task: str = ""
    """Name of the task the problem came from (set by the task mixture)."""
    uid: str = ""
    """Stable id: `<task>/<split>/<index>` (what 'prompts seen' compares)."""
    key: str = ""
    """The problem's identity across epochs (a dataset record); empty means `uid`. The
    curriculum tracks pass rates by it."""
    followups: tuple[tuple[str, str], ...] = ()
    """Multi-turn: (environment text, reference answer) of turns 2, 3, ..."""
    messages: tuple[dict[str, str], ...] = field(default=(), hash=False)
    """The prompt as chat messages ({role, content}), when the source has them; `prompt`
    then holds their plain rendering."""
    metadata: dict[str, Any] = field(default_factory=dict, hash=False)
    """Extra fields of the record for the verifier (e.g. a dataset's `metadata_fields`)."""
    tools: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)
    """The tools the prompt offers, as the chat template's `tools=` ({type, function});
    a problem with tools is an episode of tool calls (its task's `tools` run them)."""
    demonstration: tuple[Mapping[str, Any], ...] = field(default=(), hash=False)
    """Tools: the messages after the prompt that solve it (assistant `tool_calls`, tool
    results, the answer), the warm-up target in place of `reference`."""

    def turn_problems(self) -> list[Problem]:
        """One single-turn problem per turn: this one, then each followup."""
        first = replace(self, followups=())
        return [first] + [Problem(text, ref, task=self.task) for text, ref in self.followups]


@dataclass(frozen=True)
class EnvReply:
    """The environment's answer to a model turn: text appended to the episode (not
    trained on), and whether the episode ends after it."""

    text: str
    done: bool = False
    role: Literal["user", "tool"] = "user"
    """The message role of the reply when prompts use the chat template."""


@dataclass(frozen=True)
class Tool:
    """A tool a task offers the policy: what the template shows, and the code that runs it.

    `run(problem, **arguments)` gets arguments its `parameters` schema accepts and returns
    the text of the tool message; an exception or a timeout becomes an error result.
    `run` is the seam for sandboxed tools: trusted in-process code here, a call into the
    sandbox for untrusted code."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    """JSON schema of the arguments object."""
    run: Callable[..., Awaitable[str]]

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style tool description a chat template renders."""
        function = {"name": self.name, "description": self.description}
        return {"type": "function", "function": {**function, "parameters": dict(self.parameters)}}


@dataclass(frozen=True)
class Verdict:
    """A verifier's answer: reward in [0, 1] plus named sub-scores for metrics."""

    reward: float
    scores: dict[str, float] = field(default_factory=dict)


def _reward(value: Verdict | float) -> float:
    return value.reward if isinstance(value, Verdict) else float(value)


class Task(ABC):
    name: str = "task"
    tools: tuple[Tool, ...] = ()
    """Tools the policy may call in this task's episodes (problems list them in `tools`)."""

    def bind(self, *, name: str, seed: int) -> None:
        """Called once by the orchestrator: the task's label and the run seed."""
        self.name = name
        self.seed = seed

    @abstractmethod
    def problem(self, index: int, *, split: Split = "train") -> Problem:
        """The index-th problem of `split` (deterministic)."""

    def size(self, split: Split = "train") -> int | None:
        """Problems in `split`; None for an unbounded generated task."""
        return None

    def key(self, index: int, *, split: Split = "train") -> str:
        """What the index-th problem is tracked by (its `key`, else its `uid`); a task that
        can name it without building the problem overrides this."""
        problem = self.problem(index, split=split)
        return problem.key or problem.uid

    @abstractmethod
    def verify(self, problem: Problem, completion: str) -> Verdict | float:
        """Reward of `completion` (decoded, special tokens removed) in [0, 1]."""

    def env_step(self, problem: Problem, turns: list[str]) -> EnvReply | None:
        """The environment's reply after model turn len(turns); None ends the episode."""
        if len(turns) > len(problem.followups):
            return None
        return EnvReply(problem.followups[len(turns) - 1][0])

    def verify_turns(self, problem: Problem, turns: list[str]) -> Verdict | float:
        """Reward of a whole episode: the mean of `verify` over its turns (with tools and
        no followups, `verify` of the last turn: the answer after the calls)."""
        if not problem.followups:
            return self.verify(problem, turns[-1] if problem.tools else turns[0])
        per_turn = problem.turn_problems()
        rewards = [_reward(self.verify(p, t)) for p, t in zip(per_turn, turns, strict=False)]
        rewards += [0.0] * (len(per_turn) - len(rewards))
        return Verdict(
            sum(rewards) / len(rewards),
            {"turns_completed": min(len(turns), len(per_turn)) / len(per_turn)},
        )

    @property
    @abstractmethod
    def max_completion_chars(self) -> int:
        """Longest reference completion, in characters; bounds sampling's max_tokens."""


class GeneratedTask(Task):
    """A task whose problems are drawn from a seeded RNG: implement `sample` and `verify`.
    With `train_size` its training problems are the first train_size draws, repeated
    epoch after epoch under the same `key`."""

    seed: int = 0
    train_size: int | None = None

    @abstractmethod
    def sample(self, rng: random.Random) -> Problem:
        """Draw one problem."""

    def sample_many(self, rng: random.Random, count: int) -> list[Problem]:
        return [self.sample(rng) for _ in range(count)]

    def size(self, split: Split = "train") -> int | None:
        return self.train_size if split == "train" else None

    def key(self, index: int, *, split: Split = "train") -> str:
        size = self.size(split)
        return f"{self.name}/{split}/{index % size if size else index}"

    def problem(self, index: int, *, split: Split = "train") -> Problem:
        size = self.size(split)
        drawn_as = index % size if size else index
        seed = derive_seed(self.seed, text_key(self.name), SPLIT_KEYS[split], drawn_as)
        drawn = self.sample(random.Random(seed))
        tools = tuple(t.schema() for t in self.tools)
        uid, key = f"{self.name}/{split}/{index}", self.key(index, split=split)
        return replace(drawn, task=self.name, uid=uid, key=key, tools=tools)
