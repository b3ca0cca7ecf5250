"""Per-step JSON-lines files (`metrics.jsonl`, `sft_metrics.jsonl`): one object per step.

A resumed run trains the steps after its resume point again, so the orchestrator and `tidal
sft` both first cut those steps' lines (and a last line a kill cut short) here: the file
keeps one line per step of the lineage that survives. The rewrite is atomic.
"""

from __future__ import annotations

import json
from pathlib import Path

from tidal.common.files.durable import write_atomic


def line_step(line: str) -> int | None:
    """The step of one line, or None for a torn or unreadable line."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def cut_torn_tail(path: Path) -> None:
    """Drop a last line without its newline (a write cut short by a kill)."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def drop_lines_after(path: Path, step: int) -> list[int]:
    """Remove a torn last line and the lines of steps after `step`; returns their steps."""
    cut_torn_tail(path)
    if not path.is_file():
        return []
    kept, lost = [], []
    for line in path.read_text().splitlines(keepends=True):
        found = line_step(line)
        if found is not None and found > step:
            lost.append(found)
        else:
            kept.append(line)
    if lost:
        write_atomic(path, "".join(kept))
    return lost
