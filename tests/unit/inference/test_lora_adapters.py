"""LoRA runs publish adapters only, and replicas serve them merged onto version 0.

Real parts, in-process: the trainer (LoRA lever, one real step), its publisher, the
weight-sync service over gRPC, the replica's watcher and the native engine. What the
engine serves is compared with the trainer's merged weights (what `publish = "merged"`
sends), and its logits with the trainer's own LoRA forward.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from tidal.batch.tensors import MicroBatchData, positions_for
from tidal.common.security.transport import PLAINTEXT_LOOPBACK
from tidal.inference.adapters import AdapterMerger
from tidal.inference.reload import WeightWatcher
from tidal.trainer.config import ModelConfig, TrainerConfig
from tidal.trainer.persistence.publisher import WeightPublisher
from tidal.trainer.train_step import Trainer
from tidal.weights.client import WeightSyncClient
from tidal.weights.folder import write_version
from tidal.weights.manifest import LORA_ADAPTERS
from tidal.weights.transports.filesystem import FilesystemSender
from tidal.weightsync.config import FilesystemTransport, StreamTransport
from tidal.weightsync.registry import VersionRegistry

from ...helpers.waiting import until

TINY: dict[str, Any] = dict(
    dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32, tie_embeddings=False
)
LORA: dict[str, Any] = {
    "rank": 4,
    "alpha": 8.0,
    "target_modules": ["q_proj", "v_proj", "down_proj"],
    "publish": "adapters",
}


def make_trainer(**model: Any) -> Trainer:
    config = TrainerConfig(
        model=ModelConfig.model_validate({**TINY, "lora": LORA, **model}),
        optim={"lr": 0.05},
        device="cpu",
    )
    return Trainer(config, seed=0, device=torch.device("cpu"))


def batch(seed: int) -> MicroBatchData:
    """Two packed samples with nonzero advantages, so a step moves the adapters."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([12, 9])
    mask = torch.cat([(torch.arange(int(n)) >= 2).float() for n in lengths])
    advantages = torch.cat([torch.full((12,), 1.0), torch.full((9,), -1.0)])
    return MicroBatchData(
        input_ids=torch.randint(0, 259, (21,), generator=g),
        position_ids=positions_for(lengths),
        sample_lengths=lengths,
        loss_mask=mask,
        advantages=advantages * mask,
        behaviour_logprobs=(-torch.rand(21, generator=g) * 4 - 3) * mask,
    )


def trainer_targets(trainer: Trainer) -> list[str]:
    return [
        n
        for n, _ in trainer.model.named_modules()
        if n.rsplit(".", 1)[-1] in LORA["target_modules"]
    ]


def positions(input_ids: torch.Tensor) -> torch.Tensor:
    return torch.arange(input_ids.shape[1]).expand_as(input_ids)  # (B, T)


@pytest.fixture(params=["filesystem", "stream"])
async def weightsync(request: pytest.FixtureRequest, tmp_path: Path, start_weightsync: Any) -> str:
    transport = FilesystemTransport() if request.param == "filesystem" else StreamTransport()
    service = await start_weightsync(
        tmp_path / "weights", transport=transport, keep_last=2, chunk_bytes=1 << 14
    )
    return str(service.address)


async def test_adapter_versions_serve_the_trainers_merged_weights_and_logits(
    weightsync: str, tmp_path: Path, recording_engine: Any
) -> None:
    client = WeightSyncClient(weightsync, security=PLAINTEXT_LOOPBACK)
    trainer = make_trainer()
    publisher = WeightPublisher(
        tmp_path / "weights",  # the stream trainer writes nothing there
        client,
        trainer.hf_config(),
        adapter_config=trainer.adapter_config(),
    )
    engine, late_engine = recording_engine(), recording_engine()
    await engine.start()
    await late_engine.start()
    watcher = WeightWatcher(client, engine, "replica")
    tasks = [asyncio.create_task(watcher.run())]
    try:
        base = await publisher.publish(0, trainer.state_dict_for_publish())
        await until(lambda: watcher.acked == 0, "version 0 not loaded")
        for step in (1, 2):
            trainer.train_step(step, [batch(step)], "pg")
            adapters = await publisher.publish(step, trainer.state_dict_for_publish())
            await until(lambda s=step: watcher.acked == s, f"version {step} not loaded")
            # Only the adapters travel, and the manifest says what they apply to.
            assert adapters.format == LORA_ADAPTERS and adapters.base_version == 0
            assert adapters.total_bytes < base.total_bytes / 10
            # Served = what a "merged" publish sends, bit for bit.
            merged = trainer.state_dict_for_export()
            assert engine.handed[step].keys() == merged.keys()
            assert all(torch.equal(engine.handed[step][k], merged[k]) for k in merged)
            changed = [k for k in merged if not torch.equal(merged[k], engine.handed[0][k])]
            assert changed == [f"{m}.weight" for m in trainer_targets(trainer)]
        assert engine.policy_version == 2
        ids = torch.randint(0, 259, (2, 16), generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            lora_logits = trainer.model(ids, positions(ids))  # (B, T, V): unmerged LoRA
        torch.testing.assert_close(engine.logits(ids), lora_logits, atol=1e-5, rtol=1e-5)
        # A replica starting now sees version 2 first: it fetches base 0, serves the same.
        late = WeightWatcher(client, late_engine, "late")
        tasks.append(asyncio.create_task(late.run()))
        await until(lambda: late.acked == 2, "late replica did not converge")
        assert list(late_engine.handed) == [2]
        assert torch.equal(late_engine.logits(ids), engine.logits(ids))
    finally:
        for task in tasks:
            task.cancel()
        await engine.close()
        await late_engine.close()
        await client.close()


async def test_adapters_for_another_base_are_refused_and_the_replica_keeps_serving(
    tmp_path: Path, recording_engine: Any, start_weightsync: Any
) -> None:
    root = tmp_path / "weights"
    service = await start_weightsync(root, keep_last=2, chunk_bytes=1 << 14)
    client = WeightSyncClient(service.address, security=PLAINTEXT_LOOPBACK)
    trainer = make_trainer()
    publisher = WeightPublisher(
        root, client, trainer.hf_config(), adapter_config=trainer.adapter_config()
    )
    engine = recording_engine()
    await engine.start()
    watcher = WeightWatcher(client, engine, "replica")
    task = asyncio.create_task(watcher.run())
    try:
        await publisher.publish(0, trainer.state_dict_for_publish())
        trainer.train_step(1, [batch(1)], "pg")
        await publisher.publish(1, trainer.state_dict_for_publish())
        await until(lambda: watcher.acked == 1, "version 1 not loaded")
        served = engine.handed[1]

        # Adapters naming an adapter version as their base: weight-sync refuses them.
        other = make_trainer(dim=48)  # adapters of another base model
        other.train_step(1, [batch(1)], "pg")

        def adapters_claiming(base: int) -> Any:  # version 2: `other`'s adapters on `base`
            config = {
                **other.hf_config(),
                "adapter_config": {**other.adapter_config(), "base_version": base},
            }
            return write_version(
                root,
                version=2,
                step=2,
                state_dict=other.state_dict_for_publish(),
                config=config,
                format=LORA_ADAPTERS,
                base_version=base,
            )

        bad = adapters_claiming(1)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await client.publish(bad)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "manifest.base_version 1" in (refused.value.details() or "")

        # Adapters of another base model, claiming base 0: the replica refuses them.
        shutil.rmtree(bad.location)
        bad = adapters_claiming(0)
        await client.publish(bad)
        await until(lambda: watcher.skipped == [2], "adapters of another base not refused")
        assert engine.policy_version == 1 and 2 not in engine.handed
        assert all(torch.equal(engine.handed[1][k], v) for k, v in served.items())

        # The next good version is served as usual.
        trainer.train_step(2, [batch(2)], "pg")
        await publisher.publish(3, trainer.state_dict_for_publish())
        await until(lambda: watcher.acked == 3, "version 3 not loaded")
        merged = trainer.state_dict_for_export()
        assert all(torch.equal(engine.handed[3][k], merged[k]) for k in merged)
    finally:
        task.cancel()
        await engine.close()
        await client.close()


def test_retention_keeps_the_base_of_the_adapters_it_keeps(tmp_path: Path) -> None:
    trainer = make_trainer()
    registry = VersionRegistry(tmp_path, keep_last=2)
    publisher = WeightPublisher(
        tmp_path, None, trainer.hf_config(), adapter_config=trainer.adapter_config()
    )  # type: ignore[arg-type]  # payload() never talks to weightsync
    writer = FilesystemSender(tmp_path, client=None)  # type: ignore[arg-type]  # write() neither

    async def publish_all() -> None:
        for version in range(5):
            if version == 1:
                trainer.train_step(1, [batch(1)], "pg")  # from here on: adapters only
            payload = publisher.payload(version, trainer.state_dict_for_publish())
            await registry.publish(writer.write(payload), {})

    asyncio.run(publish_all())
    assert [e.manifest.version for e in registry.all()] == [0, 3, 4]
    assert (tmp_path / "v000000" / "model.safetensors").is_file()
    assert not (tmp_path / "v000001").exists()


def test_merging_refuses_tensors_that_do_not_fit_the_base() -> None:
    trainer = make_trainer()
    merger = AdapterMerger()
    merger.keep_base(0, trainer.hf_config(), trainer.state_dict_for_export())
    trainer.train_step(1, [batch(1)], "pg")
    config = {
        **trainer.hf_config(),
        "adapter_config": {**trainer.adapter_config(), "base_version": 0},
    }
    adapters = trainer.state_dict_for_publish()
    name = next(n for n in adapters if n.endswith("q_proj.lora_A.weight"))
    with pytest.raises(ValueError, match="apply to base version 3"):
        merger.merge(
            1,
            {**config, "adapter_config": {**config["adapter_config"], "base_version": 3}},
            adapters,
        )
    with pytest.raises(ValueError, match=r"q_proj adapters A \(4, 31\)"):
        merger.merge(1, config, {**adapters, name: adapters[name][:, :31]})
    with pytest.raises(ValueError, match="only"):
        merger.merge(1, config, {k: v for k, v in adapters.items() if k != name})
    with pytest.raises(ValueError, match=r"adapter_config\.r is missing"):
        merger.merge(1, {**config, "adapter_config": {"base_version": 0}}, adapters)
