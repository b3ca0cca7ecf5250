"""`tidal rl` with LoRA on: versions after 0 travel as adapters and the replica serves each.

The run uses the default publish mode of a LoRA run (adapters). The tiny randomly
initialized default model does not learn the task through adapters alone (docs/memory.md),
so this checks the weight flow, not the reward: every version after 0 is a small
"lora-adapters" version on base 0, the replica loads every one of them and refuses none,
and generation follows the new versions within the staleness bound.
"""

from __future__ import annotations

import json

import pytest

from tidal.orchestrator.config import StalenessConfig
from tidal.orchestrator.records.run_log import run_log_records

WARMUP, STEPS = 2, 6
TOTAL = WARMUP + STEPS


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_lora_run_publishes_adapters_that_the_replica_serves(launch) -> None:  # type: ignore[no-untyped-def]
    run = launch(
        "--trainer.model.lora.rank",
        "8",
        "--orchestrator.warmup-steps",
        str(WARMUP),
        "--orchestrator.steps",
        str(STEPS),
        "--orchestrator.report.table-every",
        "0",
        "--grpc.shutdown-grace-s",
        "0.5",
    )
    assert run.process.wait(timeout=180) == 0, run.output()

    manifests = {
        int(folder.name[1:]): json.loads((folder / "manifest.json").read_text())
        for folder in (run.run_dir / "weights").glob("v*")
    }
    assert 0 in manifests and TOTAL in manifests  # retention kept the base
    base_bytes = sum(f["size"] for f in manifests[0]["files"])
    assert manifests[0]["format"] == "safetensors"
    for version, manifest in manifests.items():
        if version > 0:
            assert (manifest["format"], manifest["base_version"]) == ("lora-adapters", 0)
            assert sum(f["size"] for f in manifest["files"]) < base_bytes / 5

    log = (run.run_dir / "logs" / "inference.log").read_text()
    assert "skipping" not in log  # no adapter version was refused
    assert "fetching base version 0" in log
    # Every version may not be loaded (one superseded while queued is passed over), but
    # the last one is, and it is an adapter version.
    assert f"loaded version {TOTAL} (step {TOTAL})" in log

    records = run_log_records(run.run_dir / "metrics.jsonl")
    rl = [r for r in records if r["phase"] == "rl"]
    assert len(rl) == STEPS
    bound = StalenessConfig().bound
    assert all(r["staleness/max"] <= bound for r in rl)
