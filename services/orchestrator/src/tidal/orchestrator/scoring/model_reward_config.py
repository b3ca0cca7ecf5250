"""`[orchestrator.task.reward]`: score a task's completions by a model instead of its verifier.

Two kinds, a discriminated union on `type`: an LLM judge on an OpenAI-compatible chat
endpoint (`judge`), and a Hugging Face sequence-classification folder (`reward_model`).
pydantic only: the CLI validates these with the rest of the run, and the launcher reads a
judge's `model_path` to start the replica that serves it (docs/agents.md).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from tidal.common.config.loading import BaseConfig

PLACEHOLDERS = ("prompt", "completion", "reference", "answer")
DEFAULT_RUBRIC = """\
Grade the response to the task below.

Task:
{prompt}

Reference answer:
{reference}

Response:
{completion}

How well does the response answer the task, compared with the reference answer? \
Reply with one integer from 0 (wrong) to 10 (fully correct)."""


class JudgeRewardConfig(BaseConfig):
    """An LLM judge: the rubric, filled in, is sent as a chat message; the reply is parsed
    into a score and mapped to [0, 1]."""

    type: Literal["judge"] = "judge"
    """Reward kind: judge | reward_model."""
    model_path: Path | None = None
    """A Hugging Face folder `tidal rl` serves as the judge: it starts one more inference
    process for it (the `[inference]` settings, its own weights, never updated) with the
    OpenAI endpoint on loopback, and sets `base_url` to it. Tasks naming the same folder
    share one judge replica."""
    base_url: str | None = None
    """OpenAI-compatible base URL (".../v1") of an external judge; `tidal rl` sets it for a
    judge it serves (`model_path`)."""
    model: str = Field(default="judge", min_length=1)
    """The `model` of each request (a served judge replica is named this)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the endpoint's API key, sent as
    `Authorization: Bearer`; read by the orchestrator at start (unset variable: an error),
    never stored in config."""
    rubric: str = DEFAULT_RUBRIC
    """The judge's prompt; `{prompt}`, `{completion}`, `{reference}` and `{answer}` are
    replaced (in one pass, so text inside a completion is never substituted), other
    braces are kept. An episode's completion is its model turns joined by blank lines."""
    system_prompt: str | None = None
    """Optional system message before the rubric."""
    score: Literal["number", "verdict"] = "number"
    """How the reply becomes a reward (after any `<think>…</think>` is removed):
    "number": the last number in the reply (or the group of `pattern`), mapped linearly
    from [min_score, max_score] to [0, 1]; "verdict": the last of the `verdicts` words in
    the reply (whole word, any case) gives its reward. No match, or a number outside
    the range, scores 0 and is counted as a parse failure."""
    min_score: float = 0.0
    """"number": the score that means reward 0."""
    max_score: float = 10.0
    """"number": the score that means reward 1."""
    pattern: str | None = None
    """"number": a regex with one group holding the number (its last match counts), e.g.
    "Score: (\\d+)"; unset takes the last number anywhere in the reply."""
    verdicts: dict[str, float] = {"correct": 1.0, "incorrect": 0.0}
    """"verdict": words the judge answers with → their rewards in [0, 1]."""
    max_tokens: int = Field(default=16, gt=0)
    """Tokens the judge may write per reply (room for its score, or its reasoning)."""
    temperature: float = Field(default=0.0, ge=0)
    """Judge sampling temperature (0: greedy, so a cached verdict is the verdict)."""
    max_concurrency: int = Field(default=16, gt=0)
    """Judge requests in flight at once (the judge's engine batches those it gets)."""
    timeout_s: float = Field(default=30.0, gt=0)
    """Deadline of one request; a late one is retried, then scores 0 (counted)."""
    retries: int = Field(default=1, ge=0)
    """Further tries of a request that timed out, failed to connect or got 429/5xx."""
    cache_size: int = Field(default=4096, ge=0)
    """Judged (prompt, completion) pairs remembered, least recently used dropped first;
    a repeated pair, within a group or across steps, costs one request."""

    @model_validator(mode="after")
    def _check(self) -> JudgeRewardConfig:
        if self.model_path is None and self.base_url is None:
            raise ValueError("a judge needs model_path (served by `tidal rl`) or base_url")
        if "{completion}" not in self.rubric:
            raise ValueError("rubric must contain {completion}: the judge has to see it")
        if self.max_score <= self.min_score:
            raise ValueError(f"max_score {self.max_score} must exceed min_score {self.min_score}")
        if self.pattern is not None and re.compile(self.pattern).groups != 1:
            raise ValueError(f"pattern {self.pattern!r} must have exactly one group")
        if not self.verdicts or not all(0.0 <= r <= 1.0 for r in self.verdicts.values()):
            raise ValueError("verdicts must name at least one word, each with a reward in [0, 1]")
        return self


class RewardModelConfig(BaseConfig):
    """A Hugging Face sequence-classification folder scoring (prompt, completion) on CPU, in
    a worker process (torch and transformers stay out of the orchestrator's own)."""

    type: Literal["reward_model"] = "reward_model"
    """Reward kind."""
    path: Path
    """The folder `AutoModelForSequenceClassification` loads (config.json, weights,
    tokenizer). Needs the orchestrator's `reward-model` extra (transformers, torch)."""
    label: str | None = None
    """Reward = the softmax probability of this label (a name in the model's `id2label`);
    unset: the model must have one output, and reward = sigmoid(logit)."""
    chat_template: Literal["auto", "off"] = "auto"
    """"auto": the input is the prompt (or its chat messages) and the completion as an
    assistant turn, rendered by the folder's chat template when it has one; "off" (or a
    folder without one): the prompt text followed by the completion."""
    max_length: int = Field(default=1024, gt=0)
    """Longest input in tokens; a longer one keeps its end (the completion)."""
    batch_size: int = Field(default=16, gt=0)
    """Inputs per forward pass."""
    num_threads: int = Field(default=1, gt=0)
    """torch threads of the worker process."""


RewardConfig = Annotated[JudgeRewardConfig | RewardModelConfig, Field(discriminator="type")]
