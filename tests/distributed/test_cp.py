"""Ring and Ulysses context parallelism over 2 gloo ranks equal full attention on a packed
row (three samples of unequal length): logits and gradients, fp32."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


@pytest.fixture(scope="module")
def results(worker, tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[no-untyped-def,type-arg]
    out = tmp_path_factory.mktemp("cp") / "cp.pt"
    worker("cp_attention.py", "--out", str(out))
    return torch.load(out)


@pytest.mark.parametrize("style", ["ring", "ulysses"])
def test_cp_equals_full_attention_on_packed_row(results: dict, style: str) -> None:  # type: ignore[type-arg]
    reference, sharded = results["reference"], results[style]
    # fp32. Each attention row is summed in blocks (ring: per-rank softmax partials merged
    # through exp rescales; Ulysses: heads re-laid): a few ulps (2^-24 ≈ 6e-8) relative per
    # merge on O(1-10) logits, so 1e-5 absolute; a wrong causal or sample mask changes which
    # keys a query sees, an O(0.1-1) change. Gradients are O(1e-2-1e-1): 1e-6 absolute.
    torch.testing.assert_close(sharded["logits"], reference["logits"], atol=1e-5, rtol=0)
    for name, expected in reference["grads"].items():
        torch.testing.assert_close(
            sharded["grads"][name], expected, atol=1e-6, rtol=0, msg=f"grad {name}"
        )
