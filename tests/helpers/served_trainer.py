"""A real trainer, the weight-sync service it publishes to, an inference replica loading
its weights and an orchestrator's server, in a process of their own, so a test can
measure what a caller costs a server (its RSS) apart from the client.

`python served_trainer.py MODE TLS_DIR RUN_DIR` serves them in security mode MODE with
the certificates and tokens of TLS_DIR, prints the ports of the trainer, weight-sync,
inference and orchestrator servers, and serves until its stdin closes.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

from tidal.common.config.shared import GrpcConfig
from tidal.common.grpc.server import GrpcServer, ServiceBinding
from tidal.common.security.config import SecurityConfig
from tidal.common.security.transport import TransportSecurity
from tidal.inference.config import InferenceRunConfig
from tidal.inference.main import start_inference
from tidal.orchestrator.records.run_status import ProgressState
from tidal.orchestrator.servicer import OrchestratorServicer
from tidal.rpc.v1 import orchestrator_pb2_grpc
from tidal.trainer.config import TrainerRunConfig
from tidal.trainer.main import start_trainer
from tidal.weightsync.registry import VersionRegistry
from tidal.weightsync.servicer import WeightSyncServicer, add_to_server

TINY_MODEL = {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "ffn_dim": 64}


async def serve(mode: str, tls_dir: Path, run_dir: Path) -> None:
    security = SecurityConfig.model_validate({"mode": mode, "tls_dir": str(tls_dir)})
    root = run_dir / "weights"
    root.mkdir(parents=True, exist_ok=True)
    binding = ServiceBinding(
        WeightSyncServicer(VersionRegistry(root, keep_last=2), chunk_bytes=1 << 16),
        add_to_server,
        "tidal.rpc.v1.WeightSyncService",
    )
    weightsync = GrpcServer(
        "127.0.0.1:0",
        [binding],
        GrpcConfig(shutdown_grace_s=0.2),
        security=TransportSecurity.from_config(security, "weightsync", tls_dir),
    )
    await weightsync.start()
    config = TrainerRunConfig.model_validate(
        {
            "run": {"output_dir": str(run_dir), "name": "served"},
            "endpoints": {"trainer": "127.0.0.1:0", "weightsync": f"127.0.0.1:{weightsync.port}"},
            "grpc": {"shutdown_grace_s": 0.2},
            "security": security.model_dump(),
            "trainer": {
                "model": {**TINY_MODEL, "max_seq_len": 32},
                "device": "cpu",
                "publish_dir": str(root),
            },
        }
    )
    trainer = await start_trainer(config)
    for thread in threading.enumerate():  # settle start-up's memory before it is measured
        if thread.name == "prepare-first-step":
            thread.join()
    inference = await start_inference(
        InferenceRunConfig.model_validate(
            {
                "run": {"output_dir": str(run_dir), "name": "served"},
                "endpoints": {
                    "inference": "127.0.0.1:0",
                    "weightsync": f"127.0.0.1:{weightsync.port}",
                },
                "grpc": {"shutdown_grace_s": 0.2},
                "security": security.model_dump(),
                "telemetry": {"traces_file": False},
                "inference": {"device": "cpu", "max_batch_size": 2, "kv_cache_mb": 8},
            }
        )
    )
    while inference.engine.policy_version < 0:  # loaded: its memory settles before measures
        await asyncio.sleep(0.05)
    orchestrator = GrpcServer(
        "127.0.0.1:0",
        [
            ServiceBinding(
                OrchestratorServicer(ProgressState(total_steps=1)),
                orchestrator_pb2_grpc.add_OrchestratorServiceServicer_to_server,
                "tidal.rpc.v1.OrchestratorService",
            )
        ],
        GrpcConfig(shutdown_grace_s=0.2),
        security=TransportSecurity.from_config(security, "orchestrator", tls_dir),
    )
    await orchestrator.start()
    ports = (trainer.server.port, weightsync.port, inference.port, orchestrator.port)
    print(*ports, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await orchestrator.stop()
    await inference.server.stop()
    await inference.close()
    await trainer.stop()
    await weightsync.stop()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))
