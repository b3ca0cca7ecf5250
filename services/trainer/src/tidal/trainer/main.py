"""The trainer service: `tidal trainer @ cfg.toml` (entry point: launch.py).

`start_trainer` builds the trainer (restored with `--resume`), serves NOT_SERVING, waits
for weightsync, publishes version 0 (resumed: replays the journal, publishes the restored
version if missing), then SERVING; one process then builds its optimizer and imports DCP
on a background thread while the first batch is made. `serve` adds telemetry and SIGTERM.
Under torchrun every rank builds and restores its shard and rank 0 serves a
`TorchrunLeader`: the only difference the runner and servicer never see. torch is
imported at the top; the entry point imports this module only after the config parsed.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from tidal.common.errors import FailedPrecondition, Unavailable
from tidal.common.grpc.server import GrpcServer, ServiceBinding
from tidal.common.observability.prometheus import ServiceMetrics
from tidal.common.observability.tracing import setup_telemetry
from tidal.common.process.service_start import settle_startup_heap
from tidal.common.security.transport import for_service
from tidal.models.device import resolve_device
from tidal.rpc.v1 import trainer_pb2_grpc as pb_grpc
from tidal.text.agreement import tokenizer_info
from tidal.text.loader import load_tokenizer
from tidal.trainer.config import TrainerRunConfig
from tidal.trainer.persistence.checkpoint import DCP_MODULE, CheckpointManager
from tidal.trainer.persistence.hf_folder_files import hf_folder_files
from tidal.trainer.persistence.journal import StepJournal, journal_dir
from tidal.trainer.persistence.publisher import WeightPublisher
from tidal.trainer.prometheus import TrainerMetrics
from tidal.trainer.runner import StepRunner
from tidal.trainer.service_trainer import ServiceTrainer
from tidal.trainer.servicer import TrainerServicer
from tidal.trainer.step_persistence import StepPersistence
from tidal.trainer.train_step import Trainer
from tidal.weights.client import WeightSyncClient

if TYPE_CHECKING:  # torchrun only, imported where used: they pull in DTensor and sympy
    from tidal.trainer.leader import ControlChannel
    from tidal.trainer.torchrun_ranks import TorchrunRanks

log = logging.getLogger(__name__)
FULL_NAME = "tidal.rpc.v1.TrainerService"


@dataclass
class RunningTrainer:
    server: GrpcServer
    runner: StepRunner
    client: WeightSyncClient

    async def stop(self) -> None:
        await self.server.stop()
        await self.close()

    async def close(self) -> None:
        """After the server stopped: the step in flight finishes its checkpoint first."""
        await self.runner.flush()
        await self.client.close()


def journals(config: TrainerRunConfig) -> bool:
    """Whether this trainer journals its steps (rank 0, for a torchrun job: its leader
    drives every rank through the same steps, replay included): with checkpoints on and
    `trainer.ckpt.journal`."""
    ckpt = config.trainer.ckpt
    return ckpt.journal and ckpt.interval != 0


def build_trainer(
    config: TrainerRunConfig,
    *,
    ranks: TorchrunRanks | None = None,
    channel: ControlChannel | None = None,
) -> tuple[Trainer, CheckpointManager]:
    """The trainer (restored with `--resume`: its newest checkpoint, else its initial
    weights, the journal after either replayed by the runner) and its checkpoints.
    Under torchrun every rank calls this (the restore is collective); `channel` makes
    rank 0's checkpoint manager command the other ranks' saves."""
    torch.set_num_threads(config.trainer.num_threads)
    seed = config.run.seed
    if ranks is None:
        device = resolve_device(config.trainer.device, service="trainer")
        trainer = Trainer(config.trainer, seed=seed, device=device)
    else:
        trainer = Trainer(config.trainer, seed=seed, device=ranks.device, ranks=ranks)
    ckpt = config.trainer.ckpt
    if channel is not None:
        from tidal.trainer.leader import LeaderCheckpoints

        checkpoints: CheckpointManager = LeaderCheckpoints(
            config.checkpoint_dir, keep_last=ckpt.keep_last, channel=channel
        )
    else:
        checkpoints = CheckpointManager(config.checkpoint_dir, keep_last=ckpt.keep_last)
    if ranks is not None:  # every rank builds its optimizer before the first collective
        trainer.build_optimizer_now()
    if config.resume and checkpoints.latest() is not None:
        checkpoints.load(trainer)  # every rank loads its shards (DCP reshards)
    elif config.resume:  # nothing checkpointed: the initial weights, then the journal
        where = journal_dir(config.checkpoint_dir)
        log.info("resumed from %s (step 0): no checkpoint yet, the journal is replayed", where)
    return trainer, checkpoints


async def start_trainer(
    config: TrainerRunConfig, *, ranks: TorchrunRanks | None = None
) -> RunningTrainer:
    """Build, serve NOT_SERVING, publish version 0, then SERVING. Raises FailedPrecondition
    (after stopping what it started) when weightsync already holds versions. With `ranks`
    this is rank 0 of a torchrun job, leading the others."""
    channel = None
    if ranks is not None:
        from tidal.trainer.leader import ControlChannel

        channel = ControlChannel(ranks)
    local, checkpoints = build_trainer(config, ranks=ranks, channel=channel)
    trainer: ServiceTrainer = local
    if channel is not None:
        from tidal.trainer.leader import TorchrunLeader

        trainer = TorchrunLeader(local, channel)
    device = str(trainer.device)
    ckpt = config.trainer.ckpt
    security = for_service(config, "trainer")
    client = WeightSyncClient(config.endpoints.weightsync, config.grpc, security=security)
    # Broadcast replicas reach this trainer's TCP store at the host of its endpoint.
    host = config.endpoints.trainer.rsplit(":", 1)[0]
    # Versions are complete model folders: token ids, tokenizer files, generation config.
    tokenizer = load_tokenizer(config.run.tokenizer, model_path=config.model_folder())
    folder_files = hf_folder_files(tokenizer, source=config.model_folder())
    publisher = WeightPublisher(
        config.publish_dir,
        client,
        folder_files.config(trainer.hf_config()),
        advertise_host=host,
        adapter_config=trainer.adapter_config(),
        files=folder_files.files,
        weightsync_address=config.endpoints.weightsync,
        wait_s=config.trainer.weightsync_timeout_s,
    )
    metrics = ServiceMetrics("trainer", config.metrics)
    trainer_metrics = TrainerMetrics.on(metrics)
    journaled = journals(config)
    persistence = StepPersistence(
        trainer,
        publisher,
        checkpoints=checkpoints,
        interval=ckpt.every(journaled=journaled),
        journal=StepJournal(config.checkpoint_dir) if journaled else None,
        # Several ranks save with collectives: their writes end before Train answers.
        background=config.trainer.background_publish and ranks is None,
        metrics=trainer_metrics,
    )
    if ranks is None:  # one process: its next update waits for these writes (`gate`)
        local.update_gate = persistence.gate
    runner = StepRunner(persistence, metrics=trainer_metrics)
    # The degree micro-batches are split over (leader.py); the orchestrator packs for it.
    dp = ranks.dims.dp if ranks is not None else 1
    servicer = TrainerServicer(
        runner,
        device=device,
        data_parallel_ranks=dp,
        tokenizer=tokenizer_info(tokenizer),
        grpc_config=config.grpc,
    )
    binding = ServiceBinding(servicer, pb_grpc.add_TrainerServiceServicer_to_server, FULL_NAME)
    address = config.grpc.listen_address(config.endpoints.trainer)
    server = GrpcServer(address, [binding], config.grpc, security=security, metrics=metrics)
    running = RunningTrainer(server, runner, client)
    await running.server.start(serving=False)
    log.info("model %s on %s; publishing to %s", trainer.describe(), device, config.publish_dir)
    try:
        await (runner.resume() if config.resume else runner.start())
    except BaseException:
        await running.stop()
        raise
    await running.server.set_serving(True)
    if isinstance(local, Trainer) and channel is None:
        prepare_first_step(local, checkpoints=ckpt.interval != 0)
    return running


def prepare_first_step(trainer: Trainer, *, checkpoints: bool) -> threading.Thread:
    """Off the start-up path, once the trainer serves: build the optimizer (its first
    build imports torch._dynamo) and, when checkpointing, import DCP, on a daemon thread,
    while the orchestrator makes the first batch. A step that comes first waits for the
    same build (train_step.py) or, on Python's import lock, the same import. Then the
    start-up heap is settled: torch, the model and the optimizer are in."""

    def prepare() -> None:
        trainer.build_optimizer_now()
        if checkpoints:
            importlib.import_module(DCP_MODULE)
        settle_startup_heap()

    thread = threading.Thread(target=prepare, name="prepare-first-step", daemon=True)
    thread.start()
    return thread


async def serve(config: TrainerRunConfig, ranks: TorchrunRanks | None = None) -> None:
    provider = setup_telemetry("trainer", config.telemetry, config.run.dir)
    try:
        running = await start_trainer(config, ranks=ranks)
    except (FailedPrecondition, Unavailable) as exc:
        log.error("cannot start: %s", exc)
        provider.shutdown()
        raise SystemExit(1) from None
    log.info("serving on %s", config.endpoints.trainer)
    served = running.runner.trainer
    # SIGTERM abandons a running step at its next micro-batch (one process; see
    # Trainer.request_stop), so the shutdown does not wait for a long step to end.
    on_signal = served.request_stop if isinstance(served, Trainer) else None
    await running.server.serve_forever(on_stop=running.close, on_signal=on_signal)
    running.runner.trainer.stop()  # releases the follower ranks, if any
    provider.shutdown()
