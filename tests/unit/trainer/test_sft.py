"""`tidal sft`: data from disk, prompt masking, chat records trained on assistant turns only,
data order, and exact resume after a kill."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from tidal.common.config.loading import load_config
from tidal.common.errors import ConfigError
from tidal.text.byte import ByteTokenizer
from tidal.text.conversation import ChatRendering
from tidal.text.hf_tokenizer import HFTokenizer
from tidal.trainer.config import SftRunConfig
from tidal.trainer.sft import pack_for_trainer, run_sft
from tidal.trainer.sft_data import (
    Conversation,
    PromptCompletion,
    SampleOrder,
    read_records,
    to_samples,
)

BYTES = ChatRendering(ByteTokenizer(), template=False)

RECORDS = [
    {"prompt": f"reverse {w}:", "completion": w[::-1]} for w in ("abc", "dcba", "ab", "bad", "cab")
]

CONFIG = """
[run]
seed = 3
[trainer]
device = "cpu"
[trainer.model]
dim = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 64
max_seq_len = 32
[trainer.optim]
lr = 3e-3
[trainer.optim.schedule]
warmup_steps = 1
decay = "cosine"
decay_steps = 3
[trainer.ckpt]
interval = 2
keep_last = 2
[sft]
steps = 4
batch_size = 3
micro_batch_tokens = 40
"""


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def make_config(tmp_path: Path, name: str, *extra: str) -> SftRunConfig:
    data = write_jsonl(tmp_path / "data.jsonl", RECORDS)
    cfg = tmp_path / "sft.toml"
    cfg.write_text(CONFIG)
    argv = ["@", str(cfg), "--sft.data.path", str(data), "--run.output_dir", str(tmp_path)]
    config, _ = load_config(SftRunConfig, [*argv, "--run.name", name, *extra])
    return config


def read_records_from(rows: list[dict[str, str]]) -> list[PromptCompletion]:
    return [PromptCompletion(r["prompt"], r["completion"]) for r in rows]


def test_jsonl_and_parquet_give_the_same_records(tmp_path: Path) -> None:
    jsonl = write_jsonl(tmp_path / "d.jsonl", RECORDS)
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(RECORDS), parquet)
    kw = {"prompt_key": "prompt", "completion_key": "completion"}
    from_jsonl, from_parquet = read_records(jsonl, **kw), read_records(parquet, **kw)
    assert from_jsonl == from_parquet and len(from_jsonl) == len(RECORDS)
    assert from_jsonl[1].prompt == "reverse dcba:" and from_jsonl[1].completion == "abcd"


def test_a_bad_record_is_an_error_naming_the_record_and_the_key(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [RECORDS[0], {"prompt": "x", "answer": "y"}])
    with pytest.raises(ConfigError, match=r"record 2: missing key 'completion'"):
        read_records(data, prompt_key="prompt", completion_key="completion")
    data.write_text('{"prompt": "x", "completion": "y"}\n{oops\n')
    with pytest.raises(ConfigError, match="line 2: not valid JSON"):
        read_records(data, prompt_key="prompt", completion_key="completion")


def test_prompt_tokens_are_masked_and_completion_tokens_trained() -> None:
    tok = BYTES.tokenizer
    records = read_records_from(RECORDS[:2])
    samples = to_samples(records, BYTES, max_seq_len=32)
    (batch,) = pack_for_trainer(samples, budget=64)
    first = samples[0]
    n_prompt, n_completion = len(first.prompt_ids), len(first.completion_ids)
    assert first.prompt_ids[0] == tok.bos_id and first.completion_ids[-1] == tok.eos_id
    assert batch.loss_mask[:n_prompt].sum() == 0
    assert batch.loss_mask[n_prompt : n_prompt + n_completion].tolist() == [1.0] * n_completion
    assert batch.num_loss_tokens == sum(len(s.completion_ids) for s in samples)
    assert batch.sample_lengths.tolist() == [s.num_tokens for s in samples]


def qwen3_folder(folder: Path, *, weights: bool = False) -> Path:
    # imported here: the resume test runs this file as a script, where relative imports fail
    from ...hf_folders import build_model_folder

    return build_model_folder(folder, "qwen3", weights=weights)


def qwen3_tokenizer(folder: Path) -> HFTokenizer:
    return HFTokenizer.from_folder(qwen3_folder(folder))


CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "42."},
    {"role": "user", "content": "And 1 + 2?"},
    {"role": "assistant", "content": "3."},
]


def test_a_messages_record_trains_every_assistant_turn_and_nothing_else(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}, RECORDS[0]])
    records = read_records(data, prompt_key="prompt", completion_key="completion")
    assert records[0] == Conversation(tuple(CHAT))
    tok = qwen3_tokenizer(tmp_path / "qwen3")
    (sample, _) = to_samples(records, ChatRendering(tok, template=True), max_seq_len=128)
    # Hand-rendered ChatML: role headers, the "\n" after <|im_end|> and the generation
    # prompt are masked; each assistant answer and its <|im_end|> are trained.
    segments = [
        ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 12 + 30?"
         "<|im_end|>\n<|im_start|>assistant\n", 0),
        ("42.<|im_end|>", 1),
        ("\n<|im_start|>user\nAnd 1 + 2?<|im_end|>\n<|im_start|>assistant\n", 0),
        ("3.<|im_end|>", 1),
    ]  # fmt: skip
    ids = [tok.encode_template_text(text) for text, _ in segments]
    mask = [float(trained) for (_, trained), part in zip(segments, ids, strict=True) for _ in part]
    assert list(sample.prompt_ids) == ids[0]
    assert list(sample.completion_ids) == [i for part in ids[1:] for i in part]
    assert list(sample.completion_mask) == mask[len(ids[0]) :]
    (batch,) = pack_for_trainer([sample], budget=128)
    assert batch.loss_mask[: len(mask)].tolist() == mask  # what the trainer's loss reads


def test_prompt_completion_records_use_the_template_when_it_is_on(tmp_path: Path) -> None:
    tok = qwen3_tokenizer(tmp_path / "qwen3")
    (sample,) = to_samples(
        read_records_from(RECORDS[:1]), ChatRendering(tok, template=True), max_seq_len=128
    )
    prompt = tok.decode(sample.prompt_ids, skip_special=False)
    assert prompt == "<|im_start|>user\nreverse abc:<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(sample.completion_ids, skip_special=False) == "cba<|im_end|>"
    assert sample.completion_mask == ()  # every completion token is trained


def test_sft_from_a_model_folder_trains_on_the_assistant_tokens_only(tmp_path: Path) -> None:
    folder = qwen3_folder(tmp_path / "qwen3", weights=True)
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT}])
    argv = ["--trainer.model.path", str(folder), "--trainer.device", "cpu"]
    argv += ["--sft.data.path", str(data), "--sft.steps", "1", "--sft.batch-size", "1"]
    config, _ = load_config(SftRunConfig, [*argv, "--run.output_dir", str(tmp_path)])
    (metrics,) = run_sft(config)  # run.tokenizer "auto": the folder's tokenizer and template
    tok = HFTokenizer.from_folder(folder)
    assistant = tok.encode_template_text("42.<|im_end|>3.<|im_end|>")
    assert metrics["loss_tokens"] == len(assistant)
    final = config.run.dir / "final"  # a complete HF folder: the source's tokenizer files
    assert (final / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    exported = json.loads((final / "config.json").read_text())
    assert exported["model_type"] == "qwen3" and exported["eos_token_id"] == tok.eos_id
    assert (final / "generation_config.json").is_file()


def test_a_conversation_without_an_assistant_turn_is_an_error(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": CHAT[:2]}])
    with pytest.raises(ConfigError, match="record 1: 'messages' needs an assistant message"):
        read_records(data, prompt_key="prompt", completion_key="completion")


def test_sample_order_is_a_pure_function_of_the_position() -> None:
    samples = to_samples(read_records_from(RECORDS), BYTES, max_seq_len=32)
    order = SampleOrder(samples, seed=0)
    epoch, position = [], 0
    while position < len(samples):
        batch, position = order.batch(position, 1)
        epoch += batch
    assert sorted(epoch, key=str) == sorted(samples, key=str)  # an epoch visits every sample
    fresh = SampleOrder(samples, seed=0)
    assert fresh.batch(7, 3) == order.batch(7, 3)  # no hidden state: a resumed run agrees


def test_sft_run_lowers_the_loss_and_exports_final_weights(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        "learn",
        *("--sft.steps", "12", "--trainer.ckpt.interval", "0", "--trainer.optim.lr", "1e-2"),
        *("--trainer.optim.schedule.decay", "constant"),
    )
    history = run_sft(config)
    assert len(history) == 12
    assert history[-1]["loss"] < 0.8 * history[0]["loss"]
    final = tmp_path / "learn" / "final"
    exported = json.loads((final / "config.json").read_text())
    assert exported["num_hidden_layers"] == 2 and exported["eos_token_id"] == 257  # byte EOS
    assert (final / "generation_config.json").is_file()
    assert "model.embed_tokens.weight" in load_file(final / "model.safetensors")
    lines = (tmp_path / "learn" / "sft_metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 13))


def test_starting_over_existing_checkpoints_needs_resume(tmp_path: Path) -> None:
    run_sft(make_config(tmp_path, "again", "--sft.steps", "2"))
    with pytest.raises(ConfigError, match="pass --resume"):
        run_sft(make_config(tmp_path, "again", "--sft.steps", "2"))


def tidal_sft(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidal.cli", "sft", *argv],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.slow
def test_four_steps_equal_two_steps_then_kill_then_resume_two_steps(tmp_path: Path) -> None:
    """The issue's exactness bar, with real processes: a killed run resumed with --resume."""
    config = make_config(tmp_path, "straight")
    args = ["@", str(tmp_path / "sft.toml"), "--sft.data.path", str(config.sft.data.path)]
    args += ["--run.output_dir", str(tmp_path)]
    assert len(run_sft(config)) == 4  # four steps straight, in this process

    # Train three steps (checkpoint at step 2), then stay alive until SIGKILL.
    victim = subprocess.Popen(
        [sys.executable, __file__, *args, "--run.name", "killed"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert victim.stdout is not None
    line = victim.stdout.readline()
    assert line.strip() == "READY", victim.stderr.read() if victim.stderr else line
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=30) == -signal.SIGKILL
    assert not (tmp_path / "killed" / "final").exists()

    resumed = tidal_sft(*args, "--run.name", "killed", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr + resumed.stdout

    a = load_file(tmp_path / "straight" / "final" / "model.safetensors")
    b = load_file(tmp_path / "killed" / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a), "resumed weights differ"
    steps = [json.loads(x)["step"] for x in (tmp_path / "killed" / "sft_metrics.jsonl").open()]
    assert steps == [1, 2, 3, 4]  # killed: 1-3; resumed from 2: 3 again (one line), 4


if __name__ == "__main__":  # the process the slow test kills after three steps
    run_config, _ = load_config(SftRunConfig, sys.argv[1:])
    run_sft(run_config, max_steps=3)
    print("READY", flush=True)
    signal.pause()  # alive, with checkpoint step 2 and step 3's line on disk, until SIGKILL


ROOT = Path(__file__).resolve().parents[3]
RUN_FILE = ["@", str(ROOT / "configs" / "default.toml"), "--sft.data.path", "data.jsonl"]


def test_the_rl_run_file_drives_sft_carrying_the_sections_sft_does_not_read() -> None:
    argv = [*RUN_FILE, "--deployment.num-infer-gpus", "1", "--sft.steps", "3"]
    config, _ = load_config(SftRunConfig, argv, environ={})
    assert config.sft.steps == 3 and config.sft.data.path == Path("data.jsonl")
    assert config.orchestrator is not None and "task" in config.orchestrator
    assert config.deployment == {"num_infer_gpus": 1}


@pytest.mark.parametrize(
    ("flag", "suggestion"),
    [("--sft.stepz", "sft.steps"), ("--trainer.optim.lrr", "trainer.optim.lr"), ("--sfft", "sft")],
)
def test_an_unknown_key_sft_would_read_names_the_closest(flag: str, suggestion: str) -> None:
    with pytest.raises(ConfigError, match=f"did you mean '{suggestion}'"):
        load_config(SftRunConfig, [*RUN_FILE, flag, "3"], environ={})
