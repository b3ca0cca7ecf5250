"""Expert parallelism refuses a built model it cannot split, naming the field (models
loaded from `model.path` are only known once built)."""

from __future__ import annotations

import pytest

from tidal.common.errors import ConfigError
from tidal.trainer.config import ModelConfig
from tidal.trainer.model_factory import build_model
from tidal.trainer.parallel.ep import check_expert_model

TINY = {"dim": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "ffn_dim": 32}


def test_ep_dividing_the_experts_is_accepted() -> None:
    model = build_model(ModelConfig(family="qwen3_moe", n_experts=6, moe_ffn_dim=8, **TINY), seed=0)
    check_expert_model(model, 2)
    with pytest.raises(ConfigError, match=r"trainer.parallel.ep = 4 must divide .* n_experts = 6"):
        check_expert_model(model, 4)


def test_ep_on_a_model_without_moe_blocks_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"trainer.parallel.ep = 2 needs a mixture-of-experts"):
        check_expert_model(build_model(ModelConfig(**TINY), seed=0), 2)
