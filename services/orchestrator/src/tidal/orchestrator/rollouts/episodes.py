"""Multi-turn episodes: model turn → environment reply → model turn, up to the last turn.

One Generate call per model turn, with the whole episode so far as the prompt (inference
keeps no session); a group's n episodes are separate chains run concurrently. An episode
becomes one Completion whose environment tokens have loss mask 0 and logprob 0. Replies
become ids through the prompt renderer's `EpisodeTurns`, which only appends, so the
trainer gets exactly the ids the policy saw. A turn cut by max_tokens ends the episode,
and so does a reply after which the context would leave the model no room to generate.
With tools, the reply to a turn is its calls' results, and a turn without calls (or the
end of the turn or token budget) ends the episode. Environments and tool-call parsing see
each turn's answer (`answer_of`: a reasoning model's thinking split off).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from tidal.common.errors import ConfigError
from tidal.orchestrator.completions import Completion, ToolStats
from tidal.orchestrator.rollouts.tool_execution import ToolUse, run_calls
from tidal.orchestrator.seeds import derive_seed
from tidal.orchestrator.tasks.base import EnvReply, Problem, Task
from tidal.text.episode import Episode
from tidal.text.tokenizer import Tokenizer

CompleteFn = Callable[..., Awaitable[list[Completion]]]


class EpisodeTurns(Protocol):
    """The ids of an episode's environment turns (one object per episode)."""

    def add_model_turn(self, ids: Sequence[int]) -> None:
        """The policy's turn, as generated."""
        ...

    def add_reply(self, reply: EnvReply) -> list[int]:
        """Ids of the environment's reply (and the next turn's header), appended."""
        ...

    def add_messages(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Ids of environment messages (tool results) and the next turn's header."""
        ...


class PlainTurns:
    """Plain-text episodes: a reply is its text's ids, nothing around it."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def add_model_turn(self, ids: Sequence[int]) -> None:
        pass  # the text of a reply does not depend on earlier turns

    def add_reply(self, reply: EnvReply) -> list[int]:
        return self.tokenizer.encode(reply.text, add_special_tokens=False)

    def add_messages(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        raise ConfigError(
            'tool results are chat messages: set orchestrator.chat.template = "on" for a '
            "task with tools"
        )


class ChatTurns:
    """Chat episodes: a reply is a message, rendered by the chat template (`Episode`)."""

    def __init__(self, episode: Episode) -> None:
        self.episode = episode

    def add_model_turn(self, ids: Sequence[int]) -> None:
        self.episode.add_assistant(ids)

    def add_reply(self, reply: EnvReply) -> list[int]:
        return self.episode.add_messages([{"role": reply.role, "content": reply.text}])

    def add_messages(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        return self.episode.add_messages(messages)


async def _environment_reply(
    task: Task,
    problem: Problem,
    turns: list[str],
    episode: EpisodeTurns,
    tools: ToolUse | None,
) -> tuple[list[int], bool, ToolStats] | None:
    """The ids answering the last turn, whether the episode ends after them, and the tool
    calls' cost; None ends the episode now (no reply, no calls, or the last turn)."""
    if tools is None:
        reply = task.env_step(problem, turns)
        if reply is None:
            return None
        return episode.add_reply(reply), reply.done, ToolStats()
    calls = tools.parser.parse(turns[-1], problem.tools).calls
    if not calls or len(turns) >= tools.config.max_turns:
        return None
    messages, spent = await run_calls(calls, tools, problem)
    return episode.add_messages(messages), False, spent


async def run_episode(
    complete: CompleteFn,
    task: Task,
    problem: Problem,
    prompt_ids: list[int],
    episode: EpisodeTurns,
    tokenizer: Tokenizer,
    *,
    index: int,
    temperature: float,
    seed: int,
    request_id: str,
    tools: ToolUse | None = None,
    answer_of: Callable[[str], str] | None = None,
    max_context: int | None = None,
) -> Completion:
    """Episode `index` of a group: alternate model turns and environment replies (tool
    results when `tools` is given, else `task.env_step`). With `max_context` (the served
    context length), a reply that would leave no room for the next turn is not appended:
    the episode ends there, marked `context_full`."""
    context = list(prompt_ids)
    tokens: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    mask: list[float] = []
    turns: list[str] = []
    stats = ToolStats()
    stopped = True
    context_full = False
    while True:
        (turn,) = await complete(
            context,
            n=1,
            temperature=temperature,
            seed=derive_seed(seed, index, len(turns)),
            request_id=f"{request_id}-e{index}-t{len(turns)}",
        )
        tokens += turn.token_ids
        logprobs += turn.logprobs
        versions += turn.policy_versions
        mask += [1.0] * len(turn.token_ids)
        context += turn.token_ids
        episode.add_model_turn(turn.token_ids)
        turns.append(tokenizer.decode(turn.token_ids))
        stopped = turn.stopped
        if not stopped:
            break
        answers = turns if answer_of is None else [answer_of(t) for t in turns]
        reply = await _environment_reply(task, problem, answers, episode, tools)
        if reply is None:
            break
        env_ids, done, spent = reply
        stats += spent
        if max_context is not None and len(context) + len(env_ids) >= max_context:
            context_full = True  # inference would refuse the next turn's context
            break
        tokens += env_ids
        logprobs += [0.0] * len(env_ids)
        mask += [0.0] * len(env_ids)
        context += env_ids
        if done or (tools is not None and len(tokens) >= tools.config.max_episode_tokens):
            break
    return Completion(
        index=index,
        token_ids=tuple(tokens),
        logprobs=tuple(logprobs),
        policy_versions=tuple(versions),
        stopped=stopped,
        loss_mask=tuple(mask),
        turns=tuple(turns),
        tools=stats,
        context_full=context_full,
    )
