"""Optimizer-state offload (host memory and disk) under FSDP2 on 2 gloo ranks: each rank
keeps only its own shard's AdamW states, trains exactly like one process, and its DCP
checkpoint resumes at two ranks and at one."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
OFFLOADS = ("cpu", "disk")
# Why 1e-6 holds (fp32, unit roundoff u = 2^-24 ≈ 6e-8): both runs compute every
# micro-batch's forward and backward on bitwise-equal weights (FSDP's fp32 all-gather
# copies, it does not round), so they differ only in the order of three reductions:
# - the step loss and the gradients: a sum over the step's 3 micro-batches, in another
#   grouping on 2 ranks; the error of a 3-term fp32 sum is at most 2u relative (1.2e-7),
#   i.e. ~1e-8 on a loss of ~0.1;
# - the gradient norm: a sum of squares over the ~27k gradient elements, per shard and
#   then over ranks instead of per parameter; torch sums in blocked/pairwise order, so
#   the relative error is about log2(27k)·u ≈ 15u ≈ 1e-6 at worst, ≤ 5e-7 on a norm of
#   ~0.5 (it is below max_grad_norm, so it scales nothing);
# - the weights: AdamW moves each weight by lr·m/(√v + eps), in which a relative gradient
#   error δ cancels to first order (m and √v scale alike), so they differ by ≪ lr·δ.
# Measured: weights bitwise equal, loss within 1e-8, grad norm within 6e-8. A wrong or
# missing shard update moves weights by ~lr = 1e-2.
TOL = 1e-6


@pytest.fixture(scope="module")
def runs(worker, tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[no-untyped-def,type-arg]
    out = tmp_path_factory.mktemp("optim_state_offload_ranks")
    ckpt, kinds = str(out / "ckpt"), ",".join(OFFLOADS)
    worker("optim_state_offload_ranks.py", "--mode", "ranks", "--offloads", kinds,
           "--ckpt", ckpt, "--out", str(out / "ranks.pt"))  # fmt: skip
    worker("optim_state_offload_ranks.py", "--mode", "single", "--offloads", f"none,{kinds}",
           "--ckpt", ckpt, "--out", str(out / "single.pt"), nproc=1)  # fmt: skip
    return {"ranks": torch.load(out / "ranks.pt"), "single": torch.load(out / "single.pt")}


def assert_same_weights(got: dict, expected: dict, atol: float) -> None:  # type: ignore[type-arg]
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=atol, rtol=0, msg=name)


@pytest.mark.parametrize("reference", ["same offload", "torch AdamW"])
@pytest.mark.parametrize("offload", OFFLOADS)
@pytest.mark.parametrize("step", [1, 2, 3])
def test_two_ranks_with_offloaded_states_publish_the_weights_one_process_trains(
    runs: dict,  # type: ignore[type-arg]
    offload: str,
    reference: str,
    step: int,
) -> None:
    single = runs["single"][offload if reference == "same offload" else "none"]
    assert_same_weights(runs["ranks"][offload]["published"][step], single["published"][step], TOL)


@pytest.mark.parametrize("offload", OFFLOADS)
def test_step_loss_and_grad_norm_equal_one_process(runs: dict, offload: str) -> None:  # type: ignore[type-arg]
    got, expected = runs["ranks"][offload]["metrics"], runs["single"][offload]["metrics"]
    assert len(got) == len(expected) == 3
    for g, e in zip(got, expected, strict=True):
        for key in ("loss", "grad_norm"):
            assert g[key] == pytest.approx(e[key], abs=TOL), key


@pytest.mark.parametrize("offload", OFFLOADS)
def test_each_rank_stores_only_its_own_shard(runs: dict, offload: str) -> None:  # type: ignore[type-arg]
    stores, single = runs["ranks"][offload]["stores"], runs["single"][offload]["store"]
    assert sum(s["elements"] for s in stores) == single["elements"]  # the shards, no overlap
    assert all(0 < s["elements"] < single["elements"] for s in stores)
    assert all(s["capacity"] < single["capacity"] for s in stores)  # not the whole model
    if offload == "disk":  # one folder per rank, never a file two ranks map
        folders = [{f.rsplit("/", 2)[-2] for f in s["files"]} for s in stores]
        assert folders == [{"rank-0"}, {"rank-1"}]


@pytest.mark.parametrize("offload", OFFLOADS)
def test_offloaded_checkpoint_resumes_at_two_ranks(runs: dict, offload: str) -> None:  # type: ignore[type-arg]
    ranks = runs["ranks"][offload]
    # Restored after step 2, step 3 again: the states came back (a fresh AdamW would not
    # give step 3's weights: its first step moves every weight by ~lr).
    assert_same_weights(ranks["resumed"], ranks["published"][3], TOL)


@pytest.mark.parametrize("offload", OFFLOADS)
def test_offloaded_checkpoint_saved_at_two_ranks_resumes_at_one(runs: dict, offload: str) -> None:  # type: ignore[type-arg]
    resumed = runs["single"][offload]["resumed_at_one"]
    assert_same_weights(resumed, runs["ranks"][offload]["published"][3], TOL)
