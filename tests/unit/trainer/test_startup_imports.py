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
import torch
from tidal.trainer.config import TrainerConfig
from tidal.trainer.main import prepare_first_step
from tidal.trainer.persistence.checkpoint import DCP_MODULE
from tidal.trainer.train_step import Trainer
trainer = Trainer(TrainerConfig(device="cpu"), seed=0, device=torch.device("cpu"))
prepare_first_step(trainer, checkpoints=True).join(120)
print(DCP_MODULE in sys.modules)
"""


def test_service_modules_leave_dtensor_and_dcp_to_the_background_import() -> None:
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "True"]
