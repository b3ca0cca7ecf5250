"""Run the orchestrator: `tidal orchestrator @ cfg.toml` or `python -m tidal.orchestrator`.

A bad task, tokenizer or chat config fails before any peer is awaited (exit 2,
startup.py). The gRPC server starts first, so progress is visible while the run
(training_run.py) waits for every inference replica, the trainer and a loaded version 0,
runs the loop from its start point and writes the report and summary. Exit codes: 0
done, 1 a failed peer or call, 2 a config its peers refuse, 143 signalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence

from tidal.common.errors import EXIT_DISK_FULL, ConfigError, is_disk_full
from tidal.common.files.durable import as_disk_full
from tidal.common.grpc.server import GrpcServer, ServiceBinding
from tidal.common.observability.prometheus import ServiceMetrics
from tidal.common.observability.tracing import setup_telemetry
from tidal.common.process.service_start import start_service
from tidal.common.security.transport import check_or_exit, for_service
from tidal.orchestrator.config import OrchestratorRunConfig
from tidal.orchestrator.mixture import TaskMixture
from tidal.orchestrator.records.prometheus import OrchestratorMetrics
from tidal.orchestrator.records.run_log import RUN_LOG_FILE, RunLog
from tidal.orchestrator.records.run_status import ProgressState
from tidal.orchestrator.records.wandb_sink import WandbSink, import_wandb
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.rollouts.verifiers_env import connect_tasks
from tidal.orchestrator.scoring.scorers import ModelReward, build_model_rewards
from tidal.orchestrator.scoring.verifier_pool import VerifierPool
from tidal.orchestrator.servicer import OrchestratorServicer
from tidal.orchestrator.startup import build_mixture, build_prompt_renderer
from tidal.orchestrator.training_run import run_training
from tidal.rpc.v1 import orchestrator_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
FULL_NAME = "tidal.rpc.v1.OrchestratorService"
EXIT_FAILED, EXIT_CONFIG, EXIT_SIGNALLED = 1, 2, 143


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
    stopping = False  # set when this function cancels the run itself

    def finished(task: asyncio.Task[None]) -> None:
        nonlocal exit_code
        if task.cancelled():
            if not stopping:
                # A CancelledError escaped the run (a call cancelled under it, not a stop):
                # exit failed so supervision restarts and resumes it, instead of serving idle.
                exit_code = EXIT_FAILED
                progress.state = "failed"
                log.error("run failed after step %d: cancelled from within", progress.step)
                server.request_stop()
            return
        error = task.exception()
        if isinstance(error, Exception):  # an ENOSPC from any write, not only the wrapped ones
            error = as_disk_full(error, config.run.dir)
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
        stopping = True
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
