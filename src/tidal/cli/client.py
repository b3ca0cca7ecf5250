"""`tidal client status | generate | versions | progress @ cfg`: the gRPC client for people.

Addresses come from the run config, so a run's resolved config.toml reaches that run. Each
command connects first with a short timeout, so a service that is down is reported at
once. `generate` renders the prompt as the run's orchestrator would: it shows what a
rollout would get.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console
from rich.table import Table

from tidal.common.config.loading import load_or_exit
from tidal.common.config.shared import SERVICES, ServiceRunConfig
from tidal.common.errors import ConfigError, Unreachable
from tidal.common.grpc.channel import CONNECT_TIMEOUT_S, connect, wait_connected
from tidal.common.security.transport import for_service
from tidal.orchestrator.config import ChatConfig
from tidal.orchestrator.rollouts.prompt_rendering import PromptRenderer
from tidal.orchestrator.tasks.base import Problem
from tidal.rpc.v1 import (
    common_pb2,
    inference_pb2,
    inference_pb2_grpc,
    orchestrator_pb2_grpc,
    trainer_pb2_grpc,
)
from tidal.text.loader import load_tokenizer
from tidal.weights.client import WeightSyncClient

console = Console()
STATUS_TIMEOUT_S = 5.0


async def _health(channel: grpc.aio.Channel) -> str:
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        reply = await stub.Check(
            health_pb2.HealthCheckRequest(), timeout=STATUS_TIMEOUT_S, wait_for_ready=False
        )
    except grpc.aio.AioRpcError as exc:
        return f"no health ({exc.code().name})"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


async def _details(name: str, channel: grpc.aio.Channel) -> str:
    try:
        if name == "inference":
            s = await inference_pb2_grpc.InferenceServiceStub(channel).GetStatus(
                common_pb2.StatusRequest(), timeout=STATUS_TIMEOUT_S, wait_for_ready=False
            )
            return (
                f"version {s.policy_version}, running {s.running}, queued {s.queued}, "
                f"{s.tokens_per_s:.0f} tok/s, replica {s.replica_id}, kernels {s.kernels}"
            )
        if name == "trainer":
            t = await trainer_pb2_grpc.TrainerServiceStub(channel).GetStatus(
                common_pb2.StatusRequest(), timeout=STATUS_TIMEOUT_S, wait_for_ready=False
            )
            return f"step {t.step}, version {t.policy_version}, {t.num_parameters:,} params"
        if name == "orchestrator":
            p = await orchestrator_pb2_grpc.OrchestratorServiceStub(channel).GetProgress(
                common_pb2.StatusRequest(), timeout=STATUS_TIMEOUT_S, wait_for_ready=False
            )
            return f"{p.state}: step {p.step}/{p.total_steps}, version {p.policy_version}"
    except grpc.aio.AioRpcError as exc:
        return f"({exc.code().name}: {exc.details()})"
    return ""


async def _weightsync_details(address: str, config: ServiceRunConfig) -> str:
    client = WeightSyncClient(address, config.grpc, security=for_service(config, "operator"))
    try:
        versions = await client.list_versions(timeout=STATUS_TIMEOUT_S)
        return f"versions {[v.manifest.version for v in versions]}"
    except grpc.aio.AioRpcError as exc:
        return f"({exc.code().name}: {exc.details()})"
    finally:
        await client.close()


async def _connect(
    name: str, address: str, config: ServiceRunConfig, connect_s: float
) -> grpc.aio.Channel:
    """A channel to `name` at `address`, as the operator; raises Unreachable when nothing
    answers within `connect_s`."""
    return await connect(
        name, address, config.grpc, security=for_service(config, "operator"), timeout_s=connect_s
    )


async def _check(
    name: str, address: str, config: ServiceRunConfig, connect_s: float
) -> tuple[str, str]:
    """(health, details) of one service; raises Unreachable when nothing answers."""
    async with await _connect(name, address, config, connect_s) as channel:
        health = await _health(channel)
        if health != "SERVING":
            return health, ""
        if name == "weightsync":
            return health, await _weightsync_details(address, config)
        return health, await _details(name, channel)


def status_rows(config: ServiceRunConfig) -> list[tuple[str, str, str]]:
    """(row label, service, address) of every service: one row per inference replica
    (`endpoints.inference_replicas`), labelled inference-<i> when there are several."""
    rows = []
    for name in SERVICES:
        if name != "inference":
            rows.append((name, name, getattr(config.endpoints, name)))
            continue
        addresses = config.endpoints.inference_addresses()
        for i, address in enumerate(addresses):
            rows.append((name if len(addresses) == 1 else f"{name}-{i}", name, address))
    return rows


async def status(config: ServiceRunConfig, opts: argparse.Namespace) -> int:
    rows = status_rows(config)
    results = await asyncio.gather(
        *(_check(name, address, config, opts.connect_timeout) for _, name, address in rows),
        return_exceptions=True,
    )
    table = Table(title="Tidal services")
    for column in ("service", "address", "health", "details"):
        table.add_column(column)
    errors: list[Unreachable] = []
    healthy = True
    for (label, _, address), result in zip(rows, results, strict=True):
        if isinstance(result, Unreachable):
            errors.append(result)
            result = ("unreachable", "")
        elif isinstance(result, BaseException):
            raise result
        healthy &= result[0] == "SERVING"
        table.add_row(label, address, *result)
    console.print(table)
    for exc in errors:
        print(f"error: {exc}", file=sys.stderr)
    return 0 if healthy else 1


def run_prompts(config: ServiceRunConfig) -> PromptRenderer:
    """The run's tokenizer and chat rendering, as its orchestrator resolves them."""
    tokenizer = load_tokenizer(config.run.tokenizer, model_path=config.model_folder())
    chat = ChatConfig.model_validate(config.orchestrator.get("chat", {}))
    return PromptRenderer.from_config(tokenizer, chat)


async def generate(config: ServiceRunConfig, opts: argparse.Namespace) -> int:
    prompts = run_prompts(config)
    sampling = inference_pb2.SamplingParams(
        temperature=opts.temperature,
        max_tokens=opts.max_tokens,
        n=opts.n,
        top_p=1.0,
        stop_token_ids=prompts.stop_ids,
    )
    if opts.seed is not None:
        sampling.seed = opts.seed
    if prompts.template:
        ids = prompts.prompt_ids(Problem(prompt=opts.prompt, reference=""))
        request = inference_pb2.GenerateRequest(prompt_ids=ids, sampling=sampling)
    else:  # plain text: inference tokenizes it as the orchestrator would (and rejects "")
        request = inference_pb2.GenerateRequest(prompt=opts.prompt, sampling=sampling)
    address = config.endpoints.inference
    async with await _connect("inference", address, config, opts.connect_timeout) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        try:
            async for reply in stub.Generate(request, timeout=opts.timeout):
                reason = inference_pb2.FinishReason.Name(reply.finish_reason)
                versions = sorted(set(reply.policy_versions))
                console.print(
                    f"[{reply.index}] {reply.text!r}  ({len(reply.token_ids)} tokens, "
                    f"{reason.removeprefix('FINISH_REASON_').lower()}, versions {versions})"
                )
        except grpc.aio.AioRpcError as exc:
            console.print(f"[red]{exc.code().name}[/red]: {exc.details()}")
            return 1
    return 0


async def versions(config: ServiceRunConfig, opts: argparse.Namespace) -> int:
    address = config.endpoints.weightsync
    client = WeightSyncClient(address, config.grpc, security=for_service(config, "operator"))
    try:
        await wait_connected(
            client.channel, service="weightsync", address=address, timeout_s=opts.connect_timeout
        )
        events = await client.list_versions(timeout=STATUS_TIMEOUT_S)
    finally:
        await client.close()
    table = Table(title="Published weight versions")
    for column in ("version", "step", "MB", "loaded by", "location"):
        table.add_column(column)
    for e in events:
        m = e.manifest
        table.add_row(
            str(m.version),
            str(m.step),
            f"{m.total_bytes / 1e6:.2f}",
            ", ".join(e.loaded_by),
            m.location,
        )
    console.print(table)
    return 0


async def progress(config: ServiceRunConfig, opts: argparse.Namespace) -> int:
    address = config.endpoints.orchestrator
    async with await _connect("orchestrator", address, config, opts.connect_timeout) as channel:
        stub = orchestrator_pb2_grpc.OrchestratorServiceStub(channel)
        p = await stub.GetProgress(common_pb2.StatusRequest(), timeout=STATUS_TIMEOUT_S)
    console.print(f"{p.state}: step {p.step}/{p.total_steps}, policy version {p.policy_version}")
    table = Table()
    for column in ("step", "phase", "reward", "version", "seconds"):
        table.add_column(column)
    for s in p.recent:
        table.add_row(
            str(s.step), s.phase, f"{s.reward_mean:.3f}", str(s.policy_version), f"{s.seconds:.2f}"
        )
    console.print(table)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidal client",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # A parent parser, so the option is accepted after the command like every other.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--connect-timeout",
        type=float,
        default=CONNECT_TIMEOUT_S,
        help="seconds to wait for a service to answer before reporting it unreachable",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="health and state of every service", parents=[common])
    gen = sub.add_parser("generate", help="generate completions of a text prompt", parents=[common])
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--n", type=int, default=1)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--timeout", type=float, default=60.0)
    sub.add_parser("versions", help="published weight versions", parents=[common])
    sub.add_parser("progress", help="the orchestrator's progress", parents=[common])
    return parser


def main(argv: Sequence[str]) -> None:
    # The client's own options may come before or after `@ cfg`; whatever argparse does not
    # know (config files, `--endpoints.x host:port` overrides) is the run config's.
    opts, config_args = _parser().parse_known_args(list(argv))
    config = load_or_exit(ServiceRunConfig, config_args, usage="tidal client <command> @ cfg")
    command = {"status": status, "generate": generate, "versions": versions, "progress": progress}
    try:
        code = asyncio.run(command[opts.command](config, opts))
    except Unreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 1
    except ConfigError as exc:  # the run's tokenizer or `orchestrator.chat`
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)
