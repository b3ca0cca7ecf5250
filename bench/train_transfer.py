"""Delivering a step to the trainer: the orchestrator's `TrainerClient` to a real trainer.

A real trainer (tiny model, CPU, plaintext loopback, in this process) receives steps of
`--tokens` tokens (packed micro-batches of 32-token samples, ~28 bytes a token on the
wire) through `TrainerClient.send`, the orchestrator's own call. Each step carries a
wrong `payload_sha256`, so the trainer receives, decodes and validates every micro-batch,
computes the fingerprint and refuses the step INVALID_ARGUMENT before training: the time
is the delivery (serialization, transfer, parsing, validation), not the optimizer. Sizes
are interleaved round by round; each cell is a median.

    .venv/bin/python bench/train_transfer.py [--tokens 65536,1048576] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from common import print_table, write_result

from tidal.batch.tensor_codec import encode_array
from tidal.common.config.shared import GrpcConfig
from tidal.common.grpc.server import GrpcServer, ServiceBinding
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.orchestrator.peers.peer_client import PeerError
from tidal.orchestrator.peers.trainer_client import TrainerClient
from tidal.rpc.v1 import trainer_pb2 as pb
from tidal.trainer.config import TrainerRunConfig
from tidal.trainer.main import start_trainer
from tidal.weightsync.registry import VersionRegistry
from tidal.weightsync.servicer import WeightSyncServicer, add_to_server

TINY_MODEL = {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "ffn_dim": 64}
SAMPLE = 32
MICRO_BATCH_TOKENS = 8192


def micro_batch(tokens: int, rng: np.random.Generator) -> pb.MicroBatch:
    """`tokens // SAMPLE` samples of SAMPLE tokens, packed."""
    count = tokens // SAMPLE
    positions = np.tile(np.arange(SAMPLE), count)  # (T,)
    mask = (positions >= 2).astype(np.float32)
    arrays = {
        "input_ids": rng.integers(0, 259, count * SAMPLE).astype(np.int32),
        "position_ids": positions.astype(np.int32),
        "sample_lengths": np.full(count, SAMPLE, dtype=np.int32),
        "loss_mask": mask,
        "advantages": (rng.standard_normal(count * SAMPLE) * mask).astype(np.float32),
        "behaviour_logprobs": (-5.6 * mask).astype(np.float32),
        "policy_versions": np.where(mask > 0, 0, -1).astype(np.int32),
    }
    return pb.MicroBatch(**{name: encode_array(a) for name, a in arrays.items()})


def step(tokens: int) -> pb.TrainRequest:
    rng = np.random.default_rng(0)
    batches = [micro_batch(MICRO_BATCH_TOKENS, rng) for _ in range(tokens // MICRO_BATCH_TOKENS)]
    return pb.TrainRequest(
        step=1,
        micro_batches=batches,
        loss=pb.LOSS_KIND_POLICY_GRADIENT,
        payload_sha256=b"\0" * 32,  # wrong on purpose: refused after the payload is checked
    )


async def bench(sizes: list[int], rounds: int, run_dir: Path) -> list[dict[str, object]]:
    weights = run_dir / "weights"
    weights.mkdir(parents=True)
    weightsync = GrpcServer(
        "127.0.0.1:0",
        [
            ServiceBinding(
                WeightSyncServicer(VersionRegistry(weights, keep_last=2), chunk_bytes=1 << 20),
                add_to_server,
                "tidal.rpc.v1.WeightSyncService",
            )
        ],
        GrpcConfig(shutdown_grace_s=0.2),
        security=PLAINTEXT_LOOPBACK,
    )
    await weightsync.start()
    trainer = await start_trainer(
        TrainerRunConfig.model_validate(
            {
                "run": {"output_dir": str(run_dir), "name": "transfer"},
                "endpoints": {
                    "trainer": "127.0.0.1:0",
                    "weightsync": f"127.0.0.1:{weightsync.port}",
                },
                "security": {"mode": "plaintext"},
                "trainer": {
                    "model": {**TINY_MODEL, "max_seq_len": SAMPLE},
                    "device": "cpu",
                    "publish_dir": str(weights),
                    "max_tokens_per_step": max(sizes),
                },
            }
        )
    )
    client = TrainerClient(f"127.0.0.1:{trainer.server.port}", security=PLAINTEXT_LOOPBACK)
    requests = {n: step(n) for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    try:
        for _ in range(rounds + 1):  # the first round warms up
            for n, request in requests.items():
                started = time.perf_counter()
                try:
                    await client.send(request, timeout=120)
                except PeerError as err:
                    assert "payload_sha256" in str(err), err
                else:
                    raise AssertionError("a step with a wrong payload_sha256 was trained")
                times[n].append(time.perf_counter() - started)
    finally:
        await client.close()
        await trainer.stop()
        await weightsync.stop()
    return [
        {
            "tokens": n,
            "payload_mib": round(requests[n].ByteSize() / 2**20, 1),
            "median_ms": round(1000 * statistics.median(times[n][1:]), 1),
            "min_ms": round(1000 * min(times[n][1:]), 1),
        }
        for n in sizes
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="65536,1048576")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    sizes = [int(t) for t in args.tokens.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(bench(sizes, args.rounds, Path(tmp)))
    print_table("Train delivery (received, decoded, validated, refused before training)", rows)
    write_result(
        "train_transfer",
        config={"tokens": sizes, "rounds": args.rounds},
        results=rows,
        summary={f"median_ms_{r['tokens']}": r["median_ms"] for r in rows},
    )


if __name__ == "__main__":
    main()
