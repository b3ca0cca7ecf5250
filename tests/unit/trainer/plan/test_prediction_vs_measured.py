"""The planner's peak prediction against the measured peak RSS of real training steps.

Each configuration trains two real steps (`Trainer.train_step`) in a fresh subprocess
(`tidal.trainer.plan.measure`); the prediction must be within 15% of the measured peak.
The levers of issue 7a (checkpointing, activation offloading, chunked head, LoRA) join
this list as one line each once they are on main.
"""

from __future__ import annotations

import pytest

from tidal.trainer.config import TrainerConfig
from tidal.trainer.plan.estimate import Workload, plan_memory
from tidal.trainer.plan.levers import Levers
from tidal.trainer.plan.measure import measure
from tidal.trainer.plan.model_size import decoder_args

SMALL = {"dim": 128, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 256}
CASES = {
    "logits-dominated": ({"model": {**SMALL, "n_layers": 2, "vocab_size": 8192}}, 1024),
    "activation-dominated": (
        {"model": {**SMALL, "dim": 256, "n_layers": 6, "ffn_dim": 704, "vocab_size": 512}},
        1024,
    ),
    "optimizer-on-disk": (
        {
            "model": {**SMALL, "dim": 256, "n_layers": 4, "ffn_dim": 704, "vocab_size": 4096},
            "optim": {"optim_offload": "disk", "optim_offload_buffer_mb": 4},
        },
        512,
    ),
    "sgd-without-state": (
        {"model": {**SMALL, "n_layers": 3, "vocab_size": 4096}, "optim": {"type": "sgd"}},
        768,
    ),
    "qwen3-untied": (
        {
            "model": {
                **SMALL,
                "family": "qwen3",
                "head_dim": 32,
                "n_layers": 3,
                "vocab_size": 4096,
                "tie_embeddings": False,
            }
        },
        768,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_predicted_peak_is_within_15_percent_of_measured(name: str) -> None:
    raw, tokens = CASES[name]
    config = TrainerConfig.model_validate({**raw, "device": "cpu"})
    predicted = plan_memory(
        decoder_args(config.model), Levers.from_config(config), Workload(tokens=tokens)
    ).peak
    measured = measure(config.model_dump_json(), tokens=tokens)["peak_bytes"]
    ratio = predicted / measured
    assert 0.85 <= ratio <= 1.15, (
        f"{name}: predicted {predicted / 2**20:.1f} MiB, measured {measured / 2**20:.1f} MiB"
    )
