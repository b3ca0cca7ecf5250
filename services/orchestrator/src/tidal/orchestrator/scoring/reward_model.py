"""Rewards from a Hugging Face sequence-classification folder, computed in a worker process.

The worker is forked when the orchestrator starts (before gRPC, like the verifier pool's
zygote), imports torch and transformers there, loads the folder once and answers batches
over a pipe: the orchestrator's own process never imports torch and its loop never waits
on a forward pass. Requests that arrive while a batch runs form the next batch, so
concurrent groups share forward passes. The score maps to [0, 1] as `label` says
(softmax probability of that label, else sigmoid of the single logit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from tidal.common.errors import ConfigError
from tidal.orchestrator.scoring.judge import completion_text
from tidal.orchestrator.scoring.model_reward_config import RewardModelConfig
from tidal.orchestrator.scoring.verifier_pool import (
    VerifyOutcome,
    collector_off_across_fork,
    detach_child,
    exchange,
)
from tidal.orchestrator.tasks.base import Problem

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 600.0
Input = tuple[list[dict[str, str]], str]
"""(the prompt as chat messages, the completion)."""


class BatchFailed(Exception):
    """The model raised on a batch (its completions score 0)."""


class WorkerDied(Exception):
    """The worker process is gone: no reward can be computed, so the run stops."""


class RewardModel:
    """The parent's side: build it before the service starts gRPC (it forks)."""

    def __init__(self, config: RewardModelConfig) -> None:
        self.config = config
        self._conn, theirs = multiprocessing.Pipe()
        self._process = multiprocessing.get_context("fork").Process(
            target=_serve, args=(theirs, self._conn, config), daemon=True, name="reward-model"
        )
        with collector_off_across_fork():
            self._process.start()
        theirs.close()
        self.labels = self._wait_ready()
        self._pending: list[tuple[list[Input], asyncio.Future[list[float]]]] = []
        self._runner: asyncio.Task[None] | None = None
        self._logged = False

    def _wait_ready(self) -> list[str]:
        if not self._conn.poll(READY_TIMEOUT_S):
            self.close_now()
            raise ConfigError(f"reward model {self.config.path}: not loaded in {READY_TIMEOUT_S}s")
        try:
            kind, value = self._conn.recv()
        except EOFError:
            kind, value = "failed", "its worker process died while loading"
        if kind != "ready":
            self.close_now()
            raise ConfigError(f"reward model {self.config.path}: {value}")
        return list(value)

    async def score(
        self, problem: Problem, completions: Sequence[str | list[str]]
    ) -> list[VerifyOutcome]:
        messages = list(problem.messages) or [{"role": "user", "content": problem.prompt}]
        inputs = [(messages, completion_text(c)) for c in completions]
        if not inputs:
            return []
        done: asyncio.Future[list[float]] = asyncio.get_running_loop().create_future()
        self._pending.append((inputs, done))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._drain())
        started = time.monotonic()
        try:
            rewards = await done
        except BatchFailed as exc:  # the batch failed in the model: scored 0, counted
            self._log_once(str(exc))
            return [VerifyOutcome(0.0, failure="error") for _ in inputs]
        share = (time.monotonic() - started) / len(inputs)
        counters = {"reward_model/inputs": 1.0, "reward_model/seconds": share}
        return [VerifyOutcome(r, counters=counters) for r in rewards]

    async def _drain(self) -> None:
        """Run what is pending as one batch, then what arrived meanwhile, until none is."""
        while self._pending:
            batch, self._pending = self._pending, []
            flat = [x for inputs, _ in batch for x in inputs]
            try:
                rewards = await self._call(flat)
            except Exception as exc:
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            start = 0
            for inputs, done in batch:
                if not done.done():
                    done.set_result(rewards[start : start + len(inputs)])
                start += len(inputs)

    async def _call(self, inputs: list[Input]) -> list[float]:
        try:
            kind, value = await exchange(self._conn, inputs)
        except EOFError:
            died = f"reward model {self.config.path}: its worker process died"
            raise WorkerDied(died) from None
        if kind != "ok":
            raise BatchFailed(value)
        return list(value)

    def _log_once(self, why: str) -> None:
        if not self._logged:
            self._logged = True
            log.warning(
                "reward model %s failed on a batch: %s; its completions score 0 (further "
                "failures are counted, not logged)",
                self.config.path,
                why,
            )

    async def wait_ready(self, timeout_s: float) -> None:
        """Loaded already (the constructor waits for the worker)."""

    async def close(self) -> None:
        self.close_now()

    def close_now(self) -> None:
        if self._conn.closed:
            return
        self._conn.close()
        if self._process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._process.pid, signal.SIGKILL)
            self._process.join(timeout=5)


def _serve(conn: Connection, parents: Connection, config: RewardModelConfig) -> None:
    """The worker: load the folder, say so, then score batches until the pipe closes."""
    detach_child()
    parents.close()  # else the pipe would never close while this process lives
    try:
        scorer = _Scorer(config)
    except Exception as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", scorer.labels))
    while True:
        try:
            inputs = conn.recv()
        except EOFError:
            return
        try:
            reply: tuple[str, Any] = ("ok", scorer.score(inputs))
        except Exception as exc:
            reply = ("error", f"{type(exc).__name__}: {exc}")
        conn.send(reply)


class _Scorer:
    """The model and tokenizer, in the worker process only."""

    def __init__(self, config: RewardModelConfig) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        torch.set_num_threads(config.num_threads)
        self.config = config
        self.tokenizer = AutoTokenizer.from_pretrained(config.path)
        self.tokenizer.truncation_side = "left"  # keep the completion
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(
            config.path, dtype=torch.float32
        ).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        id2label = self.model.config.id2label
        self.labels = [str(id2label[i]) for i in range(self.model.config.num_labels)]
        self.index = self._label_index()
        self.chat = config.chat_template == "auto" and bool(self.tokenizer.chat_template)

    def _label_index(self) -> int | None:
        if self.config.label is None:
            if len(self.labels) != 1:
                raise ValueError(
                    f"the model has {len(self.labels)} labels {self.labels}: name the one "
                    "whose probability is the reward in `label`"
                )
            return None
        if self.config.label not in self.labels:
            raise ValueError(f"label {self.config.label!r} is not one of {self.labels}")
        return self.labels.index(self.config.label)

    def text(self, messages: list[dict[str, str]], completion: str) -> str:
        if not self.chat:
            return "".join(m["content"] for m in messages) + completion
        turns = [*messages, {"role": "assistant", "content": completion}]
        return str(self.tokenizer.apply_chat_template(turns, tokenize=False))

    def score(self, inputs: list[Input]) -> list[float]:
        import torch

        texts = [self.text(messages, completion) for messages, completion in inputs]
        rewards: list[float] = []
        size = self.config.batch_size
        with torch.inference_mode():
            for i in range(0, len(texts), size):
                encoded = self.tokenizer(
                    texts[i : i + size],
                    padding=True,
                    truncation=True,
                    max_length=self.config.max_length,
                    return_tensors="pt",
                )
                logits = self.model(**encoded).logits.float()  # (B, num_labels)
                if self.index is None:
                    chunk = torch.sigmoid(logits[:, 0])  # (B,)
                else:
                    chunk = torch.softmax(logits, dim=-1)[:, self.index]  # (B,)
                rewards += chunk.tolist()
        return rewards
