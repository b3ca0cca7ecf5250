"""The planner on SmolLM2-135M's architecture (Llama, 30 layers, GQA 9/3, a 49,152 vocabulary,
tied embeddings) at the RL shape's micro-batch: 2048 tokens of ~100-token samples.

Two holds. The real model's measured peaks (full fine-tune and LoRA, bf16 autocast, recorded
in docs/benchmarks/memory_plan.md: a real step takes minutes on 2 cores) must stay within 15%
of the prediction for its config. A `slow` test measures a scaled model of the same shape
(the real width, heads and vocabulary, fewer layers) in the suite, at the precision the
trainer's "auto" picks on the machine running it.
"""

from __future__ import annotations

import pytest

from tidal.models.args import DecoderArgs
from tidal.trainer.config import TrainerConfig
from tidal.trainer.memory_measure import measure
from tidal.trainer.memory_planner.estimate import Workload, plan_memory, resolve_precision
from tidal.trainer.memory_planner.levers import Levers
from tidal.trainer.memory_planner.model_size import param_counts

# SmolLM2-135M-Instruct's config.json (as `tidal import-model` writes it), the fields read.
SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
}
TOKENS, SAMPLE_LEN = 2048, 100
# Measured peaks (MiB) of the real folder, bf16, `tidal.trainer.memory_measure`.
MEASURED_MIB = {"full": 5416.6, "lora": 3810.6}
LORA = {"rank": 8}  # the default targets: q, k, v, o


def _levers(case: str) -> Levers:
    model = {"lora": LORA} if case == "lora" else {}
    return Levers.from_config(TrainerConfig.model_validate({"model": model}))


@pytest.mark.parametrize("case", MEASURED_MIB)
def test_prediction_for_the_real_model_is_within_15_percent_of_its_measured_peak(
    case: str,
) -> None:
    args = DecoderArgs.from_hf_config(SMOLLM2)
    assert param_counts(args).total == 134_515_008  # the folder's tensors, tied head once
    workload = Workload(tokens=TOKENS, precision="bf16")
    predicted = plan_memory(args, _levers(case), workload).peak / 2**20
    assert 0.85 <= predicted / MEASURED_MIB[case] <= 1.15, (case, predicted)


SCALED = {
    "dim": 576,
    "n_heads": 9,
    "n_kv_heads": 3,
    "ffn_dim": 1536,
    "vocab_size": 49152,
    "tie_embeddings": True,
    "n_layers": 4,
    "max_seq_len": 256,
}


@pytest.mark.slow
@pytest.mark.parametrize("case", ["full", "lora"])
def test_prediction_for_a_scaled_smollm2_is_within_15_percent_of_a_measured_step(
    case: str,
) -> None:
    model = {**SCALED, "lora": LORA} if case == "lora" else SCALED
    config = TrainerConfig.model_validate({"model": model, "device": "cpu"})
    args = config.model.decoder_args()
    precision = resolve_precision(config.precision, "cpu", param_counts(args).total)
    workload = Workload(tokens=TOKENS, precision=precision)
    predicted = plan_memory(args, Levers.from_config(config), workload).peak
    measured = measure(config.model_dump_json(), tokens=TOKENS, sample_len=SAMPLE_LEN)
    ratio = predicted / measured["peak_bytes"]
    assert 0.85 <= ratio <= 1.15, (case, precision, predicted / 2**20, measured)
