"""Publishing weight versions: write the files (shared filesystem), then tell weightsync.

Decisions:
- Files are written by `tidal.weightsync.filesystem.write_version` (atomic rename, sha256
  manifest) in a worker thread, so the event loop keeps answering health checks while
  a large model is serialised; then `WeightSyncClient.publish` registers the manifest.
- Version `v` holds the weights after step `v`; version 0 (initial weights) is published
  once at start-up. A fresh trainer refuses to start if weightsync already knows any
  version (its fresh weights would not be the ones those versions continue from) and
  says how to fix it. A trainer resumed from the checkpoint of step k accepts versions
  up to k (it republishes k if missing) and refuses newer ones: they came from steps the
  checkpoint does not hold.
- Retrying a publish is safe: a folder left by an earlier failed attempt is reused when
  weightsync registered it, and replaced when it did not.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from opentelemetry import trace

from tidal.common.errors import FailedPrecondition
from tidal.weightsync.client import WeightSyncClient
from tidal.weightsync.filesystem import version_dir, write_version
from tidal.weightsync.manifest import WeightManifest

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

STARTUP_TIMEOUT_S = 120.0


class WeightPublisher:
    def __init__(
        self,
        root: Path,
        client: WeightSyncClient,
        hf_config: dict[str, Any],
        *,
        adapter_config: dict[str, Any] | None = None,
    ) -> None:
        self.root = root
        self.client = client
        self.hf_config = hf_config
        # LoRA adapter-only publishing: versions after 0 hold adapters, described in
        # config.json under "adapter_config" (docs/memory.md).
        self.adapter_config = adapter_config
        self.newest = -1  # newest version this process published

    async def check_fresh(self) -> None:
        """Raise FailedPrecondition when weightsync already holds versions (no resume yet)."""
        latest = await self.client.latest(timeout=STARTUP_TIMEOUT_S)
        if latest is not None:
            raise FailedPrecondition(
                f"weightsync already has version {latest.manifest.version} (at "
                f"{latest.manifest.location}); the trainer starts from fresh weights and cannot "
                "resume a run yet. Start with a new run name (--run.name) or an empty weights "
                "root."
            )

    async def check_resumable(self, step: int) -> bool:
        """For a trainer resumed at `step`: True if weightsync already holds version `step`.

        Raises FailedPrecondition when it holds a newer version than the checkpoint.
        """
        latest = await self.client.latest(timeout=STARTUP_TIMEOUT_S)
        if latest is None:
            return False
        newest = latest.manifest.version
        if newest > step:
            raise FailedPrecondition(
                f"weightsync already has version {newest}, newer than the checkpoint of step "
                f"{step}; steps {step + 1}..{newest} are not in any checkpoint. Resume a new run, "
                "or save checkpoints more often (trainer.ckpt.interval)."
            )
        if newest == step:
            self.newest = step
        return newest == step

    async def publish(self, version: int, state_dict: dict[str, torch.Tensor]) -> WeightManifest:
        """Write version `version` and register it with weightsync; returns its manifest."""
        with tracer.start_as_current_span("trainer.publish", attributes={"version": version}):
            leftover = await self._registered_leftover(version)
            if leftover is not None:
                manifest = leftover
            else:
                manifest = await asyncio.to_thread(self._write, version, state_dict)
                await self.client.publish(manifest)
            self.newest = version
            log.info("published version %d", version, extra={"fields": {"dir": manifest.location}})
            return manifest

    async def _registered_leftover(self, version: int) -> WeightManifest | None:
        """The manifest of a folder from an earlier attempt that weightsync did register."""
        if not version_dir(self.root, version).exists():
            return None
        latest = await self.client.latest()
        if latest is not None and latest.manifest.version == version:
            return latest.manifest
        return None

    def _write(self, version: int, state_dict: dict[str, torch.Tensor]) -> WeightManifest:
        folder = version_dir(self.root, version)
        if folder.exists():  # an unregistered leftover of a failed attempt: replace it
            shutil.rmtree(folder)
        config = self.hf_config
        if self.adapter_config is not None and version > 0:
            config = {**config, "adapter_config": self.adapter_config}
        return write_version(
            self.root, version=version, step=version, state_dict=state_dict, config=config
        )
