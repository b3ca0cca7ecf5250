"""Build and load paged_decode.cpp, the CPU decode-attention kernel, for this CPU.

The kernel is compiled once per CPU and source into a shared library cached on disk
(`TIDAL_KERNEL_CACHE`, else `~/.cache/tidal/kernels`), named by a hash of its source, its
flags, the compiler's version and the CPU's feature flags, so a build for one CPU is never
loaded on another (a home folder shared across a cluster) nor by a process capped to
AVX2 (`ATEN_CPU_CAPABILITY=avx2`). It is called through ctypes, which releases the GIL
for the call. A plain C ABI instead of a torch extension: the source includes no torch
header, so it builds in seconds with any C++17 compiler and does not follow torch's ABI.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("paged_decode.cpp")
CACHE_ENV = "TIDAL_KERNEL_CACHE"
"""Folder of compiled kernels; default `~/.cache/tidal/kernels`."""
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
"""Cache dtypes the kernel computes from, as its `dtype` argument says them."""

_BASE_FLAGS = [
    "-O3",
    "-std=c++17",
    "-shared",
    "-fPIC",
    "-fopenmp-simd",  # the `omp simd` reductions, no OpenMP runtime
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffp-contract=fast",  # multiply-adds as FMA where the CPU has it
]


def target_flags() -> list[str]:
    """Instruction-set flags for what torch may use here: the whole CPU at AVX-512, the
    x86-64-v3 level (AVX2, FMA) when capped to AVX2, the baseline below it."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return []
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        return ["-march=native"]
    if capability == "AVX2":
        return ["-march=x86-64-v3"]
    return ["-march=x86-64"]


def _cpu_flags() -> str:
    """The CPU's feature flags as the kernel reports them (x86 Linux), else the machine."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.machine()


def _compiler() -> str:
    return os.environ.get("CXX", "g++")


def _cache_dir() -> Path:
    """`TIDAL_KERNEL_CACHE`, else `~/.cache/tidal/kernels`; a per-user temporary folder
    where there is no writable home (a container's user)."""
    try:
        chosen = os.environ.get(CACHE_ENV)
        folder = Path(chosen) if chosen else Path.home() / ".cache" / "tidal" / "kernels"
        folder.mkdir(parents=True, exist_ok=True)
    except (OSError, RuntimeError):  # RuntimeError: Path.home() found no home
        folder = Path(tempfile.gettempdir()) / f"tidal-kernels-{os.getuid()}"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        owner = folder.stat()
        if owner.st_uid != os.getuid() or owner.st_mode & 0o022:  # a library planted there
            raise RuntimeError(f"{folder} is not this user's alone; set {CACHE_ENV}") from None
    return folder


def build() -> Path:
    """The compiled library's path, compiling it first if no cached build matches.

    Raises RuntimeError with the compiler's first error line when compiling fails (no
    compiler, an unsupported flag)."""
    compiler = _compiler()
    flags = [*_BASE_FLAGS, *target_flags()]
    try:
        version = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=60, check=True
        ).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as exc:
        raise RuntimeError(f"no working C++ compiler {compiler!r} ({exc})") from exc
    key = hashlib.sha256(
        "\0".join([SOURCE.read_text(), *flags, version, _cpu_flags()]).encode()
    ).hexdigest()[:20]
    target = _cache_dir() / f"paged_decode-{key}.so"
    if target.exists():
        return target
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    done = subprocess.run(
        [compiler, *flags, "-o", str(partial), str(SOURCE)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr[:200])
        raise RuntimeError(f"compiling {SOURCE.name} failed: {first.strip()}")
    os.replace(partial, target)  # whole or absent: a concurrent build writes its own copy
    return target


class PagedDecodeLibrary:
    """The loaded kernel: `attend` fills `out` from q and one layer's cache."""

    def __init__(self, path: Path) -> None:
        self._fn = ctypes.CDLL(str(path)).tidal_paged_decode
        pointer, size = ctypes.c_void_p, ctypes.c_int64
        self._fn.argtypes = [ctypes.c_int, *[pointer] * 4, size, pointer, *[size] * 5, pointer]
        self._fn.restype = ctypes.c_int

    def attend(
        self,
        q: torch.Tensor,  # (B, H, 1, D) contiguous
        keys: torch.Tensor,  # (NB, Hkv, D, BS) contiguous
        values: torch.Tensor,  # (NB * BS, Hkv, D) contiguous
        table: torch.Tensor,  # (B, W) int64 contiguous
        positions: torch.Tensor,  # (B,) int64 contiguous
    ) -> torch.Tensor:  # (B, H, 1, D) in q's dtype
        batch, heads, _, head_dim = q.shape
        _, kv_heads, _, block_size = keys.shape
        out = torch.empty_like(q)
        failed = self._fn(
            DTYPE_CODES[q.dtype],
            q.data_ptr(),
            keys.data_ptr(),
            values.data_ptr(),
            table.data_ptr(),
            table.shape[1],
            positions.data_ptr(),
            batch,
            heads,
            kv_heads,
            head_dim,
            block_size,
            out.data_ptr(),
        )
        if failed:
            raise ValueError(
                f"paged decode refused dtype {q.dtype} or {heads} heads over {kv_heads}"
            )
        return out
