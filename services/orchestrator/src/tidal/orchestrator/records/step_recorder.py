"""What a step leaves behind: its resumable progress and prompts right before Train, its
metrics line after.

Before Train(n), progress.json (chained to the previous life's save) and the step's
prompt uids are written together with the step's metrics line as far as it is known
without the trainer's reply, so a restarted orchestrator can write that line when
Train(n) was trained but its reply was lost (records/resume.py). After Train(n) the full
line is appended to the run log, shown and counted. Kept apart from the loop so the loop
reads as the pipeline and this as its bookkeeping.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from opentelemetry import trace

from tidal.batch.packing import PackedMicroBatch
from tidal.common.errors import ConfigError
from tidal.common.files.durable import space_for
from tidal.orchestrator.completions import ScoredSample
from tidal.orchestrator.config import OrchestratorConfig
from tidal.orchestrator.mixture import TaskMixture
from tidal.orchestrator.peers.trainer_client import TrainResult
from tidal.orchestrator.records.report import print_live_table
from tidal.orchestrator.records.resume import (
    PROGRESS_FILE,
    SavedProgress,
    load_progress,
    previous_before,
    save_progress,
)
from tidal.orchestrator.records.run_log import RunLog, StepRecord
from tidal.orchestrator.records.run_status import ProgressState, StepSummary
from tidal.orchestrator.rollouts.generator import Generation
from tidal.orchestrator.tasks.base import Problem

log = logging.getLogger("tidal.orchestrator.loop")  # a step's line keeps the loop's name
PROMPTS_FILE = "prompts.jsonl"


class StepRecorder:
    """The run's per-step records: progress and prompts before Train, the metrics line
    after."""

    def __init__(
        self,
        config: OrchestratorConfig,
        *,
        seed: int,
        mixture: TaskMixture,
        progress: ProgressState,
        run_log: RunLog,
        run_dir: Path,
    ) -> None:
        self.config = config
        self.seed = seed
        self.mixture = mixture
        self.progress = progress
        self.run_log = run_log
        self.run_dir = run_dir
        self.start_eval: dict[str, float] = {}
        """eval.at_start's figures, for the first logged record."""
        self._last_finish = time.monotonic()
        self._last_saved: SavedProgress | None = None  # progress.json's last content

    def restart_clock(self) -> None:
        """The next step's `seconds` count from now."""
        self._last_finish = time.monotonic()

    def checkpoint(
        self,
        step: int,
        problems: list[Problem],
        before: dict[str, Any],
        after: dict[str, Any],
        pending: StepRecord,
    ) -> None:
        """Save the resumable progress and the step's prompts, right before Train(step).
        `pending` is the step's metrics line without the trainer's reply: a restarted
        orchestrator writes it if Train(step) was trained but its reply was lost."""
        if self._last_saved is None:  # this life's first save: chain to the previous life's
            with contextlib.suppress(ConfigError):
                self._last_saved = load_progress(self.run_dir / PROGRESS_FILE)
        saved = SavedProgress(
            step,
            before,
            after,
            self.seed,
            list(self.mixture.names),
            pending_metrics=pending.flat(),
            previous_before=previous_before(self._last_saved, step),
        )
        save_progress(self.run_dir / PROGRESS_FILE, saved)
        self._last_saved = saved
        line = json.dumps({"step": step, "prompts": [p.uid for p in problems]}) + "\n"
        prompts = self.run_dir / PROMPTS_FILE
        with space_for(prompts, len(line)), prompts.open("a") as f:
            f.write(line)

    def record(
        self,
        step: int,
        phase: str,
        result: TrainResult,
        *,
        batches: list[PackedMicroBatch],
        samples: int,
        version: int,
        train_seconds: float,
        scored: list[ScoredSample] | None = None,
        kept: list[ScoredSample] | None = None,
        dropped: int = 0,
        generation: Generation | None = None,
        extra: dict[str, Any] | None = None,
        log_it: bool = True,
    ) -> StepRecord:
        """The step's run-log record; with `log_it`, also appended, shown and counted."""
        now = time.monotonic()
        seconds = now - self._last_finish
        rewards = np.asarray([s.reward for s in scored or []], dtype=np.float64)
        lengths = [len(s.completion.token_ids) for s in scored or []]
        trained_tokens = sum(b.num_tokens for b in batches)
        generated = sum(lengths)
        versions = [v for s in kept or [] for v in s.completion.policy_versions]
        span_context = trace.get_current_span().get_span_context()
        record = StepRecord(
            step=step,
            phase=phase,
            reward_mean=float(rewards.mean()) if rewards.size else None,
            reward_std=float(rewards.std()) if rewards.size else None,
            policy_version=version,
            policy_version_max=max(versions, default=version),
            staleness_mean=float(np.mean([s.staleness for s in kept])) if kept else None,
            samples=samples,
            dropped_stale=dropped,
            completion_len_mean=float(np.mean(lengths)) if lengths else None,
            exact_fraction=float((rewards >= 1.0).mean()) if rewards.size else None,
            generated_tokens=generated,
            trained_tokens=trained_tokens,
            micro_batches=len(batches),
            generate_seconds=generation.seconds if generation else 0.0,
            train_seconds=train_seconds,
            seconds=seconds,
            tokens_per_s=(generated + trained_tokens) / seconds if seconds > 0 else 0.0,
            trace_id=format(span_context.trace_id, "032x"),
            train=result.metrics,
            extra=dict(extra or {}),
        )
        if not log_it:
            return record
        if self.start_eval:
            record.extra = {**self.start_eval, **record.extra}
            self.start_eval = {}
        self._last_finish = now
        self.run_log.append(record)
        every = self.config.report.table_every
        if every and (step % every == 0 or step == self.config.total_steps):
            print_live_table(self.run_log.records[-every:])
        self.progress.finish_step(StepSummary(step, phase, record.reward_mean, version, seconds))
        log.info(
            "step %d/%d %s reward %s version %d samples %d (%d stale) %.2fs %.0f tok/s",
            step,
            self.config.total_steps,
            phase,
            "-" if record.reward_mean is None else f"{record.reward_mean:.3f}",
            version,
            samples,
            dropped,
            seconds,
            record.tokens_per_s,
        )
        return record
