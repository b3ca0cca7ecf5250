"""`python -m tidal.trainer` (`tidal trainer`): one process, or with `--trainer.world-size N`
one torchrun job on this node.

The command re-executes itself under torchrun's own launcher (`exec` keeps the PID, so
whoever started it still signals the right process). Inside torchrun every rank builds
its shard of the trainer; rank 0 serves gRPC and leads (`leader.py`), the others follow
until rank 0 says stop, so followers ignore SIGTERM and leave on rank 0's `stop`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

from tidal.common.process.service_start import start_service
from tidal.trainer.config import TrainerRunConfig

log = logging.getLogger(__name__)


def torchrun_command(world_size: int, argv: Sequence[str]) -> list[str]:
    """The command running `tidal.trainer` with `argv` as `world_size` local ranks."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world_size}",
        "-m",
        "tidal.trainer",
        *argv,
    ]


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m tidal.trainer`: one process, or (`world_size` > 1) one torchrun job.

    The entry point lives here, not in main.py, so the service never imports its own
    launcher."""
    args = sys.argv[1:] if argv is None else list(argv)
    config = start_service(TrainerRunConfig, "trainer", args)
    if config.trainer.world_size > 1:
        run_rank(config, args)
        return
    from tidal.trainer.main import serve  # torch: only once the config parsed

    asyncio.run(serve(config))


def run_rank(config: TrainerRunConfig, argv: Sequence[str]) -> None:
    """Outside torchrun: become torchrun. Inside: run this rank (rank 0 serves)."""
    if "LOCAL_RANK" not in os.environ:
        command = torchrun_command(config.trainer.world_size, argv)
        os.environ.setdefault("OMP_NUM_THREADS", str(config.trainer.num_threads))
        os.execv(command[0], command)
    # torch: only once the config parsed (and this process is a rank), so --help is instant.
    from tidal.models.device import resolve_device
    from tidal.trainer.leader import ControlChannel, follow
    from tidal.trainer.main import build_trainer, serve
    from tidal.trainer.torchrun_ranks import TorchrunRanks

    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    device = resolve_device(config.trainer.device, service="trainer", local_ranks=local_ranks)
    ranks = TorchrunRanks.init(config.trainer, device.type)
    try:
        if ranks.rank == 0:
            asyncio.run(serve(config, ranks))
        else:
            # torchrun passes SIGTERM to every rank at once; a follower waits for rank 0's
            # `stop` (sent after its graceful gRPC shutdown) instead of dying mid-collective.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            trainer, checkpoints = build_trainer(config, ranks=ranks)
            log.info("rank %d of %d follows rank 0", ranks.rank, ranks.world_size)
            follow(trainer, checkpoints, ControlChannel(ranks))
    finally:
        ranks.close()
