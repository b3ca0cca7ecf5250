"""The CPU probe: forced and capped paths, a real probe, and the measured-cost warning."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from tidal.models.cpu_features import (
    FORCE_ENV,
    bf16_cost_warning,
    bf16_support,
    inductor_cache_per_isa,
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
    """Native means oneDNN's bf16 prepack runs on bf16 hardware; otherwise the prepack
    raises, is capped, or runs by emulation on a CPU without bf16 instructions."""
    support = bf16_support()
    weight = torch.ones(8, 8, dtype=torch.bfloat16)
    if support.native:
        torch.ops.mkldnn._reorder_linear_weight(weight, 1)  # must not raise
    elif "emulates" in support.reason:
        assert not torch.cpu._is_avx512_bf16_supported()
        assert not torch.cpu._is_amx_tile_supported()
    elif "capped" not in support.reason:
        with pytest.raises(RuntimeError):
            torch.ops.mkldnn._reorder_linear_weight(weight, 1)


def test_a_cpu_without_bf16_instructions_is_not_native(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU whose oneDNN runs bf16 without bf16 instructions (plain AVX-512) is told apart."""
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("oneDNN has no bf16 kernels on this CPU at all")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    support = bf16_support()
    assert not support.native and "emulates" in support.reason


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


def test_inductor_caches_apart_per_cpu_capability_unless_the_user_chose_a_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    inductor_cache_per_isa()  # capability as torch reads it (ATEN_CPU_CAPABILITY at start)
    isa = torch.backends.cpu.get_cpu_capability().lower()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].endswith(f"{os.sep}tidal-{isa}")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/chosen")
    inductor_cache_per_isa()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/chosen"
