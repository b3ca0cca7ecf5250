"""Configuration of the weight-sync service (`[weightsync]`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from tidal.common.config import BaseConfig
from tidal.common.sections import ServiceRunConfig


class WeightSyncConfig(BaseConfig):
    type: Literal["filesystem"] = "filesystem"
    """Data path. "filesystem" (shared folder, atomic publish); broadcast and stream come later."""
    root: Path | None = None
    """Shared folder holding version folders; default `<run dir>/weights`."""
    keep_last: int = Field(default=3, ge=1)
    """Versions kept on disk; older ones are deleted unless a replica still serves them."""
    chunk_bytes: int = Field(default=1 << 20, gt=0)
    """Chunk size of FetchWeights streams."""


class WeightSyncRunConfig(ServiceRunConfig):
    weightsync: WeightSyncConfig = WeightSyncConfig()  # type: ignore[assignment]

    @property
    def weights_root(self) -> Path:
        return self.weightsync.root or self.run.dir / "weights"
