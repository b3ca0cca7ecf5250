"""The trainer service: `tidal trainer @ cfg.toml` or `python -m tidal.trainer` (whose entry
point, `parallel/launch.py`'s `main`, calls `serve`).

Start-up order: model and optimizer (restored from the newest checkpoint with
`--resume`) → gRPC server up but NOT_SERVING (so probes get an answer) → refuse to start
if weightsync already has versions (resumed: versions newer than the checkpoint) →
publish version 0 (resumed: the checkpoint's version, if missing) → SERVING.
`start_trainer` does all of it and is what contract tests run; `serve` adds telemetry and
waits for SIGTERM. With `trainer.world_size` > 1, the entry point re-executes itself under
torchrun (parallel/launch.py): every rank builds and restores its shard of the same trainer, rank 0
then continues here with a leading trainer, the others follow its commands.
torch-bearing modules are imported inside functions, after the config parsed, so
`--help` and `--dry-run` stay instant.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidal.common.errors import ConfigError, FailedPrecondition
from tidal.common.server import GrpcServer, ServiceBinding
from tidal.common.telemetry import setup_telemetry
from tidal.trainer.config import TrainerRunConfig
from tidal.weights.client import WeightSyncClient

if TYPE_CHECKING:
    from tidal.trainer.checkpoint import CheckpointManager
    from tidal.trainer.parallel.leader import ControlChannel
    from tidal.trainer.parallel.runtime import RankContext
    from tidal.trainer.runner import StepRunner
    from tidal.trainer.train_step import Trainer

log = logging.getLogger(__name__)
FULL_NAME = "tidal.rpc.v1.TrainerService"


def resolve_device(name: str, *, local_ranks: int = 1) -> str:
    """`trainer.device` made concrete for a process that is one of `local_ranks` on its host."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return pick_device(name, gpus=gpus, local_ranks=local_ranks)


def pick_device(name: str, *, gpus: int, local_ranks: int) -> str:
    """ "cuda" or "cpu" for `trainer.device = name` given this host's GPUs and trainer ranks.

    Each rank takes its own GPU (`LOCAL_RANK`), so CUDA needs a GPU per local rank: "auto"
    falls back to the CPU (gloo) when there are fewer, saying so, rather than letting rank
    1 die on a one-GPU machine with "invalid device ordinal"; an explicit "cuda" is an error.
    """
    if name == "cpu":
        return name
    if gpus >= local_ranks:
        return "cuda" if gpus else "cpu"
    if name == "cuda":
        raise ConfigError(
            f"trainer.device is 'cuda' but this host has {gpus} GPU(s) for {local_ranks} "
            "trainer rank(s) (one GPU each): lower trainer.world_size (or the ranks per "
            'node) to the GPU count, or set trainer.device = "cpu"'
        )
    if gpus:
        log.warning(
            "trainer.device = 'auto': %d trainer ranks on this host but %d GPU(s), so the "
            "trainer runs on the CPU; set trainer.world_size to at most %d to use the GPUs",
            local_ranks, gpus, gpus,
        )  # fmt: skip
    return "cpu"


@dataclass
class RunningTrainer:
    server: GrpcServer
    runner: StepRunner
    client: WeightSyncClient

    async def stop(self) -> None:
        await self.server.stop()
        await self.client.close()


def build_trainer(
    config: TrainerRunConfig,
    *,
    ranks: RankContext | None = None,
    channel: ControlChannel | None = None,
) -> tuple[Trainer, CheckpointManager, bool]:
    """The trainer (restored with `--resume`), its checkpoints and whether it resumed.
    Under torchrun every rank calls this (the restore is collective); `channel` makes
    rank 0's checkpoint manager command the other ranks' saves."""
    import torch

    from tidal.trainer.checkpoint import CheckpointManager
    from tidal.trainer.train_step import Trainer

    torch.set_num_threads(config.trainer.num_threads)
    device = ranks.device if ranks else torch.device(resolve_device(config.trainer.device))
    trainer = Trainer(config.trainer, seed=config.run.seed, device=device, parallel=ranks)
    ckpt = config.trainer.ckpt
    if channel is not None:
        from tidal.trainer.parallel.leader import LeaderCheckpoints

        checkpoints: CheckpointManager = LeaderCheckpoints(
            config.checkpoint_dir, keep_last=ckpt.keep_last, channel=channel
        )
    else:
        checkpoints = CheckpointManager(config.checkpoint_dir, keep_last=ckpt.keep_last)
    resumed = config.resume and checkpoints.latest() is not None
    if resumed:
        checkpoints.load(trainer)  # every rank loads its shards (DCP reshards)
    elif config.resume:
        log.warning("--resume: no checkpoint under %s; starting fresh", checkpoints.root)
    return trainer, checkpoints, resumed


async def start_trainer(
    config: TrainerRunConfig, *, ranks: RankContext | None = None
) -> RunningTrainer:
    """Build, serve NOT_SERVING, publish version 0, then SERVING. Raises FailedPrecondition
    (after stopping what it started) when weightsync already holds versions. With `ranks`
    this is rank 0 of a torchrun job, leading the others."""
    from tidal.rpc.v1 import trainer_pb2_grpc as pb_grpc
    from tidal.trainer.publisher import WeightPublisher
    from tidal.trainer.runner import StepRunner
    from tidal.trainer.servicer import TrainerServicer

    channel = None
    if ranks is not None:
        from tidal.trainer.parallel.leader import ControlChannel

        channel = ControlChannel(ranks)
    trainer, checkpoints, resumed = build_trainer(config, ranks=ranks, channel=channel)
    if channel is not None:
        from tidal.trainer.parallel.leader import LeaderTrainer

        trainer = LeaderTrainer(trainer, channel)  # type: ignore[assignment]
    device = str(trainer.device)
    ckpt = config.trainer.ckpt
    client = WeightSyncClient(config.endpoints.weightsync, config.grpc)
    # Broadcast replicas reach this trainer's TCP store at the host of its endpoint.
    host = config.endpoints.trainer.rsplit(":", 1)[0]
    publisher = WeightPublisher(
        config.publish_dir,
        client,
        trainer.hf_config(),
        advertise_host=host,
        adapter_config=trainer.adapter_config(),
    )
    runner = StepRunner(
        trainer, publisher, checkpoints=checkpoints, checkpoint_interval=ckpt.interval
    )
    # The degree micro-batches are split over (parallel/leader.py); the orchestrator packs for it.
    dp = ranks.dims.dp if ranks is not None else 1
    servicer = TrainerServicer(runner, device=device, data_parallel_ranks=dp)
    binding = ServiceBinding(servicer, pb_grpc.add_TrainerServiceServicer_to_server, FULL_NAME)
    address = config.grpc.listen_address(config.endpoints.trainer)
    running = RunningTrainer(GrpcServer(address, [binding], config.grpc), runner, client)
    await running.server.start(serving=False)
    log.info("model %s on %s; publishing to %s", trainer.describe(), device, config.publish_dir)
    try:
        await (runner.resume() if resumed else runner.start())
    except BaseException:
        await running.stop()
        raise
    await running.server.set_serving(True)
    return running


async def serve(config: TrainerRunConfig, ranks: RankContext | None = None) -> None:
    provider = setup_telemetry("trainer", config.telemetry, config.run.dir)
    try:
        running = await start_trainer(config, ranks=ranks)
    except FailedPrecondition as exc:
        log.error("cannot start: %s", exc)
        provider.shutdown()
        raise SystemExit(1) from None
    log.info("serving on %s", config.endpoints.trainer)
    await running.server.serve_forever(on_stop=running.client.close)
    if ranks is not None:
        running.runner.trainer.stop()  # type: ignore[attr-defined]  # LeaderTrainer
    provider.shutdown()
