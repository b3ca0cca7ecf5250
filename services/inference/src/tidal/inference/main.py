"""Run the inference service: `tidal inference @ cfg.toml` or `python -m tidal.inference`.

`start_inference` builds and starts the engine, the gRPC server, the weight watcher and,
with `[inference.http] enabled`, the OpenAI-compatible endpoint on the same loop, and
returns the running parts, so contract tests run exactly what `serve` runs. Health is
NOT_SERVING until the first weights load; with `inference.model_path` the replica serves
that fixed folder (and its tokenizer) and never follows weight-sync (a judge). The
tokenizer is loaded before the server starts, so a missing or misfitting one is a config
error at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tidal.common.errors import ConfigError
from tidal.common.grpc.server import GrpcServer, ServiceBinding
from tidal.common.observability.prometheus import ServiceMetrics
from tidal.common.observability.tracing import setup_telemetry
from tidal.common.process.service_start import settle_startup_heap, start_service
from tidal.common.security.credentials import cert_path, key_path
from tidal.common.security.transport import for_service
from tidal.inference.config import InferenceRunConfig
from tidal.models.cpu_features import bf16_cost_warning
from tidal.weights.client import WeightSyncClient

if TYPE_CHECKING:
    from tidal.inference.engine import Engine
    from tidal.inference.openai.server import OpenAIServer
    from tidal.inference.reload import WeightWatcher
    from tidal.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)
_BACKGROUND: set[asyncio.Task[None]] = set()  # health updates scheduled from callbacks
FULL_NAME = "tidal.rpc.v1.InferenceService"


@dataclass
class RunningInference:
    server: GrpcServer
    engine: Engine
    watcher: WeightWatcher | None
    """None when the replica serves a fixed folder (`inference.model_path`)."""
    client: WeightSyncClient | None
    watch_task: asyncio.Task[None] | None
    replica_id: str
    http: OpenAIServer | None = None
    """The OpenAI-compatible endpoint, when `[inference.http]` enables it."""

    @property
    def port(self) -> int:
        return self.server.port

    async def close(self) -> None:
        """Stop HTTP and watching, stop the engine, close the weight-sync channel."""
        if self.http is not None:
            await self.http.close()
        if self.watch_task is not None:
            self.watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.watch_task
        await self.engine.close()
        if self.client is not None:
            await self.client.close()


async def start_inference(config: InferenceRunConfig) -> RunningInference:
    # torch is imported here, after the config parsed: `--help` and `--dry-run` stay instant.
    from tidal.inference.prometheus import InferenceMetrics
    from tidal.inference.reload import WeightWatcher
    from tidal.inference.servicer import InferenceServicer
    from tidal.rpc.v1 import inference_pb2_grpc as pb_grpc
    from tidal.text.loader import load_tokenizer

    cfg = config.inference
    # hostname too: replicas in containers often share a pid (compose scales one image)
    replica_id = cfg.replica_id or f"inference-{socket.gethostname()}-{os.getpid()}"
    fixed = cfg.model_path
    tokenizer = (
        load_tokenizer(config.run.tokenizer, model_path=config.model_folder())
        if fixed is None
        else load_tokenizer("model" if has_tokenizer(fixed) else "byte", model_path=fixed)
    )
    log.info(
        "tokenizer %s: %d ids, eos %s", tokenizer.name, tokenizer.vocab_size, tokenizer.eos_ids
    )
    engine = build_engine(config, tokenizer)
    await engine.start()
    servicer = InferenceServicer(engine, tokenizer, replica_id=replica_id, limits=cfg.limits)
    binding = ServiceBinding(servicer, pb_grpc.add_InferenceServiceServicer_to_server, FULL_NAME)
    security = for_service(config, "inference")
    metrics = ServiceMetrics("inference", config.metrics)
    server = GrpcServer(
        config.grpc.listen_address(config.endpoints.inference),
        [binding],
        config.grpc,
        security=security,
        metrics=metrics,
    )
    server.add_shutdown_hook(servicer.end_streams)
    await server.start(serving=False)
    if fixed is not None:
        await serve_folder(engine, fixed)
        await server.set_serving(True)
        running = RunningInference(server, engine, None, None, None, replica_id)
    else:

        async def on_loaded(version: int) -> None:
            await server.set_serving(True)

        client = WeightSyncClient(config.endpoints.weightsync, config.grpc, security=security)
        prom = InferenceMetrics.on(metrics, engine)
        watcher = WeightWatcher(client, engine, replica_id, on_loaded=on_loaded, metrics=prom)
        task = asyncio.create_task(watcher.run(), name="weight-watcher")
        task.add_done_callback(lambda done: not_serving_if_ended(done, server))
        running = RunningInference(server, engine, watcher, client, task, replica_id)
    if cfg.http.enabled:
        running.http = await start_openai_http(config, engine, tokenizer, metrics)
    return running


def has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file()


async def serve_folder(engine: Engine, folder: Path) -> None:
    """Load a Hugging Face folder's weights as version 0 (ConfigError when unreadable)."""
    from tidal.models.hf_config import read_config
    from tidal.models.hf_folder import read_weights

    try:
        hf_config = read_config(folder)
        state_dict = await asyncio.to_thread(read_weights, folder)
        await engine.update_weights(0, hf_config, state_dict)
    except (OSError, ValueError) as exc:  # ModelFolderError, WeightMismatch among them
        raise ConfigError(f"inference.model_path {folder}: {exc}") from exc
    log.info("serving the fixed model %s as version 0 (weight-sync is not followed)", folder)


def not_serving_if_ended(task: asyncio.Task[None], server: GrpcServer) -> None:
    """The weight watcher only ends when cancelled (shutdown); if it ever ends otherwise,
    this replica stops following versions, so it must stop reporting SERVING."""
    if task.cancelled():
        return
    log.error(
        "the weight watcher ended (%s); this replica follows no more versions: NOT_SERVING",
        task.exception() or "returned",
    )
    health = asyncio.get_running_loop().create_task(server.set_serving(False))
    _BACKGROUND.add(health)
    health.add_done_callback(_BACKGROUND.discard)


async def start_openai_http(
    config: InferenceRunConfig, engine: Engine, tokenizer: Tokenizer, metrics: ServiceMetrics
) -> OpenAIServer:
    """The OpenAI-compatible endpoint on this process's loop (see `openai.server`)."""
    from tidal.inference.openai.server import OpenAIEndpoint, OpenAIServer

    http = config.inference.http
    digest, tls = openai_http_credentials(config)
    endpoint = OpenAIEndpoint(
        engine,
        tokenizer,
        model_name=http.served_model_name,
        limits=config.inference.limits,
        key_digest=digest,
        max_body_bytes=http.max_body_bytes,
        max_body_values=http.max_body_values,
        tool_parser=http.tool_parser,
        reasoning=http.reasoning_parser,
    )
    errors = metrics.counter(
        "tidal_inference_http_errors",
        "HTTP requests the OpenAI endpoint's server refused or failed before or outside a "
        "handler (malformed framing, a client gone mid-reply), by exception class",
        ["kind"],
    )
    server = OpenAIServer(
        endpoint, http, tls=tls, count_error=lambda kind: errors.labels(kind=kind).inc()
    )
    await server.start()
    log.info(
        "OpenAI-compatible endpoint at %s (model %r, %s)",
        server.url,
        http.served_model_name,
        "API key required" if digest else "no API key",
    )
    return server


def openai_http_credentials(config: InferenceRunConfig) -> tuple[str | None, ssl.SSLContext | None]:
    """The endpoint's API key digest and TLS context, as `[inference.http]` asks (ConfigError)."""
    from tidal.inference.openai.server import api_key_digest, server_tls

    http, security = config.inference.http, config.security
    digest = None if http.api_key_file is None else api_key_digest(http.api_key_file)
    if not http.tls:
        return digest, None
    folder = security.folder(config.run.dir)
    cert = security.cert or cert_path(folder, "inference")
    return digest, server_tls(cert, security.key or key_path(folder, "inference"))


def build_engine(config: InferenceRunConfig, tokenizer: Tokenizer) -> Engine:
    """The configured backend; vLLM is imported only when chosen."""
    cfg = config.inference
    if cfg.engine == "vllm":
        from tidal.inference.vllm_engine import VllmEngine

        return VllmEngine(
            dtype=cfg.dtype,
            max_batch_size=cfg.max_batch_size,
            max_queue=cfg.max_queue,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            tokenizer=tokenizer,
            max_model_len=cfg.max_model_len,
            prefix_caching=cfg.prefix_caching,
        )
    from tidal.inference.native import NativeEngine
    from tidal.models.device import DTYPES, native_bf16, resolve_device

    device = resolve_device(cfg.device, service="inference")
    dtype = cfg.dtype
    if dtype == "auto":
        native, reason = native_bf16(device)
        dtype = "bfloat16" if native else "float32"
        log.info("inference.dtype auto: %s on %s (%s)", dtype, device, reason)
    bf16_on_cpu = dtype == "bfloat16" and device.type == "cpu"
    if bf16_on_cpu and (warning := bf16_cost_warning('inference.dtype = "bfloat16"')):
        log.warning("%s (the linears compute in fp32 from upcast copies)", warning)
    return NativeEngine(
        device=device,
        dtype=DTYPES[dtype],
        max_batch_size=cfg.max_batch_size,
        max_queue=cfg.max_queue,
        max_step_tokens=cfg.max_step_tokens,
        kv_cache_mb=cfg.kv_cache_mb,
        kv_cache_memory_fraction=cfg.kv_cache_memory_fraction,
        max_model_len=cfg.max_model_len,
        tokenizer=tokenizer,
        seed=config.run.seed,
        packed_weights=cfg.packed_weights,
        block_size=cfg.block_size,
        prefix_caching=cfg.prefix_caching,
        compile_attention=cfg.compile_attention,
    )


async def serve(config: InferenceRunConfig) -> None:
    import torch

    provider = setup_telemetry("inference", config.telemetry, config.run.dir)
    torch.set_num_threads(config.inference.num_threads)
    running = await start_inference(config)
    settle_startup_heap()  # torch, the engine and the model are in
    log.info(
        "serving on %s as %s; %s",
        config.endpoints.inference,
        running.replica_id,
        f"waiting for weights from {config.endpoints.weightsync}"
        if running.watcher is not None
        else "fixed weights",
    )
    await running.server.serve_forever(on_stop=running.close)
    provider.shutdown()


def main(argv: Sequence[str] | None = None) -> None:
    config = start_service(InferenceRunConfig, "inference", argv)
    fixed = config.inference.model_path
    if fixed is not None and not (fixed / "config.json").is_file():
        print(f"error: inference.model_path {fixed} has no config.json", file=sys.stderr)
        raise SystemExit(2)
    if config.inference.http.enabled:
        try:
            openai_http_credentials(config)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
    asyncio.run(serve(config))
