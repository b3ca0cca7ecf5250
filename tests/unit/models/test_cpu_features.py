"""The CPU probe: forced and capped paths, a real probe, and the measured-cost warning."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tidal.models.cpu_features import (
    FORCE_ENV,
    bf16_cost_warning,
    bf16_support,
)


@pytest.fixture(autouse=True)
def fresh_probe(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(FORCE_ENV, raising=False)
    bf16_support.cache_clear()
    yield
    bf16_support.cache_clear()


def test_forcing_the_fallback_wins_over_the_hardware(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FORCE_ENV, "fallback")
    support = bf16_support()
    assert not support.native and FORCE_ENV in support.reason


def test_an_onednn_isa_cap_below_bf16_means_no_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # how tests cap an AVX-512 machine
    support = bf16_support()
    assert not support.native and "ONEDNN_MAX_CPU_ISA=avx2" in support.reason


def test_an_unknown_forcing_value_is_an_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FORCE_ENV, "yes")
    with pytest.raises(ValueError, match=f"{FORCE_ENV}='yes'.*'auto'.*'fallback'"):
        bf16_support()


def test_the_probe_agrees_with_what_the_kernel_does_on_this_machine() -> None:
    """Native means oneDNN's bf16 prepack runs; no native means it raises or is capped."""
    support = bf16_support()
    weight = torch.ones(8, 8, dtype=torch.bfloat16)
    if support.native:
        torch.ops.mkldnn._reorder_linear_weight(weight, 1)  # must not raise
    elif "capped" not in support.reason:
        with pytest.raises(RuntimeError):
            torch.ops.mkldnn._reorder_linear_weight(weight, 1)


def test_the_warning_states_the_measured_slowdown_only_without_native_bf16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if bf16_support().native:
        assert bf16_cost_warning("trainer.precision") is None
    monkeypatch.setenv(FORCE_ENV, "fallback")
    bf16_support.cache_clear()
    warning = bf16_cost_warning("trainer.precision = 'bf16'")
    assert warning is not None
    assert warning.startswith("trainer.precision = 'bf16' asks for bf16")
    assert "x slower than fp32" in warning and "use fp32" in warning
