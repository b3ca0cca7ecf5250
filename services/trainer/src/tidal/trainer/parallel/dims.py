"""How the trainer's ranks divide the work: `ParallelDims`, validated once, meshes built once.

World = dp_replicate × dp_shard × cp; expert parallelism borrows its ranks from
dp_shard, so it costs no extra GPUs. A wrong product is the most common launch mistake,
so violations are found before any process group exists, with the arithmetic in the
message. The mesh is built once with named dimensions and flattened views the rest of
the code asks for by purpose ("dp", "dp_shard_cp", "edp").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tidal.common.errors import ConfigError


@dataclass(frozen=True)
class ParallelDims:
    dp_replicate: int
    dp_shard: int
    cp: int
    ep: int
    world_size: int

    @classmethod
    def build(
        cls, *, world_size: int, dp_replicate: int = 1, dp_shard: int = -1, cp: int = 1, ep: int = 1
    ) -> ParallelDims:
        """Resolve `dp_shard = -1` and validate; raises ConfigError naming the fields."""
        for name, value in (("dp_replicate", dp_replicate), ("cp", cp), ("ep", ep)):
            if value < 1:
                raise ConfigError(f"trainer.parallel.{name} must be >= 1, got {value}")
        if world_size < 1:
            raise ConfigError(f"trainer.world_size must be >= 1, got {world_size}")
        if dp_shard == -1:
            rest = dp_replicate * cp
            if world_size % rest:
                raise ConfigError(
                    f"trainer.world_size {world_size} is not divisible by dp_replicate × cp = "
                    f"{dp_replicate} × {cp} = {rest}; change trainer.world_size or "
                    "trainer.parallel.dp_replicate / cp"
                )
            dp_shard = world_size // rest
        elif dp_shard < 1:
            raise ConfigError(f"trainer.parallel.dp_shard must be >= 1 or -1, got {dp_shard}")
        product = dp_replicate * dp_shard * cp
        if product != world_size:
            raise ConfigError(
                f"dp_replicate × dp_shard × cp = {dp_replicate} × {dp_shard} × {cp} = {product}, "
                f"but trainer.world_size is {world_size}; set trainer.parallel.dp_shard = -1 to "
                "take the rest, or change the factors"
            )
        if dp_shard % ep:
            raise ConfigError(
                f"trainer.parallel.ep {ep} must divide dp_shard {dp_shard} (expert-parallel "
                "ranks are taken from the data-parallel shard ranks)"
            )
        return cls(dp_replicate, dp_shard, cp, ep, world_size)

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many different batches are trained at once."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp_enabled(self) -> bool:
        return self.dp_shard * self.cp > 1

    def check_experts(self, num_experts: int) -> None:
        if num_experts % self.ep:
            raise ConfigError(
                f"trainer.parallel.ep {self.ep} must divide the model's {num_experts} experts"
            )

    @property
    def dp_shard_mod_ep(self) -> int:
        """Expert data-parallel degree within a shard group: how many EP groups it holds."""
        return self.dp_shard // self.ep

    def build_mesh(self, device_type: str) -> Any:
        """The named DeviceMesh and its flattened views (collective: every rank calls it).

        Dims ("dp_replicate", "dp_shard_mod_ep", "ep", "cp"): dp_shard is split into
        EP groups of `ep` neighbouring ranks. Views: "dp_shard" = (dp_shard_mod_ep, ep),
        "dp" = every data-parallel rank, "dp_shard_cp" = what FSDP shards over, "edp" =
        (dp_replicate, dp_shard_mod_ep): the ranks holding the same experts.
        """
        # torch stays out of the config path: parallel_config.py imports this module.
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(
            device_type,
            (self.dp_replicate, self.dp_shard_mod_ep, self.ep, self.cp),
            mesh_dim_names=("dp_replicate", "dp_shard_mod_ep", "ep", "cp"),
        )
        mesh["dp_shard_mod_ep", "ep"]._flatten("dp_shard")
        mesh["dp_replicate", "dp_shard_mod_ep", "ep"]._flatten("dp")
        mesh["dp_shard_mod_ep", "ep", "cp"]._flatten("dp_shard_cp")
        mesh["dp_replicate", "dp_shard_mod_ep"]._flatten("edp")
        return mesh
