"""Config sections every service reads: the run, endpoints, gRPC limits, telemetry, metrics.

Each command composes them with its own sections (`ServiceRunConfig`), `tidal rl` with
every service's (`tidal.cli.config.RunConfig`). One run file drives every command: a
section another command reads is carried through unchecked, for that command to
validate, while any other unknown top-level key, and every unknown key inside a section
the command reads, is still an error.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from tidal.common.config.loading import BaseConfig
from tidal.common.config.schema import FIRST
from tidal.common.observability.prometheus import MetricsConfig
from tidal.common.security.config import SecurityConfig, check_plaintext_addresses

SERVICES = ("orchestrator", "inference", "trainer", "weightsync")
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A run name is one plain folder name: it starts with a letter or digit (no hidden
`.x`, no `..`), holds letters, digits, `.`, `_`, `-` (no `/`, `\\`, spaces), 1-128 long,
so `<output_dir>/<name>` is always a child of `output_dir` (the launcher deletes it)."""


class RunSection(BaseConfig):
    name: Annotated[str, FIRST] = "default"
    """Run name; outputs go to `<output_dir>/<name>/`. A plain folder name: letters,
    digits, `.`, `_`, `-`, starting with a letter or digit, at most 128 characters."""
    output_dir: Path = Path("outputs")
    """Parent folder of run output folders."""
    seed: int = 0
    """Seed for every random choice in the run (data order, init, sampling)."""
    tokenizer: str = Field(default="auto", min_length=1)
    """Tokenizer shared by all services: "auto" (the tokenizer of `trainer.model.path`'s
    folder when it is set, else "byte"), "byte" (bytes plus BOS/EOS/PAD; needs no files),
    "model" (the model folder's, required), or the path of a Hugging Face model folder
    holding tokenizer.json (docs/tokenizers.md)."""
    shared_readable: bool = False
    """Whether other local users may read what the run writes. Off: every process of the
    run sets umask 077, so folders it creates are 0700 and files 0600 (weights,
    checkpoints with optimizer state, prompts, traces and logs are the run's user's
    only). On: umask 022 (0755 / 0644), e.g. for a team's shared output folder or a
    Prometheus running as another user that reads `prometheus_targets.json`. Keys and
    tokens stay 0600 in a 0700 folder either way (docs/operations.md, "File modes")."""

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not RUN_NAME.fullmatch(name) or ".." in name:
            raise ValueError(
                f"run.name {name!r} is not a plain folder name: use 1-128 letters, digits, "
                "'.', '_' or '-', starting with a letter or digit, no '..' and no path "
                "separators (to put runs elsewhere, set run.output_dir)"
            )
        return name

    @property
    def dir(self) -> Path:
        return self.output_dir / self.name


class Endpoints(BaseConfig):
    """host:port of each service. `tidal rl` replaces these with free loopback ports."""

    orchestrator: str = "127.0.0.1:50051"
    """Orchestrator gRPC address."""
    inference: str = "127.0.0.1:50052"
    """Inference gRPC address: the address this inference replica serves on (with several
    replicas, each is started with its own), and the only replica when
    `inference_replicas` is empty."""
    inference_replicas: list[str] = []
    """Every inference replica's gRPC address (host:port), in replica order. The
    orchestrator spreads Generate over them (least outstanding work) and rides out the
    loss of any; empty means the single replica at `inference`. `tidal rl` fills it in
    from `inference.replicas`."""
    trainer: str = "127.0.0.1:50053"
    """Trainer gRPC address."""
    weightsync: str = "127.0.0.1:50054"
    """Weight-sync gRPC address."""

    @field_validator("inference", mode="before")
    @classmethod
    def _one_address(cls, value: Any) -> Any:
        if isinstance(value, list):
            raise ValueError(
                "endpoints.inference is one address (host:port); list several inference "
                "replicas in endpoints.inference_replicas instead"
            )
        return value

    @field_validator("inference_replicas")
    @classmethod
    def _distinct_replicas(cls, addresses: list[str]) -> list[str]:
        for address in addresses:
            if ":" not in address or not address.rsplit(":", 1)[1].isdigit():
                raise ValueError(
                    f"endpoints.inference_replicas: {address!r} is not host:port (list every "
                    'replica, e.g. ["10.0.0.5:50052", "10.0.0.6:50052"])'
                )
        if len(set(addresses)) != len(addresses):
            raise ValueError(
                f"endpoints.inference_replicas lists an address twice: {addresses}; list each "
                "replica once"
            )
        return addresses

    def inference_addresses(self) -> list[str]:
        """Every inference replica the orchestrator uses (`inference_replicas`, else the
        one `inference`)."""
        return list(self.inference_replicas) or [self.inference]


class GrpcConfig(BaseConfig):
    max_message_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    """Largest message any server or channel sends, and the largest answer a channel
    receives. What a server receives is `max_request_bytes`."""
    # --- request limits (docs/operations.md#limits) ---
    max_request_bytes: int = Field(default=4 * 1024 * 1024, ge=1024 * 1024)
    """Largest message every server receives, on every method (health checks included):
    gRPC refuses a larger one RESOURCE_EXHAUSTED from its length prefix, before buffering
    it, so a caller that may not call a method at all (health is open) cannot make a server
    hold more. Bulk data crosses as chunk streams (TrainStream, UploadWeights) whose chunks
    hold at most this less 64 KiB."""
    max_concurrent_rpcs: int = Field(default=2048, gt=0)
    """Most RPCs a server handles at once (health checks and reflection not counted); one
    more is refused RESOURCE_EXHAUSTED. Keep it above `inference.max_batch_size` +
    `inference.max_queue`, so inference's own queue limit answers first."""
    # --- end request limits ---
    shutdown_grace_s: float = Field(default=5.0, ge=0)
    """Seconds in-flight RPCs get to finish after SIGTERM."""
    keepalive_s: float = Field(default=30.0, gt=0)
    """Client keepalive ping interval."""
    bind_host: str | None = None
    """Host servers listen on; default: the host of their own endpoint. "0.0.0.0" in containers."""

    def listen_address(self, endpoint: str) -> str:
        """The address a server with public `endpoint` (host:port) should bind."""
        if self.bind_host is None:
            return endpoint
        return f"{self.bind_host}:{endpoint.rsplit(':', 1)[1]}"


class TelemetryConfig(BaseConfig):
    traces_file: bool = True
    """Write spans to `<run dir>/traces.jsonl` (readable with no collector)."""
    console: bool = False
    """Also print spans to stderr."""
    otlp_endpoint: str | None = None
    """OTLP/gRPC collector address (e.g. "localhost:4317"); unset means no OTLP export."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level of every service."""


class SharedConfig(BaseConfig):
    run: RunSection = RunSection()
    endpoints: Endpoints = Endpoints()
    grpc: GrpcConfig = GrpcConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    metrics: MetricsConfig = MetricsConfig()
    """Each service's Prometheus endpoint (tidal.common.observability.prometheus)."""
    # --- transport security (tidal.common.security.config) ---
    security: SecurityConfig = SecurityConfig()

    @field_validator("security")
    @classmethod
    def _plaintext_only_on_loopback(
        cls, security: SecurityConfig, info: ValidationInfo
    ) -> SecurityConfig:
        endpoints, grpc = info.data.get("endpoints"), info.data.get("grpc")
        if security.mode == "plaintext" and endpoints is not None and grpc is not None:
            addresses = {
                f"endpoints.{k}": v
                for k, v in endpoints.model_dump().items()
                if k != "inference_replicas"
            }
            for i, address in enumerate(endpoints.inference_replicas):
                addresses[f"endpoints.inference_replicas[{i}]"] = address
            if grpc.bind_host is not None:
                addresses["grpc.bind_host"] = grpc.bind_host
            check_plaintext_addresses(addresses)
        return security

    # --- end transport security ---


class ServiceRunConfig(SharedConfig):
    """A run config as one command sees it: other commands' sections pass through."""

    orchestrator: dict[str, Any] = Field(default_factory=dict)
    """The orchestrator's section, carried through unchecked (`tidal orchestrator --help`)."""
    inference: dict[str, Any] = Field(default_factory=dict)
    """The inference section, carried through unchecked (`tidal inference --help`)."""
    trainer: dict[str, Any] = Field(default_factory=dict)
    """The trainer's section, carried through unchecked (`tidal trainer --help`)."""
    weightsync: dict[str, Any] = Field(default_factory=dict)
    """The weight-sync section, carried through unchecked (`tidal weightsync --help`)."""
    # Sections no service reads: unset unless given, so a resolved file leaves them out.
    sft: dict[str, Any] | None = None
    """`tidal sft`'s section, carried through unchecked (`tidal sft --help`)."""
    export: dict[str, Any] | None = None
    """`tidal export`'s section, carried through unchecked (`tidal export --help`)."""
    deployment: dict[str, Any] | None = None
    """A `tidal rl` launcher section, carried through unchecked (`tidal rl --help`)."""
    slurm: dict[str, Any] | None = None
    """A `tidal rl` launcher section, carried through unchecked (`tidal rl --help`)."""
    supervision: dict[str, Any] | None = None
    """A `tidal rl` launcher section, carried through unchecked (`tidal rl --help`)."""

    def model_folder(self) -> Path | None:
        """`trainer.model.path`: the Hugging Face folder the run starts from, if any.

        Every service reads it (the tokenizer defaults to the folder's), so it is looked up
        in the trainer's section whether this service validated it or carries it through.
        """
        return trainer_model_folder(self.trainer)


def trainer_model_folder(trainer: Any) -> Path | None:
    """`model.path` of a trainer section: a validated config object or a carried dict."""
    if isinstance(trainer, dict):
        model = trainer.get("model")
        path = model.get("path") if isinstance(model, dict) else None
    else:
        path = trainer.model.path
    return None if path is None else Path(path)
