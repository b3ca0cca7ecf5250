"""Fixtures shared by every test layer.

`start_weightsync` runs real weight-sync servicers (any transport, retention and chunk
size) on in-process grpc.aio servers on free loopback ports, `weightsync_server` one with
the defaults, so trainer and inference contract tests publish and watch real
versions rather than a fake. `bf16_path` runs a test once on each bf16 kernel path of
`tidal.models.cpu_features`: the fallback everywhere, the native one where the CPU has it.

Under pytest-xdist, tests/helpers/worker_groups.py decides which tests share a worker and
which need the machine to themselves.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tidal.common.config.shared import GrpcConfig
from tidal.common.grpc.server import GrpcServer, ServiceBinding
from tidal.common.security.credentials import ensure_certificates, ensure_tokens
from tidal.common.security.transport import PLAINTEXT_LOOPBACK, TransportSecurity
from tidal.models.cpu_features import FORCE_ENV, bf16_support
from tidal.weightsync.config import Transport
from tidal.weightsync.registry import VersionRegistry
from tidal.weightsync.servicer import WeightSyncServicer, add_to_server

from .helpers import worker_groups


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Module by module, with the groups of tests/helpers/worker_groups.py."""
    return worker_groups.GroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, orders the queue (the scheduler keeps the workers' order)."""
    if hasattr(config, "workerinput"):
        worker_groups.order_for_workers(items)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """On a worker, holds the machine shared (exclusively for an ALONE test) around the
    whole test; outermost, so a wait for the lock is not counted by pytest-timeout."""
    if not hasattr(item.config, "workerinput"):
        return (yield)
    run_folder = Path(item.config.option.basetemp).parent  # xdist gives each worker a subfolder
    alone = worker_groups.group_of(item.nodeid) == worker_groups.ALONE_GROUP
    with worker_groups.machine_share(run_folder).hold(alone=alone):
        return (yield)


@pytest.fixture(autouse=True)
def _keep_umask() -> Iterator[None]:
    """Entry points set the run's file policy as the process umask
    (tidal.common.files.modes); a test that runs one in-process leaves the umask as it was."""
    mask = os.umask(0o022)
    os.umask(mask)
    yield
    os.umask(mask)


@pytest.fixture(scope="session", autouse=True)
def span_exporter() -> InMemorySpanExporter:
    """A real SDK tracer provider for the whole session (it can be set only once)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return exporter


@pytest.fixture(params=["native", "fallback"])
def bf16_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each bf16 kernel path: "fallback" forced on every machine, "native" where it runs."""
    bf16_support.cache_clear()
    if request.param == "fallback":
        monkeypatch.setenv(FORCE_ENV, "fallback")
    else:
        monkeypatch.delenv(FORCE_ENV, raising=False)
        if not bf16_support().native:
            pytest.skip(f"no native bf16 on this CPU: {bf16_support().reason}")
    yield request.param
    bf16_support.cache_clear()  # the next test probes the machine as it is


@dataclass
class RunningWeightSync:
    address: str
    root: Path
    registry: VersionRegistry
    server: GrpcServer


StartWeightSync = Callable[..., Awaitable[RunningWeightSync]]


@pytest.fixture
async def start_weightsync() -> AsyncIterator[StartWeightSync]:
    """Starts real weight-sync services (stopped when the test ends): `await
    start_weightsync(root, transport=..., keep_last=..., chunk_bytes=..., security=...)`
    (plaintext on loopback unless `security` says otherwise)."""
    started: list[GrpcServer] = []

    async def start(
        root: Path,
        *,
        transport: Transport | None = None,
        keep_last: int = 3,
        chunk_bytes: int = 1 << 16,
        security: TransportSecurity = PLAINTEXT_LOOPBACK,
    ) -> RunningWeightSync:
        root.mkdir(parents=True, exist_ok=True)
        registry = VersionRegistry(root, keep_last=keep_last)
        binding = ServiceBinding(
            WeightSyncServicer(registry, chunk_bytes=chunk_bytes, transport=transport),
            add_to_server,
            "tidal.rpc.v1.WeightSyncService",
        )
        server = GrpcServer(
            "127.0.0.1:0", [binding], GrpcConfig(shutdown_grace_s=0.2), security=security
        )
        await server.start()
        started.append(server)
        return RunningWeightSync(f"127.0.0.1:{server.port}", root, registry, server)

    yield start
    for server in started:
        await server.stop()


@pytest.fixture
async def weightsync_server(tmp_path: Path, start_weightsync: StartWeightSync) -> RunningWeightSync:
    """One service with the default (filesystem) transport, versions under tmp/weights."""
    return await start_weightsync(tmp_path / "weights")


@pytest.fixture
def recording_engine() -> Any:
    """A factory of real native engines (CPU, fp32, the configured step budget and KV
    bound) that also remember the full weights each `update_weights` was handed, as
    `engine.handed[version]`: what the weight paths delivered, to compare bit for bit;
    `engine.logits(ids)` runs the served model directly."""
    import torch

    from tidal.inference.config import InferenceConfig
    from tidal.inference.native import NativeEngine

    defaults = InferenceConfig()

    class RecordingEngine(NativeEngine):
        def __init__(self) -> None:
            super().__init__(
                device=torch.device("cpu"),
                dtype=torch.float32,
                max_batch_size=4,
                max_queue=4,
                max_step_tokens=defaults.max_step_tokens,
                kv_cache_mb=defaults.kv_cache_mb,
            )
            self.handed: dict[int, dict[str, torch.Tensor]] = {}

        async def update_weights(
            self, version: int, hf_config: dict[str, Any], state_dict: dict[str, torch.Tensor]
        ) -> None:
            self.handed[version] = {k: v.clone() for k, v in state_dict.items()}
            await super().update_weights(version, hf_config, state_dict)

        def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
            """(B, T, V) logits of the served weights, straight from the model (no cache)."""
            model = self.served_model
            assert model is not None
            positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)  # (B, T)
            with torch.no_grad():
                return model(input_ids, positions)

    return RecordingEngine


@pytest.fixture(scope="session")
def tls_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, every role's certificate and token, made once per session by the code
    `tidal rl` uses (helpers to dial with them: tests/tls_fixtures.py)."""
    folder = tmp_path_factory.mktemp("tls")
    ensure_certificates(folder)
    ensure_tokens(folder)
    return folder
