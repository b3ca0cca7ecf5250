"""A tool task: "ab" → call `lookup(key="ab")` → report the value it returns.

The value is drawn at random per problem and appears only in the tool's result, so the
reward cannot be earned without a well-formed call of the right key. The reward is exact
match: partial credit would pay a guess without a call nearly as well as a call. A
`guess_fraction` of the demonstrations answer a random value without calling: imperfect
warm-up data, which leaves RL the choice to call to learn.
"""

from __future__ import annotations

import random
from typing import Any

from tidal.orchestrator.task_config import LookupTaskConfig
from tidal.orchestrator.tasks.base import GeneratedTask, Problem, Tool

NOT_FOUND = "no such key"
KEY_SCHEMA = {
    "type": "object",
    "properties": {"key": {"type": "string"}},
    "required": ["key"],
    "additionalProperties": False,
}


async def lookup(problem: Problem, key: str) -> str:
    """The value stored under `key` in the problem's table."""
    return str(problem.metadata["table"].get(key, NOT_FOUND))


LOOKUP = Tool("lookup", "value of a key", KEY_SCHEMA, lookup)


def call_message(key: str) -> dict[str, Any]:
    """The assistant message that calls `lookup(key)` (OpenAI `tool_calls` form)."""
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"key": key}}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


class LookupTask(GeneratedTask):
    name = "lookup"
    tools = (LOOKUP,)

    def __init__(self, config: LookupTaskConfig) -> None:
        self.config = config

    def _word(self, rng: random.Random, length: int) -> str:
        return "".join(rng.choice(self.config.alphabet) for _ in range(length))

    def sample(self, rng: random.Random) -> Problem:
        table: dict[str, str] = {}
        while len(table) < self.config.keys:
            table[self._word(rng, self.config.key_len)] = self._word(rng, self.config.value_len)
        key = rng.choice(sorted(table))
        value = table[key]
        demonstration: tuple[dict[str, Any], ...] = (
            call_message(key),
            {"role": "tool", "name": "lookup", "content": value},
            {"role": "assistant", "content": value},
        )
        if rng.random() < self.config.guess_fraction:
            guess = self._word(rng, self.config.value_len)
            demonstration = ({"role": "assistant", "content": guess},)
        return Problem(
            prompt=key,
            reference=value,
            metadata={"table": table},
            demonstration=demonstration,
        )

    def verify(self, problem: Problem, completion: str) -> float:
        return float(completion.strip() == problem.reference)

    @property
    def max_completion_chars(self) -> int:
        call = '<call>lookup {"key": ""}</call>'  # the longest turn: the call, in bytes
        return max(len(call) + self.config.key_len, self.config.value_len)
