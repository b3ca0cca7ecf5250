"""A run's start-up and shutdown seconds, and the summary table `tidal rl` prints last.

Start-up runs from the `tidal rl` process's kernel start time to the first step's start
(the orchestrator gets it as `TIDAL_LAUNCHED_AT`), shutdown from the last step's end to
every child's exit. The launcher prints the table once its children exited, so one table
holds both; an orchestrator run alone prints its own.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from tidal.common.errors import DiskFull
from tidal.common.files.durable import write_atomic

LAUNCHED_AT_ENV = "TIDAL_LAUNCHED_AT"
SUMMARY_FILE = "summary.json"
_IMPORTED_AT = time.time()


def process_start_time() -> float:
    """This process's start as Unix seconds: its kernel start time on Linux (10 ms
    resolution), else when this module was imported."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime: clock ticks after boot
        since_boot = ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED_AT


def launch_env(launched_at: float) -> dict[str, str]:
    """What every child is told: when the run was launched."""
    return {LAUNCHED_AT_ENV: repr(launched_at)}


def finish_summary(run_dir: Path, launched_at: float) -> dict[str, object] | None:
    """Add `shutdown_s` (from the last step's end to now) to this launch's summary.json
    and return it; None when the run wrote none (it failed) or it is another launch's."""
    path = run_dir / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if summary.get("launched_at") != launched_at or summary.get("last_step_ended_at") is None:
        return None
    summary["shutdown_s"] = time.time() - float(summary["last_step_ended_at"])
    try:
        write_atomic(path, json.dumps(summary, indent=2) + "\n")
    except DiskFull as exc:  # every step is trained and kept: the table still prints
        print(f"tidal: {path.name} keeps its earlier contents: {exc}", file=sys.stderr)
    return dict(summary)


def print_final_summary(summary: dict[str, object]) -> None:
    """The run's summary table, with the start-up and shutdown rows."""
    from tidal.orchestrator.records.report import RunSummary, print_summary  # rich: only at the end

    fields = set(RunSummary.__dataclass_fields__)
    print_summary(RunSummary(**{k: v for k, v in summary.items() if k in fields}))  # type: ignore[arg-type]
