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
    torch.testing.assert_close(sharded["logits"], reference["logits"], atol=1e-5, rtol=0)
    for name, expected in reference["grads"].items():
        torch.testing.assert_close(
            sharded["grads"][name], expected, atol=1e-6, rtol=0, msg=f"grad {name}"
        )
