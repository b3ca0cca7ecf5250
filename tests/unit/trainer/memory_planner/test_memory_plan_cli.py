"""`tidal plan`: itemised prediction, --fit with the TOML to paste, --json, bad input."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from tidal.cli.memory_plan import parse_bytes, run
from tidal.common.config.loading import ConfigError
from tidal.trainer.config import TrainerConfig
from tidal.trainer.memory_planner.levers import Levers

ROOT = Path(__file__).resolve().parents[4]
DEFAULT = ["@", str(ROOT / "configs" / "default.toml")]
# A Llama-3-8B-shaped model, as `--section.key value` overrides of the default run.
LLAMA_8B = [
    *DEFAULT,
    *("--trainer.model.dim", "4096", "--trainer.model.n_layers", "32"),
    *("--trainer.model.n_heads", "32", "--trainer.model.n_kv_heads", "8"),
    *("--trainer.model.ffn_dim", "14336", "--trainer.model.vocab_size", "128256"),
    *("--trainer.model.max_seq_len", "8192", "--tokens", "8192"),
    *("--trainer.model.tie_embeddings", "false"),
]


def test_json_itemises_the_peak_and_sums_to_it() -> None:
    text, code = run([*LLAMA_8B, "--memory", "80GiB", "--world-size", "8", "--json"])
    out = json.loads(text)
    items = out["current"]["items"]
    assert set(items) >= {"parameters", "gradients", "optimizer states", "activations", "logits"}
    assert {"communication buffers", "fragmentation margin"} <= set(items)
    assert sum(items.values()) == pytest.approx(out["current"]["peak"])
    assert out["parameters"] == 8_030_261_248  # Llama 3 8B
    assert items["parameters"] == pytest.approx(4 * out["parameters"] / 8)  # fp32, 8 shards
    per_layer = out["activation_bytes_per_layer"]
    assert per_layer["full checkpointing"] < per_layer["selective (norm, mlp)"]
    assert per_layer["selective (norm, mlp)"] < per_layer["no checkpointing"]
    assert code == 1  # 8k tokens of an 8B model without levers do not fit 80 GiB


def test_fit_picks_levers_that_fit_and_prints_toml_to_paste() -> None:
    text, code = run([*LLAMA_8B, "--memory", "80GiB", "--world-size", "8", "--fit", "--json"])
    found = json.loads(text)["fit"]
    assert code == 0 and found["peak"] <= 80 * 2**30
    assert found["levers"] != ["none"] and found["step_time_factor"] > 1
    assert tomllib.loads(found["toml"])["trainer"]  # a [trainer.*] table to paste


def test_fit_with_a_budget_that_fits_needs_no_lever() -> None:
    text, code = run([*DEFAULT, "--memory", "24GiB", "--fit", "--device", "cpu"])
    assert code == 0 and "# no lever needed" in text


def test_fit_reports_when_nothing_fits() -> None:
    text, code = run([*LLAMA_8B, "--memory", "1GiB", "--fit"])
    assert code == 1 and "no lever combination fits" in text


def test_disk_offload_toml_round_trips_through_the_config() -> None:
    levers = Levers(optim_offload="disk")
    config = TrainerConfig.model_validate(tomllib.loads(levers.to_toml())["trainer"])
    assert Levers.from_config(config).optim_offload == "disk"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80GiB", 80 * 2**30), ("24 GB", 24 * 10**9), ("512MiB", 512 * 2**20), ("1e9", 10**9)],
)
def test_memory_sizes_parse(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


def test_bad_memory_names_the_option() -> None:
    with pytest.raises(ConfigError, match="memory"):
        run([*DEFAULT, "--memory", "lots"])


def test_fit_at_one_rank_never_answers_fsdp_cpu_offload() -> None:
    """Only FSDP CPU offload would fit this budget, but FSDP needs more than one rank: the
    trainer refuses the lever at world size 1, so the planner finds nothing."""
    text, code = run([*LLAMA_8B, "--memory", "40GiB", "--world-size", "1", "--fit", "--json"])
    assert code == 1 and json.loads(text)["fit"] is None


def test_world_size_defaults_to_the_runs_trainer_world_size() -> None:
    text, _ = run([*LLAMA_8B, "--trainer.world_size", "8", "--memory", "80GiB", "--json"])
    assert json.loads(text)["world_size"] == 8


def test_fit_for_another_world_size_than_the_configs_sets_it() -> None:
    text, code = run([*LLAMA_8B, "--memory", "80GiB", "--world-size", "8", "--fit", "--json"])
    answer = tomllib.loads(json.loads(text)["fit"]["toml"])
    assert code == 0 and answer["trainer"]["world_size"] == 8
