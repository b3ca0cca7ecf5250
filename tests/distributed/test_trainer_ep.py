"""The real `Trainer` with expert parallelism (ep = 2 over 2 gloo ranks, each holding half
of a tiny Qwen3-MoE's experts; and 4 ranks as two HSDP replicas of ep = 2) trains exactly
like one process: gradients, the loss with its load-balancing term, per-expert load
metrics, AdamW-updated weights, and a DCP checkpoint that resumes at world size 1."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
# fp32. Differences come only from summation order (an expert on rank 0 sums both ranks'
# tokens in one matmul; one process sums micro-batch after micro-batch): ~1e-10 in the
# gradients, ~2e-7 in the weights after AdamW's division by sqrt(v).
TOL = 1e-6
MODES = ("ep", "ep-hsdp")


@pytest.fixture(scope="module")
def runs(worker, tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[no-untyped-def,type-arg]
    out = tmp_path_factory.mktemp("trainer_ep")
    ckpt = str(out / "ckpt")
    worker("trainer_ep.py", "--mode", "ranks", "--ckpt", ckpt, "--out", str(out / "ep.pt"))
    hsdp = ["--mode", "ranks", "--ckpt", str(out / "ckpt4"), "--out", str(out / "hsdp.pt")]
    worker("trainer_ep.py", *hsdp, nproc=4)
    worker("trainer_ep.py", "--mode", "single", "--ckpt", ckpt, "--out", str(out / "s.pt"), nproc=1)
    return {
        "ep": torch.load(out / "ep.pt"),
        "ep-hsdp": torch.load(out / "hsdp.pt"),
        "single": torch.load(out / "s.pt"),
    }


def assert_close_all(got: dict, expected: dict, what: str) -> None:  # type: ignore[type-arg]
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=TOL, rtol=0, msg=f"{what} {name}")


@pytest.mark.parametrize("mode", MODES)
def test_gradients_equal_one_process_including_every_expert(runs: dict, mode: str) -> None:  # type: ignore[type-arg]
    got, expected = runs[mode]["first"]["grads"], runs["single"]["first"]["grads"]
    assert any(".experts." in name for name in expected)
    assert_close_all(got, expected, "grad")
    experts = [n for n in expected if ".experts." in n]
    assert all(expected[n].abs().max() > 0 for n in experts), "every expert saw tokens"


@pytest.mark.parametrize("mode", MODES)
def test_loss_aux_loss_and_expert_load_equal_one_process(runs: dict, mode: str) -> None:  # type: ignore[type-arg]
    got, expected = runs[mode]["first"]["sums"], runs["single"]["first"]["sums"]
    assert expected["aux_loss"] > 0
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=TOL), key


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("step", [1, 2])
def test_updated_weights_and_step_metrics_equal_one_process(
    runs: dict, mode: str, step: int
) -> None:  # type: ignore[type-arg]
    assert_close_all(runs[mode]["published"][step], runs["single"]["published"][step], "param")
    got, expected = runs[mode]["metrics"][step - 1], runs["single"]["metrics"][step - 1]
    for key in ("loss", "grad_norm", "aux_loss", "expert_load_max", "expert_load_min"):
        assert got[key] == pytest.approx(expected[key], abs=TOL), key


def test_expert_parallel_checkpoint_resumes_at_one_process(runs: dict) -> None:  # type: ignore[type-arg]
    restored = runs["single"]["restored"]
    assert restored["step"] == 2
    assert_close_all(restored["params"], runs["ep"]["published"][2], "restored")
