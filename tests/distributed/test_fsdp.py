"""FSDP2, HSDP and FSDP with CPU offload over 2 gloo processes train exactly like one
process on the same global batch (gradients and AdamW-updated parameters, fp32)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
# fp32; the only difference is where the batch's sums split (two rank halves joined by a
# reduce-scatter/all-reduce): pairwise-sum error ~log2(n)·2^-24 ≈ 6e-7 relative for the
# ~10^3-term gradient sums of this tiny model, whatever the CPU's vector width; a
# mis-sharded or doubly-reduced gradient is off by a factor, not by ulps.
TOL = 1e-6
MODES = ("fsdp", "hsdp", "fsdp-offload")


@pytest.fixture(scope="module")
def runs(worker, tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[no-untyped-def,type-arg]
    """The single-process reference and every sharded mode (one two-rank job for all)."""
    out = tmp_path_factory.mktemp("fsdp")
    worker("fsdp_step.py", "--modes", "single", "--out", str(out / "ref.pt"), nproc=1)
    worker("fsdp_step.py", "--modes", ",".join(MODES), "--out", str(out / "sharded.pt"))
    return {**torch.load(out / "ref.pt"), **torch.load(out / "sharded.pt")}


@pytest.mark.parametrize("mode", MODES)
def test_sharded_grads_and_params_equal_single_process(runs: dict, mode: str) -> None:  # type: ignore[type-arg]
    reference, sharded = runs["single"], runs[mode]
    for kind in ("grads", "params"):
        assert sharded[kind].keys() == reference[kind].keys()
        for name, expected in reference[kind].items():
            torch.testing.assert_close(
                sharded[kind][name], expected, atol=TOL, rtol=0, msg=f"{kind} {name}"
            )
