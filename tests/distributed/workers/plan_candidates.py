"""Every lever combination `tidal plan --fit` can answer at world size 2 trains on 2 ranks.

    torchrun --nproc-per-node 2 plan_candidates.py --out x.pt

The candidates are the planner's own (`fit.candidates`) for the default run config at
world size 2 on every device the planner plans for (the CUDA ones include the CPU ones).
Each answer (`plan.overlay`) is laid over configs/default.toml by the real config
loader; the real `Trainer` is built from the result on the 2 gloo ranks (FSDP2, as
`tidal trainer` runs it) and trains one policy-gradient step of `trainer_ranks.py`'s
data, each rank its share. Rank 0 saves, per candidate, its lever names, the step's
metrics and how far its weights after the step are from the first candidate's (no lever).
"""

from __future__ import annotations

import argparse
import tempfile
import typing
from pathlib import Path

import torch
from trainer_ranks import step_batches

from tidal.cli.config import RunConfig
from tidal.cli.memory_plan import overlay
from tidal.common.config.loading import load_config
from tidal.trainer.memory.optim_state_offload import OffloadedStateOptimizer
from tidal.trainer.memory_planner.estimate import Workload
from tidal.trainer.memory_planner.fit import candidates
from tidal.trainer.memory_planner.levers import Levers
from tidal.trainer.parallel.assign import shares_by_rank
from tidal.trainer.torchrun_ranks import TorchrunRanks
from tidal.trainer.train_step import Trainer

DEFAULT = Path(__file__).resolve().parents[3] / "configs" / "default.toml"
WORLD_SIZE = 2


def answers(folder: Path) -> list[tuple[Levers, RunConfig]]:
    """(candidate, run config with its answer laid over), in the same order on every rank."""
    configured = load_config(RunConfig, ["@", str(DEFAULT)], environ={})[0]
    levers = Levers.from_config(configured.trainer)
    found: list[Levers] = []
    for device in typing.get_args(typing.get_type_hints(Workload)["device"]):
        workload = Workload(tokens=64, world_size=WORLD_SIZE, device=device)
        found += [c for c in candidates(levers, workload) if c not in found]
    out = []
    for i, candidate in enumerate(found):
        path = folder / f"fit-{i}.toml"
        path.write_text(overlay(candidate, levers, WORLD_SIZE, configured.trainer.world_size))
        argv = ["@", str(DEFAULT), "@", str(path)]
        out.append((candidate, load_config(RunConfig, argv, environ={})[0]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        runs = answers(Path(folder))
    ranks = TorchrunRanks.init(runs[0][1].trainer, "cpu")
    share = shares_by_rank(step_batches(1, WORLD_SIZE), WORLD_SIZE)[ranks.rank]
    results, first = [], None
    for candidate, config in runs:
        trainer = Trainer(config.trainer, seed=0, device=ranks.device, ranks=ranks)
        metrics = trainer.train_step(1, share, "pg")
        weights = trainer.state_dict_for_publish()  # collective: every rank gathers
        first = first or weights
        drift = max(float((weights[k] - first[k]).abs().max()) for k in first)
        results.append({"levers": candidate.names(), "weight_drift": drift, **metrics})
        if isinstance(trainer.optimizer, OffloadedStateOptimizer):
            trainer.optimizer.close()
    if ranks.rank == 0:
        torch.save(results, args.out)
    ranks.close()


if __name__ == "__main__":
    main()
