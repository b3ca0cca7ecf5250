"""Optional Weights & Biases logging of each step's run-log record (`[orchestrator.wandb]`).

A `RunLog` sink, so W&B gets exactly what metrics.jsonl gets (`StepRecord.flat()`, numeric
fields). `wandb` is an optional extra, checked before the orchestrator serves (exit 2
naming it). One W&B run per Tidal run: its id is kept in `<run dir>/wandb-run-id` and
resumed across restarts. A failing `log` never stops training.
"""

from __future__ import annotations

import importlib
import secrets
from pathlib import Path
from types import ModuleType
from typing import Any

from tidal.common.errors import ConfigError
from tidal.orchestrator.config import WandbConfig
from tidal.orchestrator.records.run_log import StepRecord

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
