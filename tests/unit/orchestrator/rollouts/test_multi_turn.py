"""Multi-turn episodes: environment replies between model turns, only model tokens trained;
with the chat template, replies are user turns and the trainer gets the ids the policy saw."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tidal.batch.packing import TrainSample, build_micro_batch, fit_to_budget
from tidal.orchestrator.completions import Completion
from tidal.orchestrator.config import ChatConfig
from tidal.orchestrator.rollouts.episodes import run_episode
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.task_config import ReversalTaskConfig
from tidal.orchestrator.tasks import Problem, Verdict, build_task
from tidal.text.byte import ByteTokenizer
from tidal.text.hf_tokenizer import HFTokenizer
from tidal.text.tokenizer import Tokenizer

from ....hf_folders import build_model_folder

TOK = ByteTokenizer()
PLAIN = PromptRenderer.from_config(TOK, ChatConfig())


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
    sample = PLAIN.reference_sample(problem)
    assert list(sample.prompt_ids) == TOK.encode("ab>")
    assert TOK.decode(sample.completion_ids) == "ba\ncd>dc"
    env = len(TOK.encode("\ncd>", add_special_tokens=False))
    # "ba" + EOS, the environment's text, "dc" + EOS
    assert sample.completion_mask == (1.0,) * 3 + (0.0,) * env + (1.0,) * 3


async def test_episode_alternates_model_turns_and_environment_replies() -> None:
    task = _task()
    problem = task.problem(2)
    answers = [p.reference for p in problem.turn_problems()]
    prompts_seen: list[str] = []

    async def complete(context: list[int], **kwargs: object) -> list[Completion]:
        # stands in for inference: answers each turn correctly at version 4
        prompts_seen.append(TOK.decode(context))
        ids = (*TOK.encode(answers[len(prompts_seen) - 1], add_special_tokens=False), TOK.eos_id)
        return [Completion(0, ids, (-0.5,) * len(ids), (4,) * len(ids), True)]

    prompt = PLAIN.prompt_ids(problem)
    assert prompt == TOK.encode(problem.prompt)  # the byte default's prompts are unchanged
    episode = await run_episode(
        complete,
        task,
        problem,
        prompt,
        PLAIN.episode_turns(problem),
        TOK,
        index=0,
        temperature=1.0,
        seed=1,
        request_id="r",
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


def _policy(tokenizer: Tokenizer, answers: list[str], sent: list[list[int]]):  # type: ignore[no-untyped-def]
    """Stands in for inference: answers turn k with answers[k] and its end-of-turn token,
    recording every context it was sent."""
    end_of_turn = tokenizer.eos_ids[0]

    async def complete(context: list[int], **kwargs: object) -> list[Completion]:
        sent.append(list(context))
        ids = (*tokenizer.encode(answers[len(sent) - 1], add_special_tokens=False), end_of_turn)
        return [Completion(0, ids, (-0.5,) * len(ids), (4,) * len(ids), True)]

    return complete


async def test_chat_episode_sends_the_trainer_exactly_the_ids_the_policy_saw(
    tmp_path: Path,
) -> None:
    tok = HFTokenizer.from_folder(build_model_folder(tmp_path / "qwen3", "qwen3", weights=False))
    prompts = PromptRenderer.from_config(tok, ChatConfig(system_prompt="Reverse strings."))
    task = _task()
    problem = task.problem(3)
    answers = [p.reference for p in problem.turn_problems()]
    sent: list[list[int]] = []
    prompt = prompts.prompt_ids(problem)
    episode = await run_episode(
        _policy(tok, answers, sent),
        task,
        problem,
        prompt,
        prompts.episode_turns(problem),
        tok,
        index=0,
        temperature=1.0,
        seed=1,
        request_id="r",
    )
    ids = [*prompt, *episode.token_ids]
    # every context sent for a turn is a prefix of what the trainer gets: no id changed
    assert all(ids[: len(context)] == context for context in sent) and len(sent) == 3
    # the environment's followups arrive as user turns rendered by the template
    second = tok.decode(sent[1], skip_special=False)
    assert second.endswith(f"<|im_start|>user\n{problem.followups[0][0]}<|im_end|>\n"
                           "<|im_start|>assistant\n")  # fmt: skip
    assert second.startswith("<|im_start|>system\nReverse strings.<|im_end|>\n")
    # decoding the episode and re-encoding it gives back the very same ids
    assert tok.encode_template_text(tok.decode(ids, skip_special=False)) == ids
    trained = [t for t, m in zip(episode.token_ids, episode.loss_mask, strict=True) if m == 1]
    assert tok.decode(trained, skip_special=False) == "<|im_end|>".join(answers) + "<|im_end|>"
    assert list(episode.turns) == answers


def test_chat_reference_trains_the_answers_and_their_end_of_turn_only(tmp_path: Path) -> None:
    tok = HFTokenizer.from_folder(build_model_folder(tmp_path / "qwen3", "qwen3", weights=False))
    prompts = PromptRenderer.from_config(tok, ChatConfig())
    sample = prompts.reference_sample(Problem("ab>", "ba", followups=(("cd>", "dc"),)))
    assert list(sample.prompt_ids) == prompts.prompt_ids(Problem("ab>", "ba"))
    env = "\n<|im_start|>user\ncd><|im_end|>\n<|im_start|>assistant\n"
    expected = [("ba<|im_end|>", 1.0), (env, 0.0), ("dc<|im_end|>", 1.0)]
    ids = [tok.encode_template_text(text) for text, _ in expected]
    assert list(sample.completion_ids) == [i for part in ids for i in part]
    assert list(sample.completion_mask) == [
        m for (_, m), p in zip(expected, ids, strict=True) for _ in p
    ]
