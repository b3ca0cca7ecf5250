"""Everything of tidal.batch but `tensors` imports without torch: the orchestrator uses it."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import tidal.batch


def test_every_module_but_tensors_imports_without_torch() -> None:
    names = [
        m.name
        for m in pkgutil.walk_packages(tidal.batch.__path__, prefix="tidal.batch.")
        if m.name != "tidal.batch.tensors"  # the trainer's torch conversion
    ]
    assert {"tidal.batch.packing", "tidal.batch.balance", "tidal.batch.wire"} <= set(names)
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
