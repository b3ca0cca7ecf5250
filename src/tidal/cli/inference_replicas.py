"""The inference children `tidal rl` starts: one per replica, each told who it is.

With `inference.replicas = N`, child i gets its address from `endpoints.inference_replicas`,
replica id `<id>-i` (stable across restarts, so weightsync sees the same replica come
back), HTTP port + i and the i-th slice of inference's GPUs. One replica keeps the
single-replica names and takes everything from the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidal.cli.config import RunConfig


@dataclass(frozen=True)
class Replica:
    """One inference child: its name (log file, messages), arguments and environment."""

    name: str
    args: tuple[str, ...]
    env: dict[str, str]


def split_devices(devices: str, parts: int) -> list[str]:
    """`"0,1,2,3"` into `parts` equal comma-separated slices (`devices` "" stays "")."""
    ids = [d for d in devices.split(",") if d]
    if not ids:
        return [devices] * parts
    size = len(ids) // parts
    return [",".join(ids[i * size : (i + 1) * size]) for i in range(parts)]


def inference_replicas(config: RunConfig, env: dict[str, str]) -> list[Replica]:
    """Every inference child of the run (after `prepare_run_dir` resolved the ports)."""
    replicas = config.inference.replicas
    if replicas == 1:
        return [Replica("inference", (), env)]
    addresses = config.endpoints.inference_replicas
    if len(addresses) != replicas:
        raise ValueError(
            f"inference.replicas = {replicas} but endpoints.inference_replicas lists "
            f"{len(addresses)} addresses"
        )
    http = config.inference.http
    base_id = config.inference.replica_id or "inference"
    devices = env.get("CUDA_VISIBLE_DEVICES")
    slices = split_devices(devices, replicas) if devices is not None else None
    out = []
    for i, address in enumerate(addresses):
        args = ["--endpoints.inference", address, "--inference.replica_id", f"{base_id}-{i}"]
        if http.enabled:
            args += ["--inference.http.port", str(http.port + i)]
        replica_env = dict(env)
        if slices is not None:
            replica_env["CUDA_VISIBLE_DEVICES"] = slices[i]
        out.append(Replica(f"inference-{i}", tuple(args), replica_env))
    return out
