"""What this machine's CPU computes natively: the one probe every bf16 kernel choice reads.

"Native bf16" means oneDNN's bf16 kernels run here on bf16 hardware (on x86, AVX512-BF16
or AMX). Without it bf16 matmuls fall back to a reference loop, or to oneDNN's emulation
on plain AVX-512 (costlier than fp32), so the trainer warns on a bf16 request and
inference computes its linears in fp32. The probe runs the kernel rather than trusting
torch's hardware flags alone, which ignore an `ONEDNN_MAX_CPU_ISA` cap.
`TIDAL_CPU_BF16=fallback` forces the no-native path everywhere (an environment variable,
so it reaches every process and rank). Cached per process; torch is imported lazily, for
torch-free importers. Compiled kernels depend on the CPU too: `inductor_cache_per_isa`
keeps Inductor's disk cache apart per capability.
"""

from __future__ import annotations

import functools
import os
import platform
import time
from dataclasses import dataclass

FORCE_ENV = "TIDAL_CPU_BF16"
"""`auto` (default): probe; `fallback`: act as if the CPU had no native bf16."""

_ISA_CAP_ENV = "ONEDNN_MAX_CPU_ISA"
# oneDNN ISA names below which its bf16 kernels do not exist (see oneDNN's dnnl_cpu_isa_t).
_NO_BF16_ISAS = {"sse41", "avx", "avx2", "avx2_vnni", "avx512_core", "avx512_core_vnni"}


@dataclass(frozen=True)
class Bf16Support:
    native: bool
    """oneDNN's bf16 kernels run on this CPU (bf16 matmul at least as fast as fp32)."""
    reason: str
    """Why, in words for a log line: what was found or what forced it."""


@functools.cache
def bf16_support() -> Bf16Support:
    """Whether bf16 compute on this CPU runs oneDNN's native kernels (probed once)."""
    forced = os.environ.get(FORCE_ENV, "auto").strip().lower()
    if forced not in ("auto", "fallback"):
        raise ValueError(f"{FORCE_ENV}={forced!r}: use 'auto' (probe the CPU) or 'fallback'")
    if forced == "fallback":
        return Bf16Support(False, f"forced by {FORCE_ENV}=fallback")
    cap = os.environ.get(_ISA_CAP_ENV, "").strip().lower()
    if cap in _NO_BF16_ISAS:
        return Bf16Support(False, f"oneDNN capped below bf16 by {_ISA_CAP_ENV}={cap}")
    import torch

    if not torch.backends.mkldnn.is_available():
        return Bf16Support(False, "torch built without oneDNN")
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return Bf16Support(False, "CPU lacks avx512bw/vl/dq and avx_ne_convert")
    if _x86() and not (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()):
        # oneDNN runs its bf16 kernels on plain AVX-512 too, by emulation, slower
        # than fp32 there. torch's own flags (private, no public equivalent) tell it apart.
        return Bf16Support(False, "CPU lacks avx512_bf16 and AMX: oneDNN only emulates bf16")
    try:  # the kernel itself, as the inference engine will call it
        ones = torch.ones(16, 16, dtype=torch.bfloat16)
        weight = torch.ops.mkldnn._reorder_linear_weight(ones, 1)
        torch.ops.mkldnn._linear_pointwise(ones[:1], weight, None, "none", [], "")
    except RuntimeError as exc:
        return Bf16Support(False, f"oneDNN bf16 kernel refused: {str(exc).splitlines()[0]}")
    return Bf16Support(True, f"oneDNN bf16 kernels run ({torch.backends.cpu.get_cpu_capability()})")


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


def bf16_matmul_slowdown(n: int = 256, seconds: float = 0.02) -> float:
    """fp32 matmul throughput over bf16's on this CPU, measured now (`n`² products).

    Interleaved rounds, best of each, so a busy neighbour hits both dtypes alike.
    """
    import torch

    def rate(dtype: torch.dtype) -> float:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        torch.mm(a, b)  # warm-up: first calls pick and JIT kernels
        calls, started = 0, time.perf_counter()
        while calls == 0 or time.perf_counter() - started < seconds:
            torch.mm(a, b)
            calls += 1
        return calls / (time.perf_counter() - started)

    fp32, bf16 = 0.0, 0.0
    for _ in range(2):
        fp32, bf16 = max(fp32, rate(torch.float32)), max(bf16, rate(torch.bfloat16))
    return fp32 / bf16


def bf16_cost_warning(setting: str) -> str | None:
    """A warning for a bf16 request on a CPU without native bf16, with the measured cost."""
    support = bf16_support()
    if support.native:
        return None
    return (
        f"{setting} asks for bf16, but this CPU has no native bf16 ({support.reason}): "
        f"a bf16 matmul measured {bf16_matmul_slowdown():.0f}x slower than fp32 here; "
        "use fp32 on this machine"
    )


def inductor_cache_per_isa() -> None:
    """Point Inductor's on-disk cache at a folder of this process's CPU capability, unless
    the user chose one (`TORCHINDUCTOR_CACHE_DIR`). Inductor names a compiled CPU kernel by
    its source, which is the same for every vector width, so a kernel built for AVX-512
    would be loaded, and compute garbage, by a process capped to AVX2
    (`ATEN_CPU_CAPABILITY=avx2`). Every compiling service calls this before compiling."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return
    import torch
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    isa = torch.backends.cpu.get_cpu_capability().lower()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(default_cache_dir(), f"tidal-{isa}")
