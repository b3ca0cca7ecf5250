"""A reward from a Hugging Face sequence-classification folder built here (random weights
from a tiny Llama config, the Qwen3-style test tokenizer and its chat template).

The orchestrator's side runs in a fresh torch-free interpreter, as in the service: the
worker it forks loads the folder, and the rewards must equal a plain `transformers`
forward of each input alone (sigmoid of the one logit, or the softmax probability of the
named label), batched with padding or not. A label the model lacks is a ConfigError."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ....hf_folders import write_tokenizer

COMPLETIONS = ["cba", "a much longer completion that pads the others", "x"]

BUILD = """
import json, sys, torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, LlamaConfig
out = {}
for folder, vocab, labels in json.loads(sys.argv[1]):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48,
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        num_labels=len(labels), id2label=dict(enumerate(labels)),
        label2id={l: i for i, l in enumerate(labels)})
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    out[folder] = []
    for completion in json.loads(sys.argv[2]):
        turns = [{"role": "user", "content": "abc>"}, {"role": "assistant", "content": completion}]
        ids = tok(tok.apply_chat_template(turns, tokenize=False), return_tensors="pt")
        with torch.no_grad():
            logits = model(**ids).logits[0]
        out[folder].append(logits.tolist())
print(json.dumps(out))
"""

SCORE = """
import asyncio, json, sys
from tidal.common.errors import ConfigError
from tidal.orchestrator.scoring.scorers import build_model_rewards
from tidal.orchestrator.task_config import ReversalTaskConfig
from tidal.orchestrator.tasks import Problem

async def score(reward, completions):
    problem = Problem("abc>", "cba", task="reversal")
    outcomes = await reward.score(problem, completions)
    await reward.close()
    return [o.reward for o in outcomes], [o.counters for o in outcomes]

results = {}
for name, settings in json.loads(sys.argv[1]).items():
    task = ReversalTaskConfig(reward={"type": "reward_model", **settings})
    try:
        built = build_model_rewards([task], ["reversal"])["reversal"]
    except ConfigError as exc:
        results[name] = str(exc)
        continue
    results[name] = asyncio.run(score(built, json.loads(sys.argv[2])))
assert "torch" not in sys.modules, "the orchestrator's process imported torch"
print(json.dumps(results))
"""


def _run(script: str, *args: str) -> object:
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _folders(folders: dict[Path, list[str]]) -> list[list[list[float]]]:
    """Build each folder (one interpreter for all: its imports are most of the time) with
    its labels; per folder, the logits of each completion scored alone."""
    specs = [
        (str(path), write_tokenizer(path, "qwen3"), labels) for path, labels in folders.items()
    ]
    logits = _run(BUILD, json.dumps(specs), json.dumps(COMPLETIONS))
    assert isinstance(logits, dict)
    return [logits[str(path)] for path in folders]


def _sigmoid(x: float) -> float:
    import math

    return 1 / (1 + math.exp(-x))


def _softmax(xs: list[float], i: int) -> float:
    import math

    exps = [math.exp(x) for x in xs]
    return exps[i] / sum(exps)


@pytest.mark.slow
def test_rewards_are_the_models_scores_mapped_to_zero_one(tmp_path: Path) -> None:
    single, pair = _folders({tmp_path / "single": ["LABEL_0"], tmp_path / "pair": ["bad", "good"]})
    settings = {
        "sigmoid": {"path": str(tmp_path / "single"), "batch_size": 2},
        "good": {"path": str(tmp_path / "pair"), "label": "good"},
        "missing_label": {"path": str(tmp_path / "pair"), "label": "great"},
        "unnamed_label": {"path": str(tmp_path / "pair")},
    }
    results = _run(SCORE, json.dumps(settings), json.dumps(COMPLETIONS))
    assert isinstance(results, dict)
    rewards, counters = results["sigmoid"]
    assert rewards == pytest.approx([_sigmoid(x[0]) for x in single], abs=1e-5)
    assert all(0.0 <= r <= 1.0 for r in rewards)
    assert [c["reward_model/inputs"] for c in counters] == [1.0] * len(COMPLETIONS)
    rewards, _ = results["good"]
    assert rewards == pytest.approx([_softmax(x, 1) for x in pair], abs=1e-5)
    assert "'great' is not one of ['bad', 'good']" in results["missing_label"]
    assert "name the one" in results["unnamed_label"]
