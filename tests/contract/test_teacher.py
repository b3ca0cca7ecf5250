"""On-policy distillation's teacher against a real inference service serving a folder: each
sampled token's term is `coef · (log p_teacher - log p_student)` with the teacher's logprob
a transformers forward gives, environment tokens get 0, the group's reverse KL and tokens
add up, and self-distillation shows the teacher the problem's reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.orchestrator.completions import Completion
from tidal.orchestrator.config import ChatConfig
from tidal.orchestrator.distill_config import DistillConfig
from tidal.orchestrator.peers.inference_pool import InferencePool
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.scoring.teacher import Teacher
from tidal.orchestrator.tasks.base import Problem
from tidal.text.hf_tokenizer import HFTokenizer

from ..hf_folders import qwen3_folder
from .test_score import ATOL, scoring_replica, transformers_logprobs

__all__ = ["qwen3_folder"]

PROBLEM = Problem(prompt="Reverse abc>", reference="cba")


def completion(index: int, ids: list[int], mask: tuple[float, ...] = ()) -> Completion:
    """A sampled completion whose student logprob is -(position + 1) / 4 at model tokens."""
    logprobs = tuple(-(i + 1) / 4 if not mask or mask[i] > 0 else 0.0 for i in range(len(ids)))
    return Completion(index, tuple(ids), logprobs, (0,) * len(ids), True, loss_mask=mask)


async def test_each_token_term_is_coef_times_teacher_minus_student_logprob(
    tmp_path: Path, qwen3_folder: Path
) -> None:
    prompts = PromptRenderer.from_config(HFTokenizer.from_folder(qwen3_folder), ChatConfig())
    prompt = prompts.prompt_ids(PROBLEM)
    samples = [completion(0, [40, 41, 42]), completion(1, [50, 51, 52, 53], (1, 0, 0, 1))]
    async with scoring_replica(tmp_path, qwen3_folder) as (inference, _):
        address = f"127.0.0.1:{inference.running.port}"
        pool = InferencePool([address], security=PLAINTEXT_LOOPBACK)
        config = DistillConfig(address=address, coef=0.5)
        try:
            scored = await Teacher(config, pool, prompts).score_group(
                PROBLEM, prompt, samples, tag="step1-prompt0"
            )
        finally:
            await pool.close()
    kl, tokens = 0.0, 0
    for sample, terms in zip(samples, scored.terms, strict=True):
        ids = prompt + list(sample.token_ids)
        full = transformers_logprobs(qwen3_folder, ids)  # (T - 1, V)
        teacher = full[len(prompt) - 1 :].gather(-1, torch.tensor(sample.token_ids)[:, None])[:, 0]
        mask = torch.tensor(sample.loss_mask or (1.0,) * len(ids[len(prompt) :]))
        expected = 0.5 * (teacher - torch.tensor(sample.logprobs)) * mask
        torch.testing.assert_close(torch.tensor(terms), expected, atol=ATOL, rtol=0)
        kl += float(((torch.tensor(sample.logprobs) - teacher) * mask).sum())
        tokens += int(mask.sum())
    assert scored.tokens == tokens == 5
    assert scored.reverse_kl_sum == pytest.approx(kl, abs=1e-3)
    assert scored.seconds > 0


def test_self_distillation_shows_the_teacher_the_reference(qwen3_folder: Path) -> None:
    tokenizer = HFTokenizer.from_folder(qwen3_folder)
    prompts = PromptRenderer.from_config(tokenizer, ChatConfig())
    config = DistillConfig(self_distill=True, privileged_prompt="{prompt} (answer: {reference})")
    teacher = Teacher(config, None, prompts)  # type: ignore[arg-type]
    student_prompt = prompts.prompt_ids(PROBLEM)
    shown = tokenizer.decode(teacher.prompt_ids(PROBLEM, student_prompt))
    assert "Reverse abc> (answer: cba)" in shown and "cba" not in tokenizer.decode(student_prompt)
    plain = Teacher(DistillConfig(address="x:1"), None, prompts)  # type: ignore[arg-type]
    assert plain.prompt_ids(PROBLEM, student_prompt) == student_prompt
