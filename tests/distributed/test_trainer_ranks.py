"""The real `Trainer` as 2 gloo ranks (rank 0 leading over the control group)
trains exactly like one process, as two data-parallel ranks or as one context-parallel
group (ring, Ulysses), and its DCP checkpoint resumes at world size 1."""

from __future__ import annotations

import pytest
import torch

# The module's fixture runs eight jobs inside its first case, whose clock it shares;
# on a loaded machine beside other workers that can pass the suite's 300 s per case.
pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(900)]
# Tolerances: fp32 unit roundoff is u = 2^-24 ≈ 6e-8, and the two sides of each comparison
# run the same arithmetic in another order, whose error depends on the CPU's vector width
# (AVX2 sums 8 lanes, AVX-512 16), so no bound may rest on one machine's rounding.
#
# Data parallelism splits each sum over the step's tokens (~10^2-10^3 terms) into two
# rank halves joined by one all-reduce: a pairwise-summed fp32 reduction of n terms errs
# by ~log2(n)·u ≈ 6e-7 relative, so 1e-6 absolute on O(0.1-1) weights and metrics is
# a few ulps of slack; a rank that drops or doubles a sample moves them by a whole
# sample's share of the step, orders of magnitude more.
TOL = 1e-6
# Context parallelism also splits every attention row: ring attention merges per-block
# softmax partials through exp(m_old - m_new) rescales, Ulysses re-lays heads, and every
# attention sum and its backward reorder. Measured worst: 2.0e-6 relative (grad_norm,
# ring, 2-core AVX2 EPYC); under 1e-6 absolute on AVX-512. 2e-5 relative (~300 u) keeps
# 10x over that, while a masking error changes the keys a query sees, an O(1) change of
# its output.
CP_METRIC_RTOL = 2e-5
# AdamW divides by sqrt(v): on near-zero gradients the fp32 rounding of a different sum
# order (ring/Ulysses attention) grows to ~3e-5 in the weights at lr 1e-2. A wrong mask
# or target alignment moves weights by ~lr.
CP_WEIGHT_TOL = 1e-4
CP_STYLES = ("ring", "ulysses")
METRICS = ("loss", "grad_norm", "entropy", "tokens", "loss_tokens")


@pytest.fixture(scope="module")
def runs(worker, tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[no-untyped-def,type-arg]
    out = tmp_path_factory.mktemp("trainer_ranks")
    ckpt = str(out / "ckpt")
    worker("trainer_ranks.py", "--mode", "ranks", "--ckpt", ckpt, "--out", str(out / "r.pt"))
    worker(
        "trainer_ranks.py", "--mode", "single", "--ckpt", ckpt, "--out", str(out / "s.pt"), nproc=1
    )
    runs = {"ranks": torch.load(out / "r.pt"), "single": torch.load(out / "s.pt")}
    for style in (*CP_STYLES, "hsdp"):
        target = out / f"{style}.pt"
        worker(
            "trainer_ranks.py", "--mode", "ranks", "--cp", style,
            "--ckpt", str(out / f"ckpt-{style}"), "--out", str(target),
        )  # fmt: skip
        runs[style] = torch.load(target)
    # the single run resumes from the checkpoint the 2-rank run saves, so it runs second
    for mode, cp in (("ranks", "none"), ("single", "none"), ("ranks", "ring")):
        target = out / f"op-{mode}-{cp}.pt"
        worker(
            "trainer_ranks.py", "--mode", mode, "--cp", cp, "--loss", "off-policy",
            "--ckpt", str(out / f"ckpt-op-{cp}"), "--out", str(target),
            **({"nproc": 1} if mode == "single" else {}),
        )  # fmt: skip
        runs[f"op-{mode}-{cp}"] = torch.load(target)
    return runs


def assert_same_weights(got: dict, expected: dict, atol: float) -> None:  # type: ignore[type-arg]
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=atol, rtol=0, msg=name)


@pytest.mark.parametrize("mode", ["ranks", "hsdp"])
@pytest.mark.parametrize("step", [1, 2, 3])
def test_two_ranks_publish_the_weights_one_process_trains(runs: dict, mode: str, step: int) -> None:  # type: ignore[type-arg]
    got, expected = runs[mode]["published"][step], runs["single"]["published"][step]
    assert_same_weights(got, expected, TOL)


def test_step_metrics_are_global(runs: dict) -> None:  # type: ignore[type-arg]
    for got, expected in zip(runs["ranks"]["metrics"], runs["single"]["metrics"], strict=True):
        for key in METRICS:
            assert got[key] == pytest.approx(expected[key], rel=0, abs=TOL), key


def test_checkpoint_saved_at_two_ranks_resumes_at_one_with_identical_parameters(
    runs: dict,  # type: ignore[type-arg]
) -> None:
    restored = runs["single"]["restored"]
    assert restored["step"] == 2
    assert_same_weights(restored["params"], runs["ranks"]["published"][2], atol=0)
    # Optimizer state came along: the next step matches the 2-rank job's step 3.
    assert_same_weights(restored["after_step_3"], runs["ranks"]["published"][3], TOL)


@pytest.mark.parametrize(("run", "tol"), [("op-ranks-none", TOL), ("op-ranks-ring", CP_WEIGHT_TOL)])
def test_off_policy_corrections_and_measures_match_one_process(
    runs: dict,  # type: ignore[type-arg]
    run: str,
    tol: float,
) -> None:
    single = runs["op-single-none"]
    measures = ("mismatch_kl", "stale_kl/1", "staleness_share/0", "correction/tis")
    for got, expected in zip(runs[run]["metrics"], single["metrics"], strict=True):
        for key in (*METRICS, *measures):
            if key in expected:
                assert got[key] == pytest.approx(expected[key], rel=CP_METRIC_RTOL, abs=1e-6), key
    second = single["metrics"][1]
    assert 0 < second["correction/tis"] < 1  # the correction is at work
    assert 0 < second["staleness_share/0"] < 1 and "stale_kl/1" in second
    for step in (1, 2, 3):
        assert_same_weights(runs[run]["published"][step], single["published"][step], tol)


@pytest.mark.parametrize("style", CP_STYLES)
def test_context_parallel_trainer_matches_one_process(runs: dict, style: str) -> None:  # type: ignore[type-arg]
    for got, expected in zip(runs[style]["metrics"], runs["single"]["metrics"], strict=True):
        for key in METRICS:
            assert got[key] == pytest.approx(expected[key], rel=CP_METRIC_RTOL, abs=0), key
    for step in (1, 2, 3):
        got, expected = runs[style]["published"][step], runs["single"]["published"][step]
        assert_same_weights(got, expected, CP_WEIGHT_TOL)
