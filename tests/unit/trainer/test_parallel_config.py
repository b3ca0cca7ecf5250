"""`[trainer.parallel]`: bad combinations fail at config load, naming the fields."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tidal.common.config.loading import load_config
from tidal.common.errors import ConfigError
from tidal.trainer.config import TrainerConfig, TrainerRunConfig

MOE = {"family": "qwen3_moe", "n_experts": 6, "head_dim": 32}


def trainer(world_size: int, model: dict[str, Any] | None = None, **parallel: Any) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {"world_size": world_size, "parallel": parallel, "model": model or {}}
    )


def test_defaults_are_one_process_and_fsdp_takes_the_rest() -> None:
    assert trainer(1).parallel.dp_shard == -1
    assert trainer(4, dp_replicate=2).world_size == 4


def test_world_size_that_does_not_factor_shows_the_arithmetic() -> None:
    with pytest.raises(ValidationError, match=r"world_size 3 is not divisible by dp_replicate"):
        trainer(3, dp_replicate=2)
    with pytest.raises(ValidationError, match=r"2 × 2 × 1 = 4, but trainer.world_size is 2"):
        trainer(2, dp_replicate=2, dp_shard=2)


def test_ep_not_dividing_the_experts_names_both_fields() -> None:
    with pytest.raises(
        ValidationError, match=r"trainer.parallel.ep = 4 must divide trainer.model.n_experts = 6"
    ):
        trainer(4, MOE, ep=4)
    assert trainer(2, MOE, ep=2).parallel.ep == 2


def test_ep_may_take_part_of_the_shard_group() -> None:
    # dp_shard 4 = two EP groups of 2 (experts replicated across the groups)
    assert trainer(4, MOE, ep=2).parallel.ep == 2
    with pytest.raises(ValidationError, match=r"ep 4 must divide dp_shard 2"):
        trainer(4, MOE, ep=4, dp_replicate=2)


def test_ep_with_cp_names_both_fields() -> None:
    with pytest.raises(
        ValidationError,
        match=r"trainer.parallel.ep = 2 cannot be combined with trainer.parallel.cp = 2",
    ):
        trainer(4, MOE, ep=2, cp=2)


def test_ep_on_a_dense_model_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"ep = 2 needs a mixture-of-experts model"):
        trainer(2, ep=2)


def test_cp_with_an_attention_kernel_it_cannot_replace_names_the_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # flash-attn is not installed here; pretend it is so only the CP rule can refuse it.
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "flash_attn" else real(name, *a),
    )
    with pytest.raises(
        ValidationError,
        match=r"trainer.parallel.cp = 2 \(cp_style 'ring'\) does not support "
        r"trainer.model.attn = 'flash_attention_2'",
    ):
        trainer(2, {"attn": "flash_attention_2"}, cp=2)


def test_cp_refuses_losses_that_need_whole_samples() -> None:
    for loss in ({"norm": "sequence"}, {"ratio_level": "sequence"}):
        with pytest.raises(ValidationError, match=r"trainer.parallel.cp = 2 splits samples"):
            TrainerConfig.model_validate({"world_size": 2, "parallel": {"cp": 2}, "loss": loss})
    assert trainer(2, cp=2).parallel.cp == 2


def test_cp_refuses_sequence_masks_and_keeps_token_corrections() -> None:
    for region in ({"sequence_ratio_high": 10.0}, {"geo_ratio_low": 0.5}):
        loss = {"trust_region": region}
        with pytest.raises(ValidationError, match=r"cp = 2 splits samples over ranks, which the"):
            TrainerConfig.model_validate({"world_size": 2, "parallel": {"cp": 2}, "loss": loss})
    token = {"tis_cap": 2.0, "objective": "decoupled", "trust_region": {"ratio_high": 5.0}}
    config = {"world_size": 2, "parallel": {"cp": 2}, "loss": token}
    assert TrainerConfig.model_validate(config).loss.tis_cap == 2.0


def test_ulysses_needs_heads_divisible_by_cp() -> None:
    with pytest.raises(
        ValidationError, match=r"n_heads \(4\) divisible by trainer.parallel.cp \(8\)"
    ):
        trainer(8, cp=8, cp_style="ulysses")
    assert trainer(8, cp=8, cp_style="ring").parallel.cp == 8


def test_cli_override_error_reaches_the_user_as_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"trainer.world_size 3 is not divisible"):
        load_config(
            TrainerRunConfig,
            ["--trainer.world-size", "3", "--trainer.parallel.dp-replicate", "2"],
        )
