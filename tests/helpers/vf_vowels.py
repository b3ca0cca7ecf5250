"""A `verifiers` environment written with verifiers' own classes, for Tidal's tests.

Taskset id `vf_vowels` (this module, importable once tests/helpers is on the path): each
task asks for a short word, over one or two user turns (the second turn comes from the
environment's scripted user, so an episode is multi-turn); the reward is the fraction of
the five vowels that appear in the model's replies, so a random model gets varied rewards.
"""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf

VOWELS = "aeiou"


def vowel_reward(replies: list[str]) -> float:
    """What the environment scores an episode's replies with (tests recompute it)."""
    return len(set("".join(replies).lower()) & set(VOWELS)) / len(VOWELS)


class VowelsConfig(vf.TasksetConfig):
    size: int = 4
    """Number of tasks."""
    turns: int = 1
    """User turns per episode (1 or 2)."""


class VowelsTaskData(vf.TaskData):
    user_turns: list[str]


class VowelsTask(vf.Task[VowelsTaskData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def vowels(self, trace: vf.Trace) -> float:
        return vowel_reward([m.content or "" for m in trace.assistant_messages])


class VowelsEnv(vf.SingleAgentEnv):
    """Plays the task's user turns one after another (a one-turn task is one exchange)."""

    async def run(self, task: VowelsTask, agents: vf.Agents) -> None:
        async with agents.agent.interaction(task) as interaction:
            for prompt in task.data.user_turns:
                if (await interaction.turn(prompt)).terminated:
                    break


class VowelsTaskset(vf.Taskset[VowelsTask, VowelsConfig]):
    def load(self) -> Iterator[VowelsTask]:
        for i in range(self.config.size):
            turns = [f"Say a word with vowels ({i}).", "Another one."][: self.config.turns]
            yield VowelsTask(VowelsTaskData(prompt=None, user_turns=turns), self.config.task)


__all__ = ["VowelsEnv", "VowelsTaskset"]
