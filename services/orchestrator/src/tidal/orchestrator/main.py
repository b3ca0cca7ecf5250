"""Run the orchestrator: `tidal orchestrator @ cfg.toml` or `python -m tidal.orchestrator`.

A bad task, tokenizer or chat config fails before any peer is awaited (exit 2). The gRPC
server starts first, so progress is visible while the orchestrator waits for every
inference replica, the trainer and a loaded version 0; the loop then runs from the
trainer's next step (or the saved progress with `resume`), and the run ends with the
report and summary. Exit codes: 0 done, 1 a failed peer or call, 143 signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Sequence

from tidal.common.errors import EXIT_DISK_FULL, ConfigError, is_disk_full
from tidal.common.grpc.server import GrpcServer, ServiceBinding
from tidal.common.observability.prometheus import ServiceMetrics
from tidal.common.observability.tracing import setup_telemetry
from tidal.common.process.service_start import start_service
from tidal.common.security.transport import check_or_exit, for_service
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
from tidal.orchestrator.records.resume import (
    PROGRESS_FILE,
    drop_lost_lines,
    load_progress,
    recover_metrics_line,
    resume_point,
)
from tidal.orchestrator.records.run_log import RUN_LOG_FILE, RunLog, StepRecord
from tidal.orchestrator.records.run_status import ProgressState
from tidal.orchestrator.records.wandb_sink import WandbSink, import_wandb
from tidal.orchestrator.rollouts.generator import RolloutGenerator
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.rollouts.verifiers_env import close_tasks, connect_tasks
from tidal.orchestrator.scoring.scorers import ModelReward, build_model_rewards, build_scorers
from tidal.orchestrator.scoring.teacher import (
    Teacher,
    check_shared_tokenizer,
    check_teacher_tokenizer,
    distill_scorer,
)
from tidal.orchestrator.scoring.verifier_pool import VerifierPool
from tidal.orchestrator.servicer import OrchestratorServicer
from tidal.orchestrator.staleness import AsyncWindow
from tidal.orchestrator.tasks import build_tasks
from tidal.rpc.v1 import orchestrator_pb2_grpc as pb_grpc
from tidal.text.agreement import check_agreement
from tidal.text.loader import load_tokenizer
from tidal.text.tokenizer import Tokenizer
from tidal.weights.client import WeightSyncClient

log = logging.getLogger(__name__)
FULL_NAME = "tidal.rpc.v1.OrchestratorService"
EXIT_FAILED, EXIT_CONFIG, EXIT_SIGNALLED = 1, 2, 143
LAUNCHED_AT_ENV = "TIDAL_LAUNCHED_AT"
"""Set by `tidal rl` (tidal.cli.run_timing): the run's launch, for the start-up figure."""


def build_mixture(config: OrchestratorRunConfig) -> TaskMixture:
    """The run's tasks and their mixture (raises ConfigError for a bad task config)."""
    configs = config.orchestrator.task_list
    tasks = build_tasks(configs, seed=config.run.seed)
    for task in tasks:
        skipped = getattr(task, "skipped_records", 0)
        if skipped:
            log.warning("task %s: %d malformed records skipped", task.name, skipped)
    return TaskMixture(
        tasks,
        [c.weight for c in configs],
        seed=config.run.seed,
        curriculum=config.orchestrator.curriculum,
    )


def build_prompt_renderer(config: OrchestratorRunConfig) -> PromptRenderer:
    """The run's tokenizer and chat rendering (raises ConfigError for a bad tokenizer or
    `[orchestrator.chat]`, or a distillation teacher folder that tokenizes otherwise)."""
    tokenizer = load_tokenizer(config.run.tokenizer, model_path=config.model_folder())
    teacher_folder = config.orchestrator.distill.model_path
    if teacher_folder is not None and teacher_folder.is_dir():  # else: served elsewhere
        check_shared_tokenizer(tokenizer, teacher_folder)
    prompts = PromptRenderer.from_config(tokenizer, config.orchestrator.chat)
    log.info(
        "tokenizer %s; prompts %s",
        tokenizer.name,
        "through its chat template" if prompts.template else "as plain text",
    )
    return prompts


async def first_step_and_cursors(
    config: OrchestratorRunConfig, trainer: TrainerClient, mixture: TaskMixture
) -> int:
    """Where the loop starts, after restoring the task cursors when resuming."""
    trainer_step = await trainer.last_step()
    if not config.orchestrator.resume:
        if trainer_step:
            log.info(
                "trainer has trained %d steps; continuing at %d", trainer_step, trainer_step + 1
            )
        return trainer_step + 1
    saved = load_progress(config.run.dir / PROGRESS_FILE)
    if saved is None:
        if trainer_step:
            raise ConfigError(
                f"cannot resume: no {PROGRESS_FILE} in {config.run.dir} but the trainer is at "
                f"step {trainer_step}"
            )
        log.info("resume: no saved progress yet; starting at step 1")
        return 1
    first_step, state = resume_point(saved, trainer_step)
    mixture.load_state_dict(state)
    if lost := drop_lost_lines(config.run.dir / RUN_LOG_FILE, trainer_step):
        log.warning(
            "resume: step(s) %s were trained but lost with the trainer before they were "
            "durable; their metrics lines are removed and the steps trained again",
            ", ".join(map(str, lost)),
        )
    if recover_metrics_line(saved, trainer_step, config.run.dir / RUN_LOG_FILE):
        log.warning(
            "resume: step %d was trained but its reply was lost; its metrics line is written "
            "from what was saved before Train (marked recovered, no train/* values)",
            saved.step,
        )
    log.info("resume: trainer at step %d; continuing at step %d", trainer_step, first_step)
    return first_step


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
    window = AsyncWindow(orch.staleness, inference, wait_timeout_s=orch.timeouts.peer_wait_s)
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


async def serve(
    config: OrchestratorRunConfig,
    mixture: TaskMixture,
    prompts: PromptRenderer,
    verifier: VerifierPool,
    model_rewards: dict[str, ModelReward] | None = None,
) -> int:
    """Serve GetProgress, run the loop; returns the process exit code."""
    provider = setup_telemetry("orchestrator", config.telemetry, config.run.dir)
    orch = config.orchestrator
    progress = ProgressState(total_steps=orch.total_steps, recent_limit=orch.report.recent_steps)
    run_log = RunLog(config.run.dir / RUN_LOG_FILE)
    service_metrics = ServiceMetrics("orchestrator", config.metrics)
    prom = OrchestratorMetrics(service_metrics)
    run_log.sinks.append(prom.step_finished)
    wandb_sink = None
    if orch.wandb.enabled:
        wandb_sink = WandbSink.start(
            orch.wandb,
            run_name=config.run.name,
            run_dir=config.run.dir,
            settings=config.model_dump(mode="json"),
        )
        run_log.sinks.append(wandb_sink)
    binding = ServiceBinding(
        OrchestratorServicer(progress), pb_grpc.add_OrchestratorServiceServicer_to_server, FULL_NAME
    )
    server = GrpcServer(
        config.grpc.listen_address(config.endpoints.orchestrator),
        [binding],
        config.grpc,
        security=for_service(config, "orchestrator"),
        metrics=service_metrics,
    )
    await server.start()
    log.info("serving on %s; %d steps to run", config.endpoints.orchestrator, orch.total_steps)
    exit_code = EXIT_SIGNALLED

    def finished(task: asyncio.Task[None]) -> None:
        nonlocal exit_code
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            exit_code = 0
            log.info("run finished: %d steps", progress.step)
        elif is_disk_full(error):  # every retry would fail the same way: stop, once
            exit_code = EXIT_DISK_FULL
            progress.state = "failed"
            message = (
                f"run stopped after step {progress.step}: {error}. Steps up to "
                f"{progress.step} are kept; free space, then continue with the same "
                "`tidal rl` command plus --resume"
            )
            print(f"orchestrator: {message}", file=sys.stderr)  # one line, no traceback
        else:
            # A configuration that does not fit its peers fails the same way every time:
            # exit 2, which `tidal rl` does not restart (tidal.cli.supervision).
            exit_code = EXIT_CONFIG if isinstance(error, ConfigError) else EXIT_FAILED
            progress.state = "failed"
            log.error("run failed after step %d: %s", progress.step, error, exc_info=error)
            print(f"orchestrator: run failed after step {progress.step}: {error}", file=sys.stderr)
        if error is not None or orch.exit_when_done:
            server.request_stop()

    run = asyncio.create_task(
        run_training(config, progress, run_log, mixture, prompts, verifier, prom, model_rewards)
    )
    run.add_done_callback(finished)
    await server.serve_forever()
    if not run.done():
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        log.warning("stopped by signal at step %d of %d", progress.step, orch.total_steps)
    if wandb_sink is not None:
        wandb_sink.finish()
    provider.shutdown()
    return exit_code


def main(argv: Sequence[str] | None = None) -> None:
    # Tasks are checked before credentials: a bad task path is the likelier mistake.
    config = start_service(OrchestratorRunConfig, "orchestrator", argv, check_credentials=False)
    try:
        mixture = build_mixture(config)
        connect_tasks(
            list(mixture.tasks.values()), inference=config.inference, model=config.model_folder()
        )
        prompts = build_prompt_renderer(config)
        prompts.check_tasks(list(mixture.tasks.values()))
        if config.orchestrator.wandb.enabled:
            import_wandb()  # installed? (exit 2 naming the extra, before anything starts)
    except ConfigError as exc:
        print(f"orchestrator: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    check_or_exit(config, "orchestrator")
    # verifier workers fork from a process forked here, before gRPC starts threads
    verifier = VerifierPool(mixture.tasks, timeout_s=config.orchestrator.timeouts.verifier_s)
    try:
        # reward-model workers fork here too; judges only check their settings
        model_rewards = build_model_rewards(config.orchestrator.task_list, list(mixture.tasks))
    except ConfigError as exc:
        verifier.close()
        print(f"orchestrator: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    try:
        code = asyncio.run(serve(config, mixture, prompts, verifier, model_rewards))
    finally:
        verifier.close()
    raise SystemExit(code)
