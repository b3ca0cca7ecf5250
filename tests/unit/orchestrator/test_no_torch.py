"""The orchestrator must never import torch (it runs on machines without it)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import tidal.orchestrator


def test_importing_every_orchestrator_module_does_not_import_torch(tmp_path: Path) -> None:
    names = [
        m.name
        for m in pkgutil.walk_packages(tidal.orchestrator.__path__, prefix="tidal.orchestrator.")
        if m.name != "tidal.orchestrator.__main__"  # runs the service when imported
    ]
    assert "tidal.orchestrator.loop" in names and "tidal.orchestrator.tasks.reversal" in names
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "import tidal.orchestrator.records.report as r\n"
        "r.write_reward_plot([], __import__('pathlib').Path(sys.argv[1]))\n"
        "r.write_report([], __import__('pathlib').Path(sys.argv[1]))\n"
        "import tidal.orchestrator.records.run_log as m\n"
        "log = m.RunLog(__import__('pathlib').Path(sys.argv[1]).parent / 'metrics.jsonl')\n"
        "assert log.writes_tensorboard\n"
        "log.close()\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "reward.png")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
