"""Run the orchestrator: `tidal orchestrator @ cfg.toml` or `python -m tidal.orchestrator`.

Decisions:
- The gRPC server (GetProgress, health) starts first, so progress is visible while the
  orchestrator waits for its peers.
- Peers are awaited with health Watch (wait-for-ready, `peer_wait_s` deadline), then
  inference must have loaded a policy version (≥ 0) before the first step.
- If the trainer has already trained steps (the orchestrator was restarted), the loop
  resumes at the trainer's next step instead of failing on a step-order error.
- Exit codes: 0 after the last step (with `exit_when_done`, after a graceful server
  stop); 1 with a message naming the failed peer and call; 143 when stopped by a
  signal before the run finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Sequence

from tidal.common.config import load_or_exit
from tidal.common.logging import setup_logging
from tidal.common.server import GrpcServer, ServiceBinding
from tidal.common.telemetry import setup_telemetry
from tidal.common.tokenizer import get_tokenizer
from tidal.orchestrator.config import OrchestratorRunConfig
from tidal.orchestrator.inference_client import InferenceClient
from tidal.orchestrator.loop import RLLoop
from tidal.orchestrator.metrics import METRICS_FILE, MetricsLog
from tidal.orchestrator.policy import PolicyGate
from tidal.orchestrator.progress import ProgressState
from tidal.orchestrator.report import REWARD_PLOT, print_summary, summarize, write_reward_plot
from tidal.orchestrator.servicer import OrchestratorServicer
from tidal.orchestrator.tasks import build_task
from tidal.orchestrator.trainer_client import TrainerClient
from tidal.rpc.v1 import orchestrator_pb2_grpc as pb_grpc
from tidal.weightsync.client import WeightSyncClient

log = logging.getLogger(__name__)
FULL_NAME = "tidal.rpc.v1.OrchestratorService"
REPLICA_ID = "orchestrator"
EXIT_FAILED, EXIT_SIGNALLED = 1, 143


async def run_training(
    config: OrchestratorRunConfig, progress: ProgressState, metrics: MetricsLog
) -> None:
    """Wait for the peers, run every step, then write the reward plot and the summary."""
    orch = config.orchestrator
    inference = InferenceClient(config.endpoints.inference, config.grpc)
    trainer = TrainerClient(config.endpoints.trainer, config.grpc)
    weightsync = WeightSyncClient(config.endpoints.weightsync, config.grpc)
    gate = PolicyGate(inference, progress)
    follow: asyncio.Task[None] | None = None
    try:
        log.info("waiting for inference and trainer (up to %.0fs)", orch.peer_wait_s)
        await asyncio.gather(
            inference.wait_serving(orch.peer_wait_s), trainer.wait_serving(orch.peer_wait_s)
        )
        await gate.wait_loaded(0, timeout=orch.peer_wait_s)
        first_step = await trainer.last_step() + 1
        started = time.monotonic()  # the summary's time excludes waiting for peers
        if first_step > 1:
            log.info("trainer has trained %d steps; resuming at %d", first_step - 1, first_step)
        follow = asyncio.create_task(gate.follow_publishes(weightsync, REPLICA_ID))
        follow.add_done_callback(_warn_if_failed)
        loop = RLLoop(
            orch,
            seed=config.run.seed,
            task=build_task(orch.task),
            inference=inference,
            trainer=trainer,
            gate=gate,
            progress=progress,
            metrics=metrics,
            tokenizer=get_tokenizer(config.run.tokenizer),
        )
        await loop.run(first_step=first_step)
    finally:
        if follow is not None:
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await follow
        for client in (inference, trainer, weightsync):
            await client.close()
    summary = summarize(metrics.records, time.monotonic() - started)
    await asyncio.to_thread(write_reward_plot, metrics.records, config.run.dir / REWARD_PLOT)
    print_summary(summary)


def _warn_if_failed(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("lost the weightsync version stream: %s", task.exception())


async def serve(config: OrchestratorRunConfig) -> int:
    """Serve GetProgress, run the loop; returns the process exit code."""
    provider = setup_telemetry("orchestrator", config.telemetry, config.run.dir)
    orch = config.orchestrator
    progress = ProgressState(total_steps=orch.total_steps, recent_limit=orch.recent_steps)
    metrics = MetricsLog(config.run.dir / METRICS_FILE)
    binding = ServiceBinding(
        OrchestratorServicer(progress), pb_grpc.add_OrchestratorServiceServicer_to_server, FULL_NAME
    )
    server = GrpcServer(
        config.grpc.listen_address(config.endpoints.orchestrator), [binding], config.grpc
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
        else:
            exit_code = EXIT_FAILED
            progress.state = "failed"
            log.error("run failed after step %d: %s", progress.step, error, exc_info=error)
            print(f"orchestrator: run failed after step {progress.step}: {error}", file=sys.stderr)
        if error is not None or orch.exit_when_done:
            server.request_stop()

    run = asyncio.create_task(run_training(config, progress, metrics))
    run.add_done_callback(finished)
    await server.serve_forever()
    if not run.done():
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        log.warning("stopped by signal at step %d of %d", progress.step, orch.total_steps)
    provider.shutdown()
    return exit_code


def main(argv: Sequence[str] | None = None) -> None:
    config = load_or_exit(
        OrchestratorRunConfig,
        sys.argv[1:] if argv is None else argv,
        usage="tidal orchestrator @ cfg.toml",
    )
    setup_logging("orchestrator", level=config.telemetry.log_level)
    raise SystemExit(asyncio.run(serve(config)))
