"""tidal.text imports neither torch nor transformers: the orchestrator uses it."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import tidal.text


def test_every_module_imports_without_torch_or_transformers() -> None:
    names = [m.name for m in pkgutil.walk_packages(tidal.text.__path__, prefix="tidal.text.")]
    assert {"tidal.text.loader", "tidal.text.episode", "tidal.text.detokenize"} <= set(names)
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers'))\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
