"""LoRA: matches a direct reference (merged weights), trains only adapters, merges on export."""

from __future__ import annotations

import pydantic
import pytest
import torch
from torch.nn.utils import parametrize

from tidal.common.errors import ConfigError
from tidal.models.hf_checkpoint import publishable_state_dict
from tidal.models.lora import PEFT_PREFIX, LoRALinear
from tidal.trainer.config import ModelConfig
from tidal.trainer.memory.lora import apply_lora

from .conftest import FULL_LOSS, loss_and_grads, make_trainer

LORA = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def randomise_adapters(model: torch.nn.Module) -> None:
    """B starts at zero (a no-op adapter); draw it so the update really contributes."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.lora_B.copy_(torch.randn(module.lora_B.shape, generator=g) * 0.1)


class MergedUpdate(torch.nn.Module):
    """Reference LoRA as a weight parametrization: W ↦ W + (alpha/r)·B·A."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, scale: float) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Parameter(a.clone()), torch.nn.Parameter(b.clone())
        self.scale = scale

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight + self.scale * self.b @ self.a


def reference_loss_and_adapter_grads(trainer, batches):
    """The plain model with each targeted weight parametrised as W + (alpha/r)·B·A.

    Gradients reach A and B through the merged weight, independently of `LoRALinear`'s
    factored forward x·Wᵀ + s·(x·Aᵀ)·Bᵀ.
    """
    base = make_trainer(FULL_LOSS)  # same seed: the same base weights
    base.model.requires_grad_(False)
    scale = LORA["alpha"] / LORA["rank"]
    updates = {}
    for name, module in trainer.model.named_modules():
        if isinstance(module, LoRALinear):
            update = MergedUpdate(module.lora_A.detach(), module.lora_B.detach(), scale)
            parametrize.register_parametrization(base.model.get_submodule(name), "weight", update)
            updates[name] = update
    torch.manual_seed(0)
    loss = float(base.compute_gradients(batches, "pg")["loss"])
    grads = {}
    for name, update in updates.items():
        grads[f"{name}.lora_A"], grads[f"{name}.lora_B"] = update.a.grad, update.b.grad
    return loss, grads


def test_loss_and_adapter_gradients_equal_a_reference_lora(batches) -> None:
    trainer = make_trainer(FULL_LOSS, lora=LORA)
    randomise_adapters(trainer.model)
    loss, grads = loss_and_grads(trainer, batches)
    ref_loss, ref_grads = reference_loss_and_adapter_grads(trainer, batches)
    assert loss == pytest.approx(ref_loss, abs=1e-5)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-5, rtol=0, msg=name)


def test_a_fresh_adapter_leaves_the_model_unchanged(batches) -> None:
    plain = make_trainer(FULL_LOSS)
    adapted = make_trainer(FULL_LOSS, lora=LORA)
    torch.manual_seed(0)
    a = plain.compute_gradients(batches, "pg")["loss"]
    torch.manual_seed(0)
    b = adapted.compute_gradients(batches, "pg")["loss"]
    assert float(a) == pytest.approx(float(b), abs=1e-6)


def test_only_adapters_are_trainable_and_in_the_optimizer() -> None:
    trainer = make_trainer(lora=LORA)
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable)
    assert len(trainable) == 2 * 3 * 4  # A and B × 3 targets × 4 layers
    in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    named = dict(trainer.model.named_parameters())
    assert in_optimizer == {id(named[n]) for n in trainable}


def test_a_training_step_changes_adapters_and_leaves_base_weights(batches) -> None:
    trainer = make_trainer(lora=LORA)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train_step(1, batches, "pg")
    for name, p in trainer.model.named_parameters():
        changed = not torch.equal(p, before[name])
        # B starts at 0, so step 1 gives A no gradient: only the B matrices move.
        assert changed == name.endswith("lora_B"), name


def test_export_merges_adapters_into_plain_weights(batches) -> None:
    trainer = make_trainer(lora=LORA)
    randomise_adapters(trainer.model)
    state = publishable_state_dict(trainer.model)
    assert not any("lora" in name for name in state)
    plain = make_trainer()
    plain.model.load_state_dict(state)
    batch = batches[0]
    args = (batch.input_ids[None], batch.position_ids[None])
    kwargs = {"sample_lengths": batch.sample_lengths}
    torch.testing.assert_close(
        plain.model(*args, **kwargs), trainer.model(*args, **kwargs), atol=1e-5, rtol=0
    )


def test_adapter_publishing_sends_only_peft_named_adapters_after_version_0(batches) -> None:
    trainer = make_trainer(lora={**LORA, "publish": "adapters"})
    assert "model.layers.0.self_attn.q_proj.weight" in trainer.state_dict_for_publish()
    trainer.train_step(1, batches, "pg")
    state = trainer.state_dict_for_publish()
    assert set(state) == {
        f"{PEFT_PREFIX}model.layers.{i}.{m}.{part}.weight"
        for i in range(4)
        for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")
        for part in ("lora_A", "lora_B")
    }
    assert not any("lora" in name for name in trainer.state_dict_for_export())  # merged
    assert trainer.adapter_config() == {
        "peft_type": "LORA",
        "r": 4,
        "lora_alpha": 8.0,
        "lora_dropout": 0.0,
        "target_modules": ["down_proj", "q_proj", "v_proj"],
        "bias": "none",
    }


def test_targets_matching_no_module_are_a_config_error_naming_the_field() -> None:
    model = make_trainer().model
    config = ModelConfig(lora={"target_modules": ["q_proj", "qkv"]}).lora
    with pytest.raises(ConfigError, match=r"trainer\.model\.lora\.target_modules.*'qkv'"):
        apply_lora(model, config)


def test_an_empty_target_list_is_a_config_error() -> None:
    with pytest.raises(pydantic.ValidationError, match="target_modules"):
        ModelConfig(lora={"target_modules": []})


def test_published_adapter_versions_describe_the_adapters_in_config_json(tmp_path, batches) -> None:
    import json

    from safetensors.torch import load_file

    from tidal.trainer.persistence.publisher import WeightPublisher
    from tidal.weights.transports.filesystem import FilesystemSender

    trainer = make_trainer(lora={**LORA, "publish": "adapters"})
    publisher = WeightPublisher(
        tmp_path,
        client=None,
        hf_config=trainer.hf_config(),
        adapter_config=trainer.adapter_config(),
    )  # type: ignore[arg-type]  # payload() never talks to weightsync
    writer = FilesystemSender(tmp_path, client=None)  # type: ignore[arg-type]  # write() neither
    v0 = writer.write(publisher.payload(0, trainer.state_dict_for_publish()))
    trainer.train_step(1, batches, "pg")
    v1 = writer.write(publisher.payload(1, trainer.state_dict_for_publish()))
    config0 = json.loads((tmp_path / v0.location / "config.json").read_text())
    config1 = json.loads((tmp_path / v1.location / "config.json").read_text())
    assert "adapter_config" not in config0
    assert config1["adapter_config"]["r"] == 4
    weights = load_file(tmp_path / v1.location / "model.safetensors")
    assert all(name.startswith(PEFT_PREFIX) for name in weights)


def test_a_checkpoint_restores_adapters_and_their_optimizer_state(tmp_path, batches) -> None:
    from tidal.trainer.persistence.checkpoint import CheckpointManager

    trained = make_trainer(lora=LORA)
    trained.train_step(1, batches, "pg")
    manager = CheckpointManager(tmp_path, keep_last=1)
    manager.save(trained)
    restored = make_trainer(lora=LORA)
    manager.load(restored)
    for (name, a), (_, b) in zip(
        trained.model.named_parameters(), restored.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    trained.train_step(2, batches, "pg")
    restored.train_step(2, batches, "pg")
    for (name, a), (_, b) in zip(
        trained.model.named_parameters(), restored.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name


def test_adapters_are_a_function_of_the_seed_alone() -> None:
    a = make_trainer(lora=LORA)
    torch.rand(100)  # disturb the global RNG
    b = make_trainer(lora=LORA)
    for (name, x), (_, y) in zip(
        a.model.named_parameters(), b.model.named_parameters(), strict=True
    ):
        assert torch.equal(x, y), name
