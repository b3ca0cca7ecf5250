"""Optional Weights & Biases logging of the per-step metrics (`[orchestrator.wandb]`).

Decisions:
- A `RunLog` sink: W&B gets exactly the numbers metrics.jsonl and TensorBoard get
  (`StepRecord.flat()`, numeric fields only), at the step's id.
- `wandb` is an optional extra (`tidal-orchestrator[wandb]`), imported only when enabled,
  and checked before the orchestrator serves: enabled without it installed is a
  configuration error (exit 2) naming the key and the extra.
- One W&B run per Tidal run, across orchestrator restarts and `--resume`: its id is
  made once and kept in `<run dir>/wandb-run-id`, and `wandb.init(resume="allow")`
  continues it. W&B's own files go under `<run dir>/wandb/`.
- A failing `log` is reported by `RunLog` and never stops training.
"""

from __future__ import annotations

import importlib
import secrets
from pathlib import Path
from types import ModuleType
from typing import Any

from tidal.common.errors import ConfigError
from tidal.orchestrator.config import WandbConfig
from tidal.orchestrator.run_log import StepRecord

RUN_ID_FILE = "wandb-run-id"


def import_wandb() -> ModuleType:
    """The wandb module, or ConfigError naming the key and the extra to install."""
    try:
        return importlib.import_module("wandb")
    except ImportError:
        raise ConfigError(
            "orchestrator.wandb.enabled = true needs the wandb package, which is not "
            "installed: pip install 'tidal-orchestrator[wandb]' (or set "
            "orchestrator.wandb.enabled = false)"
        ) from None


def run_id(run_dir: Path) -> str:
    """This Tidal run's W&B run id (made once, then read back)."""
    path = run_dir / RUN_ID_FILE
    if path.is_file() and (saved := path.read_text().strip()):
        return saved
    new = secrets.token_hex(8)
    path.write_text(new + "\n")
    return new


class WandbSink:
    """Logs each finished step to one W&B run."""

    def __init__(self, run: Any) -> None:
        self.run = run

    @classmethod
    def start(
        cls, config: WandbConfig, *, run_name: str, run_dir: Path, settings: dict[str, Any]
    ) -> WandbSink:
        wandb = import_wandb()
        run_dir.mkdir(parents=True, exist_ok=True)
        run = wandb.init(
            project=config.project,
            entity=config.entity,
            mode=config.mode,
            name=config.name or run_name,
            tags=list(config.tags),
            id=run_id(run_dir),
            resume="allow",
            dir=str(run_dir),
            config=settings,
        )
        return cls(run)

    def __call__(self, metrics: StepRecord) -> None:
        numbers = {
            name: value
            for name, value in metrics.flat().items()
            if isinstance(value, int | float) and not isinstance(value, bool) and name != "step"
        }
        self.run.log(numbers, step=metrics.step)

    def finish(self) -> None:
        self.run.finish()
