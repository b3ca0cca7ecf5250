"""Multi-turn episodes: model turn → environment reply → model turn, up to the last turn.

Decisions:
- One Generate call per model turn, with the whole episode so far as the prompt (the
  v1 inference contract has no session state). The n episodes of a group diverge after
  their first token, so each is its own chain of n=1 calls, and the chains run
  concurrently.
- The episode becomes one Completion: model and environment tokens in order, loss mask
  1 on model tokens and 0 on environment tokens, behaviour logprob 0 on environment
  tokens, and `policy_versions` of the model tokens only (staleness is about the model).
- A turn cut by max_tokens (no stop token) ends the episode: the environment would be
  answering half a turn.
- How an environment reply becomes ids is an `EpisodeTurns` object, one per episode,
  made by the prompt renderer: `PlainTurns` appends the reply text's ids (the plain-text
  prompts of the byte default, unchanged), `ChatTurns` keeps a `tidal.text.Episode`:
  the reply becomes a user (or tool) message, the chat is re-rendered and only the new
  turns' ids are appended. Either way the context sent for the next turn is the
  previous context plus the policy's ids verbatim plus the new ids, so the ids the
  trainer gets are exactly the ones the policy saw.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from tidal.orchestrator.completions import Completion
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


class PlainTurns:
    """Plain-text episodes: a reply is its text's ids, nothing around it."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def add_model_turn(self, ids: Sequence[int]) -> None:
        pass  # the text of a reply does not depend on earlier turns

    def add_reply(self, reply: EnvReply) -> list[int]:
        return self.tokenizer.encode(reply.text, add_special_tokens=False)


class ChatTurns:
    """Chat episodes: a reply is a message, rendered by the chat template (`Episode`)."""

    def __init__(self, episode: Episode) -> None:
        self.episode = episode

    def add_model_turn(self, ids: Sequence[int]) -> None:
        self.episode.add_assistant(ids)

    def add_reply(self, reply: EnvReply) -> list[int]:
        return self.episode.add_messages([{"role": reply.role, "content": reply.text}])


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
) -> Completion:
    """Episode `index` of a group: alternate model turns and environment replies."""
    context = list(prompt_ids)
    tokens: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    mask: list[float] = []
    turns: list[str] = []
    stopped = True
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
        reply = task.env_step(problem, turns) if stopped else None
        if reply is None:
            break
        env_ids = episode.add_reply(reply)
        tokens += env_ids
        logprobs += [0.0] * len(env_ids)
        mask += [0.0] * len(env_ids)
        context += env_ids
        if reply.done:
            break
    return Completion(
        index=index,
        token_ids=tuple(tokens),
        logprobs=tuple(logprobs),
        policy_versions=tuple(versions),
        stopped=stopped,
        loss_mask=tuple(mask),
        turns=tuple(turns),
    )
