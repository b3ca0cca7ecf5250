"""A real pretrained model from a GGUF runs end to end: SmolLM2-135M-Instruct, imported by
`tidal import-model`'s code (cached, `tests/smollm2.py`), trains for a few GRPO steps
through the four services with its own tokenizer and ChatML template, publishes versions
that moved away from the imported weights, and `tidal export` of the run writes a folder
that agrees with the last published version, gives our logits in transformers and
generates text.

The reward is a format reward (the completion holds a digit) on "What is a+b?" prompts:
the 4-bit 135M model rarely answers with a bare number, and a reward every sample misses
gives no gradient. Kept small for 2 cores: 3 steps of 2 prompts × 4, 8 new tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tidal.models.hf_checkpoint import load_hf_folder
from tidal.models.hf_folder import read_weights
from tidal.orchestrator.records.run_log import run_log_records

from ..smollm2 import IM_START, smollm2_folder

__all__ = ["smollm2_folder"]

transformers = pytest.importorskip("transformers")
STEPS = 3
HAS_DIGIT = r"(?s).*\d.*"


def sums_dataset(path: Path) -> Path:
    with path.open("w") as f:
        for i in range(20):
            record = {"prompt": f"What is {i * 7 % 10}+{i * 3 % 10}?", "answer": HAS_DIGIT}
            f.write(json.dumps(record) + "\n")
    return path


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_imported_gguf_model_trains_publishes_and_its_export_generates(
    launch,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    smollm2_folder: Path,
) -> None:
    run = launch(
        "--trainer.model.path", str(smollm2_folder),
        "--orchestrator.task.type", "dataset",
        "--orchestrator.task.path", str(sums_dataset(tmp_path / "sums.jsonl")),
        "--orchestrator.task.verifier", "regex",
        "--orchestrator.steps", str(STEPS), "--orchestrator.warmup-steps", "0",
        "--orchestrator.prompts-per-step", "2", "--orchestrator.group-size", "4",
        "--orchestrator.sampling.max-tokens", "8",
        # SGD and one kept version, for machines with little free disk: the checkpoint
        # holds no AdamW moments (twice the weights' size) and one version is on disk
        "--trainer.optim.type", "sgd", "--trainer.optim.lr", "1e-3",
        "--weightsync.keep-last", "1",
        "--orchestrator.report.table-every", "0", "--grpc.shutdown-grace-s", "0.5",
    )  # fmt: skip
    assert run.process.wait(timeout=420) == 0, run.output()

    config = run.wait_for_config()
    model = config["trainer"]["model"]
    assert (model["family"], model["n_layers"], model["vocab_size"]) == ("llama", 30, 49152)
    logs = run.run_dir / "logs"
    assert "prompts through its chat template" in (logs / "orchestrator.log").read_text()
    assert "llama 134.52M params" in (logs / "trainer.log").read_text()

    records = run_log_records(run.run_dir / "metrics.jsonl")
    rl = [r for r in records if r["phase"] == "rl"]
    assert len(rl) == STEPS
    assert any(r["train/grad_norm"] > 0 for r in rl), [r["reward_std"] for r in rl]

    last = run.run_dir / "weights" / f"v{STEPS:06d}"
    published = read_weights(last)
    imported = read_weights(smollm2_folder)
    embed = "model.embed_tokens.weight"
    assert not torch.equal(published[embed].float(), imported[embed]), "no step moved it"
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (last / name).read_bytes() == (smollm2_folder / name).read_bytes(), name

    export = tmp_path / "export"
    done = subprocess.run(
        [sys.executable, "-m", "tidal.cli", "export", "@", str(run.run_dir / "config.toml"),
         "--export.out", str(export)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    exported = read_weights(export)
    assert exported.keys() == published.keys()
    for name, tensor in exported.items():  # the checkpoint of the last step is that version
        assert torch.equal(tensor.to(published[name].dtype), published[name]), name
    assert_export_generates(export)


def assert_export_generates(export: Path) -> None:
    """The export loads in transformers with our logits and greedily answers a chat."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(export)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        export, dtype=torch.float32
    ).eval()
    chat = [{"role": "user", "content": "What is 2+3?"}]
    prompt = tokenizer.apply_chat_template(
        chat, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert tokenizer.decode(prompt["input_ids"][0]).startswith(f"{IM_START}system\n")
    ours = load_hf_folder(export, impl="custom").eval()
    ids = prompt["input_ids"]  # (1, T)
    with torch.no_grad():
        torch.testing.assert_close(
            ours(ids, torch.arange(ids.shape[1])[None]),
            reference(input_ids=ids).logits,
            rtol=0,
            atol=1e-5,
        )
        generated = reference.generate(**prompt, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(generated[0, ids.shape[1] :], skip_special_tokens=True)
    assert len(generated[0]) > ids.shape[1] and text.strip(), text
