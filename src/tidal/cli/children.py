"""The inference replicas `tidal rl` starts: one child per replica, each told who it is.

Decisions:
- `inference.replicas = N` starts N inference processes, "inference-0".."inference-<N-1>",
  from the one run config: each gets its own `--endpoints.inference` (its gRPC address,
  from `endpoints.inference_replicas`), `--inference.replica_id inference-<i>` (a stable
  weight-sync registration per replica, so a restarted replica is the same replica, not
  one more), and with `[inference.http]` on `--inference.http.port P+i` (P =
  `inference.http.port`, the one in config.toml). Each logs to
  `logs/inference-<i>.log`. One replica keeps the single-replica names ("inference",
  `logs/inference.log`) and takes everything from the file.
- The same arguments start and restart a replica (supervision.py): its address is its
  identity, so the orchestrator's pool sees a restarted replica come back there.
- With `[deployment] num_infer_gpus = G`, replica i gets the i-th of N equal slices of
  inference's GPUs (G must be a multiple of N; checked in launcher.apply_placement).
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
