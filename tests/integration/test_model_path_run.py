"""`tidal rl @ configs/default.toml --trainer.model.path DIR` starts and trains from the
folder, the trainer and inference name the folder's model in
GetStatus, and version 0 is a complete model folder."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tidal.rpc.v1 import common_pb2, inference_pb2_grpc, trainer_pb2_grpc

from ..hf_folders import qwen3_folder
from ..tls_fixtures import aio_role_channel

__all__ = ["qwen3_folder"]


async def statuses(run_dir: Path, config: dict) -> tuple[str, str]:  # type: ignore[type-arg]
    endpoints, tls = config["endpoints"], run_dir / "tls"
    async with aio_role_channel(tls, "operator", endpoints["trainer"]) as channel:
        trainer = await trainer_pb2_grpc.TrainerServiceStub(channel).GetStatus(
            common_pb2.StatusRequest(), timeout=10
        )
    async with aio_role_channel(tls, "operator", endpoints["inference"]) as channel:
        inference = await inference_pb2_grpc.InferenceServiceStub(channel).GetStatus(
            common_pb2.StatusRequest(), timeout=10
        )
    return trainer.model, inference.model


def progress(config_path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tidal.cli", "client", "progress", "@", str(config_path)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    return done.stdout if done.returncode == 0 else ""


@pytest.mark.slow
def test_a_run_starts_from_a_model_folder_and_names_it(launch, qwen3_folder: Path) -> None:  # type: ignore[no-untyped-def]
    hf = json.loads((qwen3_folder / "config.json").read_text())
    run = launch(
        "--trainer.model.path", str(qwen3_folder), "--orchestrator.steps", "2",
        "--orchestrator.warmup-steps", "0", "--orchestrator.exit-when-done", "false",
    )  # fmt: skip
    config = run.wait_for_config()
    assert config["trainer"]["model"]["family"] == "qwen3"
    deadline = time.monotonic() + 240
    while not progress(run.run_dir / "config.toml").startswith("done"):
        assert time.monotonic() < deadline and run.process.poll() is None, run.output()
        time.sleep(1)
    trainer_model, inference_model = asyncio.run(statuses(run.run_dir, config))
    assert trainer_model.startswith("qwen3 ") and f"dim {hf['hidden_size']}" in trainer_model
    assert inference_model.startswith(f"qwen3-{hf['num_hidden_layers']}x{hf['hidden_size']} (")

    version0 = run.run_dir / "weights" / "v000000"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (version0 / name).read_bytes() == (qwen3_folder / name).read_bytes(), name
    source_eos = json.loads((qwen3_folder / "generation_config.json").read_text())["eos_token_id"]
    generation = json.loads((version0 / "generation_config.json").read_text())
    assert set(source_eos) <= set(generation["eos_token_id"])
    published = json.loads((version0 / "config.json").read_text())
    assert published["eos_token_id"] in source_eos and "pad_token_id" in published
    assert run.stop() == 130
