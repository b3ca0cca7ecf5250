"""GRPO on a Hugging Face model folder learns end to end: `tidal rl @
configs/default.toml --trainer.model.path DIR` with a Qwen3-style folder (its own BPE
tokenizer, ChatML template, generation_config.json EOS list, random weights) runs the
default reversal task through the folder's chat template, and the reward rises.

The folder has the default run's size (2 layers, dim 128), so the bar is the default
run's: the mean reward of the last five RL steps at least 0.3 above the first five's
(measured with this very folder on the 2-core CPU machine: 0.05 → 0.63, 75 steps in
~38 s, `tidal rl @ configs/default.toml --trainer.model.path DIR`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.orchestrator.config import OrchestratorConfig
from tidal.orchestrator.records.run_log import run_log_records

from ..hf_folders import build_model_folder

TEN_MINUTES = 600


@pytest.mark.slow
@pytest.mark.timeout(TEN_MINUTES + 60)
def test_grpo_from_a_qwen3_folder_through_its_chat_template_raises_the_reward(
    launch,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    folder = build_model_folder(tmp_path / "qwen3-128", "qwen3", dim=128, ffn_dim=352)
    run = launch(
        "--trainer.model.path", str(folder), "--orchestrator.report.table-every", "0",
        "--grpc.shutdown-grace-s", "0.5",
    )  # fmt: skip
    assert run.process.wait(timeout=TEN_MINUTES) == 0, run.output()

    config = run.wait_for_config()
    assert config["trainer"]["model"]["family"] == "qwen3" and config["run"]["tokenizer"] == "auto"
    logs = run.run_dir / "logs"
    assert "prompts through its chat template" in (logs / "orchestrator.log").read_text()
    assert f"tokenizer {folder}" in (logs / "inference.log").read_text()

    records = run_log_records(run.run_dir / "metrics.jsonl")
    rl = [r for r in records if r["phase"] == "rl"]
    assert len(rl) == OrchestratorConfig().steps
    first = sum(r["reward_mean"] for r in rl[:5]) / 5
    last = sum(r["reward_mean"] for r in rl[-5:]) / 5
    assert last >= first + 0.3, f"reward {first:.3f} -> {last:.3f}"
