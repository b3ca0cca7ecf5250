"""A `verifiers` environment as a Tidal task, against the real inference service.

The environment (tests/helpers/vf_vowels.py) is written with verifiers' own classes; its
harness program runs as a subprocess and verifiers' train client generates through
inference's `/inference/v1/generate` (the service and its HTTP server as `tidal inference`
runs them, on the test's loop). Every episode must come back as a Tidal `Completion` whose
prompt is the renderer's ids for the first user turn, whose sampled tokens are exactly what
inference generated (each carries its policy version), trained only where sampled, and
whose reward is the environment's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from renderers import create_renderer
from renderers.base import load_tokenizer

from tidal.orchestrator.rollouts.verifiers_env import VerifiersTask, close_tasks
from tidal.orchestrator.task_config import VerifiersTaskConfig
from tidal.orchestrator.tasks.registry import build_task

from .test_openai_endpoint import MODEL, base_url, openai_replica, qwen3_folder

__all__ = ["qwen3_folder"]

HELPERS = Path(__file__).resolve().parents[1] / "helpers"


@pytest.fixture(autouse=True)
def _env_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HELPERS))


def vowels_task(*, turns: int) -> VerifiersTask:
    config = VerifiersTaskConfig(env="vf_vowels", args={"size": 3, "turns": turns})
    task = build_task(config, seed=0)
    assert isinstance(task, VerifiersTask)
    return task


async def rollouts(task: VerifiersTask, inference: Any, folder: Path, **sampling: Any) -> Any:
    task.connect(base_url=base_url(inference), model=MODEL, model_folder=folder, api_key="")
    try:
        return await task.rollouts(task.problem(1), n=2, top_p=1.0, seed=7, **sampling)
    finally:
        await close_tasks([task])


async def test_episodes_become_completions_with_exact_ids_versions_and_reward(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    from vf_vowels import vowel_reward

    task = vowels_task(turns=1)
    assert task.size() == 3 and task.name == "vf_vowels"
    async with openai_replica(weightsync_server, tmp_path, qwen3_folder) as (inference, _):
        group = await rollouts(task, inference, qwen3_folder, temperature=1.0, max_tokens=6)
    renderer = create_renderer(load_tokenizer(str(qwen3_folder)))
    first_turn = [{"role": "user", "content": "Say a word with vowels (1)."}]
    expected_prompt = renderer.render(first_turn, add_generation_prompt=True).token_ids
    assert [c.index for c in group] == [0, 1]
    assert group[0].token_ids != group[1].token_ids  # each episode samples with its own seed
    for c in group:
        assert list(c.prompt_ids) == expected_prompt
        assert 0 < len(c.token_ids) <= 6 and c.loss_mask == (1.0,) * len(c.token_ids)
        assert c.policy_versions == (0,) * len(c.token_ids)  # claimed from inference's replies
        assert all(lp <= 0 for lp in c.logprobs) and len(c.turns) == 1
        assert c.stopped == (c.token_ids[-1] in renderer.get_stop_token_ids())
        assert c.reward == pytest.approx(vowel_reward(list(c.turns)))


async def test_an_episode_whose_turns_do_not_extend_one_sequence_is_refused(
    weightsync_server: Any, tmp_path: Path, qwen3_folder: Path
) -> None:
    """A first turn cut by max_tokens is re-rendered closed in the second turn's prompt, so
    verifiers records two branches; Tidal trains one sequence per episode and says so."""
    task = vowels_task(turns=2)
    async with openai_replica(weightsync_server, tmp_path, qwen3_folder) as (inference, _):
        with pytest.raises(ValueError, match="2 trainable branches"):
            await rollouts(task, inference, qwen3_folder, temperature=1.0, max_tokens=3)
