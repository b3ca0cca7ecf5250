"""Every lever combination `tidal plan --fit` can answer is one the trainer accepts.

The search space is the planner's own: `fit` answers only from `fit.candidates(base,
workload)`, enumerated here for every device the planner plans for (`Workload.device`),
world sizes 1 and 2, and run configs that differ in what the search keeps from the config
(model implementation, LoRA, compile, optimizer) or must override (levers the config
already sets). Each candidate's answer, the TOML `--fit` prints (`plan.overlay`), is laid
over its run config by the real config loader, and the result must pass the trainer's
config validation (`RunConfig` → `TrainerConfig` with its lever, offload and parallel
validators), pass the trainer's start checks (`check_levers_at_start`, as `Trainer` calls
it), and read back as exactly the planned levers. At world size 1 a real `Trainer` is
built from every such config and trains a step (slow).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tidal.batch.tensors import MicroBatchData
from tidal.cli.config import RunConfig
from tidal.cli.memory_plan import overlay
from tidal.common.config.loading import load_config
from tidal.trainer.memory.optim_state_offload import OffloadedStateOptimizer
from tidal.trainer.memory_config import check_levers_at_start
from tidal.trainer.memory_planner.estimate import Workload
from tidal.trainer.memory_planner.fit import candidates
from tidal.trainer.memory_planner.levers import Levers
from tidal.trainer.train_step import Trainer

DEFAULT = Path(__file__).resolve().parents[4] / "configs" / "default.toml"
DEVICES = typing.get_args(typing.get_type_hints(Workload)["device"])
WORLD_SIZES = (1, 2)
# Run configs (laid over configs/default.toml): what the search keeps, and levers it may
# have to turn off or change.
BASES = {
    "default": "",
    "hf model": '[trainer.model]\nimpl = "hf"\n',
    "lora": '[trainer.model.lora]\nrank = 4\ntarget_modules = ["q_proj", "v_proj"]\n',
    "compile": '[trainer.model.compile]\nbackend = "aot_eager"\n',
    "sgd": '[trainer.optim]\ntype = "sgd"\nmomentum = 0.9\n',
    "levers on": (
        "[trainer.model]\nfused_lm_head_token_chunk_size = 64\nfsdp_cpu_offload = true\n"
        '[trainer.model.ac]\nmode = "full"\nfreq = 2\n'
        "[trainer.model.ac_offloading]\nmax_inflight_activations = 2\n"
    ),
    "selective ac": '[trainer.model.ac]\nmode = "selective"\ntargets = ["attention", "mlp"]\n',
    "host optimizer offload": "[trainer.optim]\noptim_cpu_offload = true\n",
    "disk optimizer offload": '[trainer.optim]\noptim_offload = "disk"\n',
}
SLOW_BASES = ("compile",)  # compiling every candidate's blocks would take minutes


def load(*layers: Path) -> RunConfig:
    argv = ["@", str(DEFAULT)]
    for path in layers:
        argv += ["@", str(path)]
    return load_config(RunConfig, argv, environ={})[0]


def answers(base: str, tmp_path: Path, world_sizes: tuple[int, ...]) -> Iterator[tuple]:  # type: ignore[type-arg]
    """(device, world size, candidate, the run config with its answer laid over) of every
    candidate the planner has for run config `base`."""
    base_file = tmp_path / "base.toml"
    base_file.write_text(BASES[base])
    configured = load(base_file)
    levers = Levers.from_config(configured.trainer)
    for device in DEVICES:
        for world_size in world_sizes:
            workload = Workload(tokens=64, world_size=world_size, device=device)
            for i, candidate in enumerate(candidates(levers, workload)):
                answer = tmp_path / f"fit-{device}-{world_size}-{i}.toml"
                answer.write_text(
                    overlay(candidate, levers, world_size, configured.trainer.world_size)
                )
                yield device, world_size, candidate, load(base_file, answer)


@pytest.mark.parametrize("base", BASES)
def test_every_candidate_passes_the_trainers_checks_and_reads_back(
    base: str, tmp_path: Path
) -> None:
    seen = set()
    for device, world_size, candidate, config in answers(base, tmp_path, WORLD_SIZES):
        where = f"{base}, {device}, world size {world_size}: {candidate.names()}"
        assert config.trainer.world_size == world_size, where
        check_levers_at_start(config.trainer.model, sharded=world_size > 1)
        assert Levers.from_config(config.trainer) == candidate, where
        seen.add((device, world_size))
    assert len(seen) == len(DEVICES) * len(WORLD_SIZES)


@pytest.mark.slow
@pytest.mark.parametrize("base", [b for b in BASES if b not in SLOW_BASES])
def test_every_one_rank_candidate_builds_a_trainer_that_trains(
    base: str, tmp_path: Path, step_batches: Callable[[int], list[MicroBatchData]]
) -> None:
    tried = set()
    for _, _, candidate, config in answers(base, tmp_path, (1,)):
        if candidate in tried:  # the CPU candidates are among the CUDA ones
            continue
        tried.add(candidate)
        trainer = Trainer(config.trainer, seed=0, device=torch.device("cpu"))
        metrics = trainer.train_step(1, step_batches(1), "pg")
        assert metrics["skipped"] == 0.0 and metrics["loss_tokens"] > 0, candidate.names()
        if isinstance(trainer.optimizer, OffloadedStateOptimizer):
            trainer.optimizer.close()
    assert tried
