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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tidal.common.tokenizer import ByteTokenizer
from tidal.orchestrator.completions import Completion
from tidal.orchestrator.seeds import derive_seed
from tidal.orchestrator.tasks.base import Problem, Task

CompleteFn = Callable[..., Awaitable[list[Completion]]]


async def run_episode(
    complete: CompleteFn,
    task: Task,
    problem: Problem,
    prompt_ids: list[int],
    tokenizer: ByteTokenizer,
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
        turns.append(tokenizer.decode(turn.token_ids))
        stopped = turn.stopped
        reply = task.env_step(problem, turns) if stopped else None
        if reply is None:
            break
        env_ids = tokenizer.encode(reply.text, add_bos=False)
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


def reference_episode(problem: Problem, tokenizer: ByteTokenizer) -> tuple[list[int], list[float]]:
    """Completion tokens and loss mask of the reference answers with the environment's
    followup texts between them (the warm-start target of a multi-turn problem)."""
    eos = tokenizer.eos_id
    tokens = [*tokenizer.encode(problem.reference, add_bos=False), eos]
    mask = [1.0] * len(tokens)
    for text, reference in problem.followups:
        env_ids = tokenizer.encode(text, add_bos=False)
        answer = [*tokenizer.encode(reference, add_bos=False), eos]
        tokens += env_ids + answer
        mask += [0.0] * len(env_ids) + [1.0] * len(answer)
    return tokens, mask
