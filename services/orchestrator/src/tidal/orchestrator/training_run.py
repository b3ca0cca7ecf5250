"""One training run against its peers: connect, wait for every peer and a loaded version 0,
run the loop from its start point, close everything, write the report and the summary.

Peers are checked before the first step (data-parallel degree, tokenizers that agree)
and every client is closed whatever way the run ends. The summary's time excludes the
wait for peers; under `tidal rl` its start-up figure counts from the launch.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Sequence

from tidal.common.security.transport import for_service
from tidal.orchestrator.config import OrchestratorRunConfig
from tidal.orchestrator.loop import RLLoop
from tidal.orchestrator.mixture import TaskMixture
from tidal.orchestrator.peers.data_parallel import resolve_data_parallel_ranks
from tidal.orchestrator.peers.inference_pool import InferencePool
from tidal.orchestrator.peers.inflight import InflightLimiter
from tidal.orchestrator.peers.peer_client import PeerClient
from tidal.orchestrator.peers.trainer_client import TrainerClient
from tidal.orchestrator.peers.version_feed import VersionFeed
from tidal.orchestrator.records.prometheus import OrchestratorMetrics
from tidal.orchestrator.records.report import (
    REPORT_PLOT,
    REWARD_PLOT,
    SUMMARY_FILE,
    import_matplotlib_in_background,
    print_summary,
    summarize,
    write_report,
    write_reward_plot,
    write_summary,
)
from tidal.orchestrator.records.run_log import RunLog, StepRecord
from tidal.orchestrator.records.run_status import ProgressState
from tidal.orchestrator.rollouts.generator import RolloutGenerator
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.rollouts.verifiers_env import close_tasks
from tidal.orchestrator.scoring.scorers import ModelReward, build_scorers
from tidal.orchestrator.scoring.teacher import Teacher, check_teacher_tokenizer, distill_scorer
from tidal.orchestrator.scoring.verifier_pool import VerifierPool
from tidal.orchestrator.staleness import AsyncWindow
from tidal.orchestrator.start_point import first_step_and_cursors
from tidal.text.agreement import check_agreement
from tidal.text.tokenizer import Tokenizer
from tidal.weights.client import WeightSyncClient

log = logging.getLogger(__name__)
LAUNCHED_AT_ENV = "TIDAL_LAUNCHED_AT"
"""Set by `tidal rl` (tidal.cli.run_timing): the run's launch, for the start-up figure."""


async def run_training(
    config: OrchestratorRunConfig,
    progress: ProgressState,
    run_log: RunLog,
    mixture: TaskMixture,
    prompts: PromptRenderer,
    verifier: VerifierPool,
    prom: OrchestratorMetrics | None = None,
    model_rewards: dict[str, ModelReward] | None = None,
) -> None:
    """Wait for the peers, run every step, then write the report and the summary."""
    model_rewards = model_rewards or {}
    orch = config.orchestrator
    security = for_service(config, "orchestrator")
    versions = VersionFeed(on_published=progress.saw_version)
    limiter = InflightLimiter(
        orch.inflight.max_requests,
        queue_target=orch.inflight.queue_target,
        kv_usage_target=orch.inflight.kv_usage_target,
    )
    inference = InferencePool(
        config.endpoints.inference_addresses(),
        config.grpc,
        security=security,
        lost_timeout_s=orch.recovery.peer_loss_s,
        versions=versions,
        inflight=orch.inflight,
        on_pressure=limiter.observe,
    )
    trainer = TrainerClient(config.endpoints.trainer, config.grpc, security=security)
    weightsync = WeightSyncClient(config.endpoints.weightsync, config.grpc, security=security)
    window = AsyncWindow(
        orch.staleness,
        inference,
        wait_timeout_s=orch.timeouts.peer_wait_s,
        stalled=trainer.check_disk,
    )
    teacher_pool = distill_scorer(config, inference, security=security)
    teacher = None if teacher_pool is None else Teacher(orch.distill, teacher_pool, prompts)
    generator = RolloutGenerator(
        orch,
        seed=config.run.seed,
        inference=inference,
        limiter=limiter,
        prompts=prompts,
        max_tokens=orch.sampling.max_tokens or mixture.max_completion_chars + 2,
        tasks=mixture.tasks,
        scorers=build_scorers(mixture.tasks, verifier, model_rewards),
        teacher=teacher,
    )
    if generator.reasoning.markers is not None:
        start, end = generator.reasoning.markers
        opened = " (the prompt opens it)" if generator.reasoning_opened else ""
        log.info("reasoning %s…%s split off before verification%s", start, end, opened)
    follow = asyncio.create_task(versions.follow(weightsync, address=config.endpoints.weightsync))
    follow.add_done_callback(_warn_if_failed)
    background = [follow]
    launched_at = launched_at_from_env()
    marks: dict[str, float | None] = {"launched_at": launched_at}
    try:
        peer_wait = orch.timeouts.peer_wait_s
        log.info(
            "waiting for inference (%s) and trainer (up to %.0fs)",
            ", ".join(inference.addresses),
            peer_wait,
        )
        await asyncio.gather(
            inference.wait_serving(peer_wait),
            trainer.wait_serving(peer_wait),
            *(reward.wait_ready(peer_wait) for reward in unique(model_rewards)),
            *([] if teacher_pool in (None, inference) else [teacher_pool.wait_serving(peer_wait)]),
        )
        ranks = resolve_data_parallel_ranks(
            orch.packing.data_parallel_ranks,
            await trainer.data_parallel_ranks(),
            trainer=config.endpoints.trainer,
        )
        log.info("packing for %d trainer data-parallel rank(s)", ranks)
        peers = [*(replica.client for replica in inference.replicas), trainer]
        await check_peer_tokenizers(prompts.tokenizer, peers)
        if teacher_pool is not None and teacher_pool is not inference:
            await check_teacher_tokenizer(prompts.tokenizer, teacher_pool)
        await window.wait_loaded(0)
        first_step = await first_step_and_cursors(config, trainer, mixture)
        trained = first_step - 1  # trained, but its Train answer may have been lost
        if config.orchestrator.resume and trained >= 1 and trained not in run_log.logged_steps():
            log.warning("resume: step %d was trained but never logged; writing its line", trained)
            run_log.append(StepRecord.lost(trained))
        started = time.monotonic()  # the summary's time excludes waiting for peers
        marks["first_step_started_at"] = time.time()
        import_matplotlib_in_background()  # for the report, off the end of the run
        loop = RLLoop(
            orch,
            seed=config.run.seed,
            mixture=mixture,
            generator=generator,
            trainer=trainer,
            window=window,
            versions=versions,
            data_parallel_ranks=ranks,
            progress=progress,
            run_log=run_log,
            run_dir=config.run.dir,
        )
        if prom is not None:
            prom.watch(limiter, loop.steps_queued)
        await loop.run(first_step=first_step)
        marks["last_step_ended_at"] = time.time()
    finally:
        for task in background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        run_log.close()
        await close_tasks(list(mixture.tasks.values()))
        await generator.aclose()
        for client in (inference, trainer, weightsync):
            await client.close()
        if teacher_pool is not None and teacher_pool is not inference:
            await teacher_pool.close()
        for reward in unique(model_rewards):
            await reward.close()
        for line in inference.summary():
            log.info("%s", line)
    summary = summarize(run_log.records, time.monotonic() - started)
    if launched_at is not None:
        startup_s = (marks["first_step_started_at"] or 0.0) - launched_at
        summary = dataclasses.replace(summary, startup_s=startup_s)
    await asyncio.to_thread(write_report, run_log.records, config.run.dir / REPORT_PLOT)
    await asyncio.to_thread(write_reward_plot, run_log.records, config.run.dir / REWARD_PLOT)
    write_summary(summary, config.run.dir / SUMMARY_FILE, **marks)
    if launched_at is None:  # under `tidal rl` the launcher prints it, with the shutdown
        print_summary(summary)


def unique(model_rewards: dict[str, ModelReward]) -> list[ModelReward]:
    """Each judge or reward model once (tasks with equal reward configs share one)."""
    return list({id(r): r for r in model_rewards.values()}.values())


def launched_at_from_env() -> float | None:
    """When `tidal rl` started this run (`TIDAL_LAUNCHED_AT`, Unix seconds), if it did."""
    try:
        return float(os.environ[LAUNCHED_AT_ENV])
    except (KeyError, ValueError):
        return None


async def check_peer_tokenizers(mine: Tokenizer, peers: Sequence[PeerClient]) -> None:
    """Fail before the first step when an inference replica or the trainer tokenizes
    differently (tidal.text.agreement): prompts and completions would silently mean other
    tokens."""
    for peer in peers:
        check_agreement(mine, await peer.tokenizer(), peer=f"{peer.peer} at {peer.address}")


def _warn_if_failed(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("lost the weightsync loaded-version stream: %s", task.exception())
