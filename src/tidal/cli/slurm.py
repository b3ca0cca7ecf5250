"""`[slurm]`: `tidal rl` writes one sbatch script placing the whole run across nodes.

The script is rendered from a Jinja2 template a site can replace. Node names are known only
when the job runs, so the script builds the endpoints itself and passes them as flags over
the resolved config (docs/distributed.md, "SLURM").
"""

from __future__ import annotations

import datetime
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from tidal.cli.ports import ephemeral_range
from tidal.common.config.loading import BaseConfig, to_toml
from tidal.common.errors import ConfigError
from tidal.common.observability.prometheus import MetricsConfig
from tidal.common.security.config import SecurityConfig

DEFAULT_TEMPLATE = Path(__file__).resolve().parent / "templates" / "tidal.sbatch.j2"
SCRIPT_NAME = "tidal.sbatch"
SERVICES = ("orchestrator", "inference", "trainer", "weightsync")


class SlurmConfig(BaseConfig):
    job_name: str = "tidal"
    """SLURM job name (`#SBATCH --job-name`)."""
    trainer_nodes: int = Field(default=1, ge=1)
    """Nodes running the trainer (node 0 first); its ranks are trainer_nodes × GPUs per node."""
    inference_nodes: int = Field(default=1, ge=0)
    """Nodes of their own for inference, after the trainer's; the `inference.replicas`
    replicas are spread over them round-robin. 0: inference on node 0 with the others
    (single-node jobs)."""
    gpus_per_node: int = Field(default=0, ge=0)
    """GPUs per node (`--gpus-per-node`); 0 = CPU nodes (one trainer process per node)."""
    cpus_per_task: int | None = Field(default=None, gt=0)
    """`--cpus-per-task`, if the site needs it."""
    partition: str | None = None
    """`--partition`; unset = the cluster's default."""
    account: str | None = None
    """`--account`; unset = the user's default."""
    time: str = "24:00:00"
    """Wall-clock limit (`--time`), e.g. "2-00:00:00" or "00:30:00"."""
    extra_sbatch: list[str] = []
    """More `#SBATCH` lines, e.g. ["--exclusive", "--qos=high"]."""
    setup: str = ""
    """Shell lines run first on the batch node (module loads, `source .venv/bin/activate`)."""
    python: str | None = None
    """Python that runs the services on the nodes; unset: the one running `tidal rl`."""
    rdzv_port: int = Field(default=29500, gt=0, lt=65536)
    """torch.distributed rendezvous port on node 0."""
    template: Path | None = None
    """Jinja2 sbatch template; unset = the packaged `tidal/cli/templates/tidal.sbatch.j2`."""

    @field_validator("time", mode="before")
    @classmethod
    def _time_as_text(cls, value: Any) -> Any:
        # `--slurm.time 00:30:00` parses as a TOML local time; SLURM wants the text.
        return value.strftime("%H:%M:%S") if isinstance(value, datetime.time) else value

    @property
    def nodes(self) -> int:
        return self.trainer_nodes + self.inference_nodes

    @property
    def procs_per_node(self) -> int:
        return self.gpus_per_node or 1

    @property
    def world_size(self) -> int:
        return self.trainer_nodes * self.procs_per_node


def _port(endpoint: str, field: str) -> int:
    try:
        return int(endpoint.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        raise ConfigError(f"{field} {endpoint!r} has no port (host:port)") from None


def ephemeral_ports_note(endpoints: Any, metrics: MetricsConfig, slurm: SlurmConfig) -> str | None:
    """A note naming the job's fixed ports that lie in this machine's ephemeral range
    (None when none does). Nodes take the local port of every outgoing connection from
    that range, so on a node shared with other jobs such a port may be held when its
    service starts, which then cannot bind."""
    low, high = ephemeral_range()
    named = {f"endpoints.{n}": _port(getattr(endpoints, n), f"endpoints.{n}") for n in SERVICES}
    if metrics.enabled and metrics.port != 0:  # 0: any free port
        named |= {
            f"{key}'s metrics port": port + metrics.port_offset
            if metrics.port is None
            else metrics.port
            for key, port in named.items()
        }
    named["slurm.rdzv_port"] = slurm.rdzv_port
    inside = [f"{key} {port}" for key, port in named.items() if low <= port <= high]
    if not inside:
        return None
    return (
        f"these ports lie in this machine's ephemeral port range ({low}-{high}), from which "
        f"a node's outgoing connections take theirs: {', '.join(inside)}. On nodes shared "
        f"with other jobs, choose ports below {low} (docs/distributed.md, SLURM)"
    )


def replica_ports(base: int, count: int, taken: set[int]) -> list[int]:
    """`count` ports from `base` upward, skipping the other services' ports."""
    ports: list[int] = []
    port = base
    while len(ports) < count:
        if port not in taken:
            ports.append(port)
        port += 1
    return ports


def place_replicas(
    slurm: SlurmConfig,
    replicas: int,
    port: int,
    http_port: int | None,
    taken: set[int] = frozenset(),  # type: ignore[assignment]
) -> list[dict[str, Any]]:
    """Where each inference replica runs: node index (into the job's node list), gRPC
    port, GPU slice ("" = the node's own setting), extra arguments, log name. `taken`:
    ports of the other services, which a node's later replicas skip."""
    nodes = [slurm.trainer_nodes + k for k in range(slurm.inference_nodes)] or [0]
    per_node = -(-replicas // len(nodes))
    size = 0
    if slurm.gpus_per_node and slurm.inference_nodes and replicas > 1:
        size = slurm.gpus_per_node // per_node
        if size == 0:
            raise ConfigError(
                f"inference.replicas = {replicas} puts {per_node} replicas on a node but "
                f"slurm.gpus_per_node = {slurm.gpus_per_node}: add slurm.inference_nodes or "
                "lower inference.replicas"
            )
    ports = replica_ports(port, per_node, taken | {slurm.rdzv_port})
    placed = []
    for i in range(replicas):
        slot = i // len(nodes)
        args = ""
        if replicas > 1:
            args = f"--inference.replica-id inference-{i}"
            if http_port is not None:
                args += f" --inference.http.port {http_port + slot}"
        placed.append(
            {
                "index": i,
                "node": nodes[i % len(nodes)],
                "port": ports[slot],
                "devices": ",".join(str(d) for d in range(slot * size, (slot + 1) * size)),
                "args": args,
                "log": "inference" if replicas == 1 else f"inference-{i}",
            }
        )
    return placed


def render(
    slurm: SlurmConfig,
    *,
    run_name: str,
    run_dir: Path,
    endpoints: Any,
    security: SecurityConfig | None = None,
    replicas: int = 1,
    http_port: int | None = None,
    max_requeues: int = 5,
) -> str:
    """The sbatch script for this run (run_dir absolute: the job may start elsewhere);
    `max_requeues`: how often the job requeues itself after losing its trainer.

    Node names are known only when the job runs, so unless `security.tls_dir` brings the
    certificates, the script makes a CA and certificates for the job's nodes at its start
    (`tidal.common.security.credentials`, in `<run dir>/tls-job-<id>`) and points the services at
    them. Plaintext is refused: the job binds 0.0.0.0."""
    security = security or SecurityConfig()
    if security.mode == "plaintext":
        raise ConfigError(
            'security.mode = "plaintext" cannot be used with [slurm]: the job\'s services '
            'listen on 0.0.0.0 across nodes; use "mtls" (the default) or "token"'
        )
    import jinja2

    template = slurm.template or DEFAULT_TEMPLATE
    if not template.is_file():
        raise ConfigError(f"slurm.template {str(template)!r} is not a file")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    ports = {name: _port(getattr(endpoints, name), f"endpoints.{name}") for name in SERVICES}
    values = {
        **slurm.model_dump(exclude={"template"}),
        "nodes": slurm.nodes,
        "procs_per_node": slurm.procs_per_node,
        "world_size": slurm.world_size,
        "infer_index": slurm.trainer_nodes if slurm.inference_nodes else 0,
        "template": str(template),
        "python": slurm.python or sys.executable,
        "run_name": run_name,
        "run_dir": str(run_dir),
        "config_path": str(run_dir / "config.toml"),
        "log_dir": str(run_dir / "logs"),
        "ports": ports,
        "make_certs": security.tls_dir is None,
        "tokens": security.mode == "token",
        "max_requeues": max_requeues,
        "replicas": place_replicas(
            slurm,
            replicas,
            ports["inference"],
            http_port,
            {p for name, p in ports.items() if name != "inference"},
        ),
    }
    try:
        return env.from_string(template.read_text()).render(**values)
    except jinja2.TemplateError as exc:
        raise ConfigError(f"slurm.template {str(template)!r}: {exc}") from None


def write_job(config: Any, slurm: SlurmConfig, services_toml: str) -> Path:
    """Write `<run dir>/config.toml` (what the services read), `<run dir>/launch.toml` (the
    whole resolved config, `[slurm]` included) and `<run dir>/tidal.sbatch`; the script."""
    run_dir = config.run.dir.resolve()
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(services_toml)
    (run_dir / "launch.toml").write_text(to_toml(config))
    script = run_dir / SCRIPT_NAME
    http = config.inference.http
    script.write_text(
        render(
            slurm,
            run_name=config.run.name,
            run_dir=run_dir,
            endpoints=config.endpoints,
            security=config.security,
            replicas=config.inference.replicas,
            http_port=http.port if http.enabled and http.port else None,
            max_requeues=config.supervision.max_restarts,
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)  # read bits: the run's file policy
    return script


def submit(script: Path) -> str:
    """`sbatch` the script; returns sbatch's answer (the job id line)."""
    if shutil.which("sbatch") is None:
        raise ConfigError("[slurm] is set but `sbatch` is not on PATH; use --dry-run to write")
    done = subprocess.run(["sbatch", str(script)], capture_output=True, text=True, check=False)
    if done.returncode:
        raise ConfigError(f"sbatch {script} failed: {done.stderr.strip()}")
    return done.stdout.strip()
