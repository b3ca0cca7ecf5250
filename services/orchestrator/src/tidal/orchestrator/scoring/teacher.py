"""On-policy distillation: a teacher scores every token the student sampled.

Each completion goes to the teacher as the teacher's prompt followed by the completion's
own ids, and inference's Score returns the teacher's logprob of each completion token (a
group's calls share an affinity key: its prompt is computed once, then served from the
prefix cache). The token's advantage term is `coef · (log p_teacher - log p_student)`,
minus the per-token sample of the reverse KL(student ‖ teacher), whose mean the step
reports. The student's logprob is the one inference sampled with, which is the student's
own at temperature 1 without filters (the config insists). Environment tokens of an
episode get 0. The teacher's prompt is the student's, or with self-distillation the
privileged one (the problem shown with its reference) scored by the policy itself.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from pathlib import Path

from tidal.common.errors import ConfigError
from tidal.common.security.transport import TransportSecurity
from tidal.orchestrator.completions import Completion
from tidal.orchestrator.config import OrchestratorRunConfig
from tidal.orchestrator.distill_config import DistillConfig
from tidal.orchestrator.peers.inference_pool import InferencePool
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.tasks.base import Problem
from tidal.text.agreement import check_agreement
from tidal.text.loader import load_tokenizer
from tidal.text.tokenizer import Tokenizer


@dataclass(frozen=True)
class GroupDistillation:
    """A group's teacher terms and what they cost."""

    terms: list[tuple[float, ...]]
    """Per completion, each token's `coef · (log p_teacher - log p_student)` (0 at
    environment tokens)."""
    reverse_kl_sum: float
    """Σ over the group's model tokens of log p_student - log p_teacher."""
    tokens: int
    """Model tokens scored."""
    seconds: float
    """Wall time of the group's teacher calls."""


def token_terms(
    completion: Completion, teacher_logprobs: tuple[float, ...], coef: float
) -> tuple[tuple[float, ...], float, int]:
    """(each token's term, Σ log p_student - log p_teacher, model tokens) of one completion."""
    mask = completion.loss_mask or (1.0,) * len(completion.token_ids)
    terms, kl, tokens = [], 0.0, 0
    for student, teacher, m in zip(completion.logprobs, teacher_logprobs, mask, strict=True):
        if m > 0:
            terms.append(coef * (teacher - student))
            kl += student - teacher
            tokens += 1
        else:
            terms.append(0.0)
    return tuple(terms), kl, tokens


def subtract_mean(
    terms: list[tuple[float, ...]], completions: list[Completion], mean: float
) -> list[tuple[float, ...]]:
    """Each model token's term less `mean` (environment tokens stay 0)."""
    out = []
    for t, c in zip(terms, completions, strict=True):
        mask = c.loss_mask or (1.0,) * len(t)
        out.append(tuple(v - mean if m > 0 else 0.0 for v, m in zip(t, mask, strict=True)))
    return out


class Teacher:
    """Scores a group's completions on the teacher's replicas (`scorer`)."""

    def __init__(
        self, config: DistillConfig, scorer: InferencePool, prompts: PromptRenderer
    ) -> None:
        self.config = config
        self.scorer = scorer
        self.prompts = prompts

    def prompt_ids(self, problem: Problem, student_prompt: list[int]) -> list[int]:
        """What the teacher sees before the completion: the student's prompt, or the
        privileged one when self-distilling."""
        if not self.config.self_distill:
            return student_prompt
        text = self.config.privileged_prompt
        if problem.messages:
            *head, last = problem.messages
            content = text.format(prompt=last.get("content", ""), reference=problem.reference)
            shown = replace(problem, messages=(*head, {**last, "content": content}))
        else:
            shown = replace(problem, prompt=text.format(prompt=problem.prompt,
                                                        reference=problem.reference))  # fmt: skip
        return self.prompts.prompt_ids(shown)

    async def score_group(
        self,
        problem: Problem,
        student_prompt: list[int],
        completions: list[Completion],
        *,
        tag: str,
    ) -> GroupDistillation:
        started = time.monotonic()
        shared = self.prompt_ids(problem, student_prompt)
        calls = []
        for c in completions:
            # An environment that renders its own prompt (verifiers) started from its ids.
            prompt = list(c.prompt_ids) if c.prompt_ids and not self.config.self_distill else shared
            calls.append(
                self.scorer.score(
                    prompt + list(c.token_ids),
                    start=len(prompt),
                    request_id=f"{tag}-teacher{c.index}",
                    affinity=f"{tag}-teacher",
                )
            )
        scored = await asyncio.gather(*calls)
        terms, kl, tokens = [], 0.0, 0
        for completion, teacher in zip(completions, scored, strict=True):
            t, k, n = token_terms(completion, teacher, self.config.coef)
            terms.append(t)
            kl, tokens = kl + k, tokens + n
        if self.config.baseline == "group" and tokens:
            terms = subtract_mean(terms, completions, -self.config.coef * kl / tokens)
        return GroupDistillation(terms, kl, tokens, time.monotonic() - started)


PROBE_TEXT = "Distillation probe: 12 + 30 = 42. Ünïcödé, tabs\tand\nnewlines."
"""Text both tokenizers must encode to the same ids (beside equal vocabularies and EOS)."""


def check_shared_tokenizer(student: Tokenizer, teacher_folder: Path) -> None:
    """Refuse a teacher folder whose tokenizer is not the run's: the teacher would score
    ids that mean other text to it. Raises ConfigError naming both keys."""
    teacher = load_tokenizer(str(teacher_folder))
    differences = []
    if teacher.vocab_size != student.vocab_size:
        differences.append(f"{teacher.vocab_size} ids against {student.vocab_size}")
    if tuple(teacher.eos_ids) != tuple(student.eos_ids):
        differences.append(f"EOS ids {list(teacher.eos_ids)} against {list(student.eos_ids)}")
    if teacher.encode(PROBE_TEXT) != student.encode(PROBE_TEXT):
        differences.append("the same text encodes to other ids")
    if differences:
        raise ConfigError(
            f"orchestrator.distill.model_path {teacher_folder} tokenizes with {teacher.name!r} "
            f"but run.tokenizer is {student.name!r} ({'; '.join(differences)}): teacher and "
            "student must share one tokenizer (distil from a teacher of the student's family)"
        )


def distill_scorer(
    config: OrchestratorRunConfig, inference: InferencePool, *, security: TransportSecurity
) -> InferencePool | None:
    """The replicas that score for distillation: the policy's own when self-distilling,
    the teacher's inference service otherwise, None when distillation is off."""
    distill = config.orchestrator.distill
    if not distill.enabled:
        return None
    if distill.self_distill:
        return inference
    if distill.address is None:
        raise ConfigError(
            "orchestrator.distill.model_path is served by `tidal rl`; running the orchestrator "
            "alone, serve the teacher yourself and set orchestrator.distill.address"
        )
    return InferencePool(
        [distill.address],
        config.grpc,
        security=security,
        lost_timeout_s=config.orchestrator.recovery.peer_loss_s,
    )


async def check_teacher_tokenizer(mine: Tokenizer, teacher: InferencePool) -> None:
    """The teacher service must tokenize as the run does (tidal.text.agreement)."""
    for replica in teacher.replicas:
        peer = f"the teacher (orchestrator.distill.address) at {replica.address}"
        check_agreement(mine, await replica.client.tokenizer(), peer=peer)
