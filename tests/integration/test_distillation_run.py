"""On-policy distillation end to end: `tidal rl` serves SmolLM2-135M-Instruct (the real
pretrained teacher, tests/smollm2.py) in a teacher inference process of its own and
distills a student of the default tiny size built with the teacher's tokenizer. Every step
the teacher scores each sampled token, the student trains on the per-token reverse-KL
advantages (pure distillation), and the step reports the reverse KL to the teacher and the
teacher's call time. A few steps on 2 cores; the falling curve is bench/distill.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidal.orchestrator.records.run_log import run_log_records

from ..smollm2 import smollm2_folder

__all__ = ["smollm2_folder"]

STEPS = 3


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_tiny_student_is_distilled_from_smollm2_with_per_token_advantages(
    launch,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    smollm2_folder: Path,
) -> None:
    sums = tmp_path / "sums.jsonl"
    sums.write_text(
        "".join(
            json.dumps({"prompt": f"What is {a}+{a}?", "answer": rf"(?s).*\b{2 * a}\b.*"}) + "\n"
            for a in range(10)
        )
    )
    run = launch(
        "--run.tokenizer", str(smollm2_folder), "--trainer.model.vocab-size", "49152",
        "--orchestrator.task.type", "dataset", "--orchestrator.task.path", str(sums),
        "--orchestrator.task.verifier", "regex",
        "--orchestrator.distill.model-path", str(smollm2_folder),
        "--orchestrator.steps", str(STEPS), "--orchestrator.warmup-steps", "0",
        "--orchestrator.prompts-per-step", "2", "--orchestrator.group-size", "2",
        "--orchestrator.sampling.max-tokens", "4", "--trainer.optim.lr", "2e-3",
        "--orchestrator.report.table-every", "0", "--grpc.shutdown-grace-s", "0.5",
    )  # fmt: skip
    assert run.process.wait(timeout=840) == 0, run.output()

    config = run.wait_for_config()
    assert config["orchestrator"]["distill"]["address"].startswith("127.0.0.1:")
    teacher_log = (run.run_dir / "logs" / "teacher.log").read_text()
    assert "llama-30x576" in teacher_log, teacher_log[-2000:]
    records = run_log_records(run.run_dir / "metrics.jsonl")
    rl = [r for r in records if r["phase"] == "rl"]
    assert len(rl) == STEPS
    for r in rl:
        # a random student's tokens are far less likely under the teacher than under itself
        assert r["distill/reverse_kl"] > 1.0
        assert r["distill/teacher_s"] > 0 and r["distill/tokens"] >= 4
        assert r["advantage/mean"] == 0.0  # pure distillation: no reward term
        assert r["train/grad_norm"] > 0
