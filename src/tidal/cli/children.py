"""Which child processes `tidal rl` starts, and which of their deaths the run survives.

Decisions:
- The children are derived from the run's resolved `config.toml` (the file every child
  reads), so whoever starts or restarts them needs nothing but the run folder.
- `inference.replicas = N` starts N inference processes, "inference-0".."inference-<N-1>",
  one config file for all: each gets its own `--endpoints.inference` (its gRPC address,
  taken from `endpoints.inference_replicas`), `--inference.replica_id inference-<i>`
  (a stable weight-sync registration per replica, so a restarted replica is the same
  replica, not one more), and with `[inference.http]` on `--inference.http.port P+i`
  (P = `inference.http.port`, the one in config.toml). Each logs to
  `logs/inference-<i>.log`. One replica keeps the single-replica names
  ("inference", `logs/inference.log`) and takes everything from the file.
- With `[deployment] num_infer_gpus = G`, replica i gets the i-th of N equal slices of
  inference's GPUs (G must be a multiple of N; checked in launcher.apply_placement).
- Survivable loss (`survivable_loss`): while another inference replica still runs, the
  death of one replica does not end the run (the orchestrator routes around it). The
  launcher's supervision loop (restarts with back-off, issue 17) is meant to absorb this
  rule; until then the launcher's wait loop calls it and keeps going.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

START_ORDER = ("weightsync", "trainer", "inference", "orchestrator")
"""Start order of the services: publishers before subscribers; clients wait anyway."""
RESUME_ARGS = {"trainer": ["--resume"], "orchestrator": ["--orchestrator.resume", "true"]}
"""What each child is told on `tidal rl --resume` (inference and weightsync need nothing:
weightsync recovers its versions from the weights folder, inference loads the newest)."""


@dataclass(frozen=True)
class ChildSpec:
    """One child process: its name (log file, messages), the service it runs, its extra
    command-line arguments and environment."""

    name: str
    service: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


def replica_name(index: int, replicas: int) -> str:
    return "inference" if replicas == 1 else f"inference-{index}"


def split_devices(devices: str, parts: int) -> list[str]:
    """`"0,1,2,3"` into `parts` equal comma-separated slices (`devices` "" stays "")."""
    ids = [d for d in devices.split(",") if d]
    if not ids:
        return [devices] * parts
    size = len(ids) // parts
    return [",".join(ids[i * size : (i + 1) * size]) for i in range(parts)]


def inference_specs(config: dict[str, Any], env: dict[str, str]) -> list[ChildSpec]:
    section = config.get("inference", {})
    replicas = int(section.get("replicas", 1))
    if replicas == 1:
        return [ChildSpec("inference", "inference", env=env)]
    addresses = config.get("endpoints", {}).get("inference_replicas", [])
    if len(addresses) != replicas:
        raise ValueError(
            f"inference.replicas = {replicas} but endpoints.inference_replicas lists "
            f"{len(addresses)} addresses"
        )
    http = section.get("http", {})
    base_id = section.get("replica_id") or "inference"
    devices = env.get("CUDA_VISIBLE_DEVICES")
    slices = split_devices(devices, replicas) if devices is not None else None
    specs = []
    for i, address in enumerate(addresses):
        args = ["--endpoints.inference", address, "--inference.replica_id", f"{base_id}-{i}"]
        if http.get("enabled"):
            args += ["--inference.http.port", str(int(http["port"]) + i)]
        replica_env = dict(env)
        if slices is not None:
            replica_env["CUDA_VISIBLE_DEVICES"] = slices[i]
        specs.append(ChildSpec(replica_name(i, replicas), "inference", tuple(args), replica_env))
    return specs


def child_specs(
    run_dir: Path, envs: dict[str, dict[str, str]] | None = None, *, resume: bool = False
) -> list[ChildSpec]:
    """Every child of the run in start order, from `<run_dir>/config.toml`."""
    config = tomllib.loads((run_dir / "config.toml").read_text())
    envs = envs or {}
    specs: list[ChildSpec] = []
    for service in START_ORDER:
        if service == "inference":
            specs += inference_specs(config, envs.get(service, {}))
            continue
        args = tuple(RESUME_ARGS.get(service, [])) if resume else ()
        specs.append(ChildSpec(service, service, args, envs.get(service, {})))
    return specs


def survivable_loss(dead: str, running: Iterable[str]) -> bool:
    """Whether the run goes on after child `dead` exited while `running` still run: an
    inference replica's death is survivable while another replica runs."""
    return dead.startswith("inference-") and any(n.startswith("inference-") for n in running)
