"""Multi-turn episodes: environment replies between model turns, only model tokens trained."""

from __future__ import annotations

import numpy as np

from tidal.batch.packing import TrainSample, build_micro_batch, fit_to_budget
from tidal.common.tokenizer import ByteTokenizer
from tidal.orchestrator.completions import Completion
from tidal.orchestrator.episodes import reference_episode, run_episode
from tidal.orchestrator.task_config import ReversalTaskConfig
from tidal.orchestrator.tasks import Problem, Verdict, build_task

TOK = ByteTokenizer()


def _task():  # type: ignore[no-untyped-def]
    return build_task(ReversalTaskConfig(turns=3, min_len=2, max_len=2), seed=0)


def test_reversal_with_turns_carries_followups_and_scores_the_mean() -> None:
    task = _task()
    problem = task.problem(0)
    assert len(problem.followups) == 2
    answers = [p.reference for p in problem.turn_problems()]
    assert task.verify_turns(problem, answers) == Verdict(1.0, {"turns_completed": 1.0})
    wrong_last = [*answers[:2], "zz"]
    assert task.verify_turns(problem, wrong_last).reward == 2 / 3
    assert task.verify_turns(problem, answers[:1]) == Verdict(1 / 3, {"turns_completed": 1 / 3})


def test_environment_replies_with_the_next_string_then_ends() -> None:
    task = _task()
    problem = task.problem(1)
    assert task.env_step(problem, ["x"]).text == problem.followups[0][0]  # type: ignore[union-attr]
    assert task.env_step(problem, ["x", "y"]).text == problem.followups[1][0]  # type: ignore[union-attr]
    assert task.env_step(problem, ["x", "y", "z"]) is None


def test_reference_episode_masks_the_environment_text() -> None:
    problem = Problem("ab>", "ba", followups=(("\ncd>", "dc"),))
    tokens, mask = reference_episode(problem, TOK)
    assert TOK.decode(tokens) == "ba\ncd>dc"
    env = len(TOK.encode("\ncd>", add_bos=False))
    assert mask == [1.0] * 3 + [0.0] * env + [1.0] * 3  # "ba"+EOS, env, "dc"+EOS


async def test_episode_alternates_model_turns_and_environment_replies() -> None:
    task = _task()
    problem = task.problem(2)
    answers = [p.reference for p in problem.turn_problems()]
    prompts_seen: list[str] = []

    async def complete(context: list[int], **kwargs: object) -> list[Completion]:
        # stands in for inference: answers each turn correctly at version 4
        prompts_seen.append(TOK.decode(context))
        ids = (*TOK.encode(answers[len(prompts_seen) - 1], add_bos=False), TOK.eos_id)
        return [Completion(0, ids, (-0.5,) * len(ids), (4,) * len(ids), True)]

    prompt = TOK.encode(problem.prompt)
    episode = await run_episode(
        complete, task, problem, prompt, TOK, index=0, temperature=1.0, seed=1, request_id="r"
    )
    assert list(episode.turns) == answers
    assert prompts_seen[1] == problem.prompt + answers[0] + problem.followups[0][0]
    model_tokens = sum(len(a) + 1 for a in answers)
    assert sum(episode.loss_mask) == model_tokens == len(episode.policy_versions)
    env = [lp for lp, m in zip(episode.logprobs, episode.loss_mask, strict=True) if m == 0]
    assert env and all(lp == 0.0 for lp in env)
    assert task.verify_turns(problem, list(episode.turns)).reward == 1.0  # type: ignore[union-attr]

    batch = build_micro_batch(
        [
            TrainSample(
                tuple(prompt),
                episode.token_ids,
                advantage=1.0,
                completion_logprobs=episode.logprobs,
                completion_mask=episode.loss_mask,
            )
        ]
    )
    np.testing.assert_array_equal(batch.loss_mask[len(prompt) :], episode.loss_mask)
    assert batch.loss_mask[: len(prompt)].sum() == 0


def test_truncation_cuts_the_mask_with_the_tokens() -> None:
    sample = TrainSample((1,), (2, 3, 4, 5), advantage=0.0, completion_mask=(1, 0, 0, 1))
    cut = fit_to_budget(sample, 3)
    assert cut is not None and cut.completion_mask == (1, 0)
