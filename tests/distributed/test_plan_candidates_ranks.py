"""Every lever combination `tidal plan --fit` can answer at world size 2 (the planner's own
search space, `fit.candidates`) builds the real trainer on 2 gloo ranks and trains a step
like the plain FSDP trainer (fp32): no recommended combination crashes at more than one
rank, as optimizer offload and activation offloading once did."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import torch

from tidal.cli.config import RunConfig
from tidal.common.config.loading import load_config
from tidal.trainer.memory_planner.estimate import Workload
from tidal.trainer.memory_planner.fit import candidates
from tidal.trainer.memory_planner.levers import Levers

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
DEFAULT = Path(__file__).resolve().parents[2] / "configs" / "default.toml"
# The levers change where tensors live or when they are recomputed, not the arithmetic of
# the step (the chunked head reorders the log-softmax's sums: the lever tests' 1e-5 bound).
TOL = 1e-5


@pytest.fixture(scope="module")
def results(worker, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    out = tmp_path_factory.mktemp("plan_candidates") / "runs.pt"
    worker("plan_candidates.py", "--out", str(out))
    return torch.load(out)  # type: ignore[no-any-return]


def expected_candidates() -> list[Levers]:
    levers = Levers.from_config(load_config(RunConfig, ["@", str(DEFAULT)], environ={})[0].trainer)
    found: list[Levers] = []
    for device in typing.get_args(typing.get_type_hints(Workload)["device"]):
        found += [c for c in candidates(levers, Workload(64, 2, device)) if c not in found]
    return found


def test_every_two_rank_candidate_trained_a_step(results: list[dict]) -> None:  # type: ignore[type-arg]
    assert [r["levers"] for r in results] == [c.names() for c in expected_candidates()]
    assert results[0]["levers"] == ["none"]
    assert {n for r in results for n in r["levers"]} >= {
        "FSDP CPU offload",
        "activation offloading",
        "optimizer offload (cpu)",
        "optimizer offload (disk)",
    }
    assert all(r["skipped"] == 0.0 for r in results)


def test_every_two_rank_candidate_trains_like_no_lever(results: list[dict]) -> None:  # type: ignore[type-arg]
    plain = results[0]
    for r in results:
        assert r["loss"] == pytest.approx(plain["loss"], abs=TOL), r["levers"]
        assert r["grad_norm"] == pytest.approx(plain["grad_norm"], abs=TOL), r["levers"]
        assert r["weight_drift"] <= TOL, r["levers"]
