"""LoRA adapter versions over the broadcast path, between real processes over gloo.

The test process is the trainer (a real LoRA `Trainer` and `WeightPublisher`, rank 0);
the replica runs in its own process (`workers/weight_replica.py`, the native engine
behind the real `WeightWatcher`). Version 0 (the base) goes by the filesystem, versions
1 and 2 are broadcast as adapters only; the replica merges them onto the base and must
be handed exactly the trainer's merged weights.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tidal.batch.tensors import MicroBatchData, positions_for
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.trainer.config import ModelConfig, TrainerConfig
from tidal.trainer.persistence.publisher import WeightPublisher
from tidal.trainer.train_step import Trainer
from tidal.weights.client import WeightSyncClient
from tidal.weightsync.config import BroadcastTransport

pytestmark = pytest.mark.distributed

REPLICA_SCRIPT = Path(__file__).parent / "workers" / "weight_replica.py"
MODEL = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}


def batch(seed: int) -> MicroBatchData:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([10, 8])
    mask = torch.cat([(torch.arange(int(n)) >= 2).float() for n in lengths])
    advantages = torch.cat([torch.ones(10), -torch.ones(8)])
    return MicroBatchData(
        input_ids=torch.randint(0, 259, (18,), generator=g),
        position_ids=positions_for(lengths),
        sample_lengths=lengths,
        loss_mask=mask,
        advantages=advantages * mask,
        behaviour_logprobs=(-torch.rand(18, generator=g) * 4 - 3) * mask,
    )


@pytest.fixture
async def broadcast_weightsync(tmp_path: Path, start_weightsync: Any) -> tuple[str, Path]:
    transport = BroadcastTransport(replicas=1, backend="gloo", bucket_bytes=4096, timeout_s=30)
    service = await start_weightsync(tmp_path / "weights", transport=transport)
    return service.address, service.root


@pytest.mark.slow
async def test_broadcast_adapters_are_served_as_the_trainers_merged_weights(
    broadcast_weightsync: tuple[str, Path], tmp_path: Path
) -> None:
    address, root = broadcast_weightsync
    out = tmp_path / "replica"
    out.mkdir()
    replica = subprocess.Popen(
        [sys.executable, str(REPLICA_SCRIPT), "--address", address, "--replica-id", "rank1",
         "--out", str(out), "--until", "2"],
    )  # fmt: skip
    config = TrainerConfig(
        model=ModelConfig.model_validate({**MODEL, "lora": LORA}), optim={"lr": 0.05}
    )
    trainer = Trainer(config, seed=0, device=torch.device("cpu"))
    client = WeightSyncClient(address, security=PLAINTEXT_LOOPBACK)
    publisher = WeightPublisher(
        root, client, trainer.hf_config(), adapter_config=trainer.adapter_config()
    )
    merged: dict[int, dict[str, torch.Tensor]] = {}
    try:
        await publisher.publish(0, trainer.state_dict_for_publish())  # before the group forms
        assert await asyncio.wait_for(publisher.transport_ready(), 60)
        for step in (1, 2):
            trainer.train_step(step, [batch(step)], "pg")
            merged[step] = trainer.state_dict_for_export()
            manifest = await publisher.publish(step, trainer.state_dict_for_publish())
            assert manifest.format == "lora-adapters"
        deadline = time.monotonic() + 60
        while not (out / "done.json").exists():
            assert replica.poll() is None, f"replica exited with {replica.returncode}"
            assert time.monotonic() < deadline, "replica did not serve version 2"
            await asyncio.sleep(0.1)
        assert json.loads((out / "done.json").read_text()) == {"broadcast": [1, 2], "served": 2}
        for step in (1, 2):
            handed = load_file(out / f"v{step}.safetensors")
            assert handed.keys() == merged[step].keys()
            assert all(torch.equal(handed[k], v) for k, v in merged[step].items())
        assert replica.wait(30) == 0
    finally:
        await client.close()
        if replica.poll() is None:
            replica.kill()
