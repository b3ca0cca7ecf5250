"""Start-up imports: the service modules do not import DTensor or DCP (sympy, ~0.7 s of
CPU on every run's start-up path); the trainer imports DCP on its background thread."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch.distributed.tensor", "torch.distributed.checkpoint")
CODE = f"""
import sys
import tidal.trainer.main, tidal.inference.main, tidal.inference.native
print([m for m in {HEAVY!r} if m in sys.modules])
from tidal.trainer.checkpoint import DCP_MODULE, import_dcp_in_background
import_dcp_in_background().join(120)
print(DCP_MODULE in sys.modules)
"""


def test_service_modules_leave_dtensor_and_dcp_to_the_background_import() -> None:
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "True"]
