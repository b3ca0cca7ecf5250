"""What every benchmark shares: machine facts, timing, the table and the JSON file.

Decisions:
- A benchmark is a script `bench/<name>.py` with a `main()`; `bench/run_all.py` runs each
  in its own process (so one benchmark's threads, allocator and compiled kernels do not
  colour the next). Each prints a rich table and writes `docs/benchmarks/<name>.json`
  with `machine`, `config`, `results` (rows) and `summary` (the figures issues quote).
- Times are medians of repeated runs, and comparisons are measured side by side in one
  process, because absolute times on shared machines drift.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "docs" / "benchmarks"


def machine_info() -> dict[str, Any]:
    """CPU, core count, memory, Python and torch versions (and the GPU, if any)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), ""
            )
        info["cpu"] = model
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
        wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_bf16", "avx_ne_convert")
        info["cpu_flags"] = [flag for flag in wanted if flag in flags]
        info["load_average_at_write"] = [round(x, 2) for x in os.getloadavg()]
        with open("/proc/meminfo") as f:
            kib = int(next(ln for ln in f if ln.startswith("MemTotal")).split()[1])
        info["memory_gib"] = round(kib / 2**20, 1)
    except (OSError, StopIteration):
        pass
    try:
        import torch

        from tidal.models.cpu_features import bf16_support

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        support = bf16_support()
        info["cpu_native_bf16"] = support.native
        info["cpu_bf16_reason"] = support.reason
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def median_seconds(fn: Callable[[], Any], *, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of `fn()` over `repeats` runs after `warmup` untimed runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def print_table(title: str, rows: Sequence[dict[str, Any]]) -> None:
    if not rows:
        return
    table = Table(title=title)
    columns = list(rows[0])
    for column in columns:
        table.add_column(column, justify="left" if column == columns[0] else "right")
    for row in rows:
        table.add_row(*(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row.values()))
    Console().print(table)


def write_result(
    name: str,
    *,
    config: dict[str, Any],
    results: Sequence[dict[str, Any]],
    summary: dict[str, Any],
) -> Path:
    """Write `docs/benchmarks/<name>.json` (or `$TIDAL_BENCH_DIR/<name>.json`)."""
    payload = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(),
        "config": config,
        "results": list(results),
        "summary": summary,
    }
    return store_result(payload, Path(os.environ.get("TIDAL_BENCH_DIR", RESULTS_DIR)))


def store_result(payload: dict[str, Any], out_dir: Path) -> Path:
    """Write `payload` as `<out_dir>/<benchmark>.json`.

    The result it replaces moves to the end of `<name>.history.json` (a JSON list, oldest
    first), so the current figures and every earlier run stay in one place per benchmark.
    """
    name = payload["benchmark"]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    if path.exists():
        history_path = out_dir / f"{name}.history.json"
        history = json.loads(history_path.read_text()) if history_path.exists() else []
        history.append(json.loads(path.read_text()))
        history_path.write_text(json.dumps(history, indent=1) + "\n")
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
