"""Publishing weight versions through the run's data path, then telling weightsync.

Decisions:
- The data path is weightsync's choice (`JoinSync`, asked once, on the first publish), so
  trainer and inference config never disagree with the service about it:
  - filesystem: `write_version` (atomic rename, sha256 manifest) in a worker thread, then
    `WeightSyncClient.publish` registers the manifest;
  - stream: the same files encoded in memory and uploaded with `UploadWeights` (for a
    trainer without the shared folder); weightsync writes and verifies them. The
    encoded weights file is kept and rewritten in place by the next version;
  - broadcast: the version is broadcast to the replicas' group in buckets first (the
    fast path), then written and registered as on the filesystem path, which is how a
    replica that joined late or missed a broadcast catches up. The write starts once the
    group's replicas confirm they serve the version (at most `CONFIRM_WAIT_S`), so it
    is off their critical path; `publish` still returns only once the version is
    registered, so a failed write fails the publish (and the step retries it) as before.
    The group forms in the background (it waits for every replica); versions published
    before it is ready go by the filesystem path only. A broadcast that fails (a replica
    died) re-forms the group as a new generation of whoever rejoins (`JoinSync`);
    versions published meanwhile go by the filesystem, which is also how the survivors
    catch up.
- Version `v` holds the weights after step `v`; version 0 (initial weights) is published
  once at start-up. A fresh trainer refuses to start if weightsync already knows any
  version (its fresh weights would not be the ones those versions continue from) and
  says how to fix it. A trainer resumed from the checkpoint of step k accepts versions
  up to k (it republishes k if missing) and refuses newer ones: they came from steps the
  checkpoint does not hold.
- LoRA with `lora.publish = "adapters"`: version 0 holds the full base weights, every
  later version only the adapters (format "lora-adapters", `base_version` 0 in the
  manifest and in config.json's `adapter_config`, so the broadcast path, which carries
  no manifest, says it too). Replicas merge them onto version 0 (tidal.inference.adapters).
- Retrying a publish is safe: a version weightsync already registered is not sent again;
  a folder left by an earlier failed attempt is replaced.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from opentelemetry import trace

from tidal.common.errors import FailedPrecondition
from tidal.common.telemetry import inject_carrier
from tidal.weightsync.client import WeightSyncClient
from tidal.weightsync.filesystem import WEIGHTS_FILE, version_dir, write_version
from tidal.weightsync.manifest import FULL_WEIGHTS, LORA_ADAPTERS, WeightManifest
from tidal.weightsync.rendezvous import SyncPlan
from tidal.weightsync.stream import encode_version

if TYPE_CHECKING:
    from tidal.weightsync.broadcast import BroadcastGroup

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

STARTUP_TIMEOUT_S = 120.0
BASE_VERSION = 0
"""The version holding the full weights that published LoRA adapters apply to."""


class WeightPublisher:
    def __init__(
        self,
        root: Path,
        client: WeightSyncClient,
        hf_config: dict[str, Any],
        *,
        member_id: str = "trainer",
        advertise_host: str = "127.0.0.1",
        adapter_config: dict[str, Any] | None = None,
    ) -> None:
        self.root = root
        self.client = client
        self.hf_config = hf_config
        self.member_id = member_id
        self.advertise_host = advertise_host
        """Host the replicas reach this trainer's TCP store at (broadcast path)."""
        # LoRA adapter-only publishing: versions after 0 hold adapters, described in
        # config.json under "adapter_config" (docs/weightsync.md).
        self.adapter_config = adapter_config
        self.newest = -1  # newest version this process published
        self.plan: SyncPlan | None = None
        self._group: asyncio.Future[BroadcastGroup] | None = None
        self._broadcast_broken = False
        self._store: Any = None  # the broadcast group's TCP store, kept across generations
        self._store_address = ""
        # The stream path's encoded weights file, rewritten in place by the next version
        # of the same size (no fresh 1 GB buffer per publish).
        self._upload_buffer: bytearray | None = None

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
        """Publish version `version` by the run's data path; returns its manifest."""
        plan = await self._join()
        with tracer.start_as_current_span(
            "trainer.publish", attributes={"version": version, "transport": plan.transport}
        ):
            manifest = await self._registered(version)
            if manifest is None:
                if plan.transport == "stream":
                    manifest = await self._upload(version, state_dict, plan)
                else:
                    if plan.transport == "broadcast":
                        await self._broadcast(version, state_dict)
                    manifest = await asyncio.to_thread(self._write, version, state_dict)
                    await self.client.publish(manifest)
            self.newest = version
            log.info("published version %d", version, extra={"fields": {"dir": manifest.location}})
            return manifest

    async def broadcast_ready(self) -> bool:
        """Wait until the broadcast group has formed (True) or failed to (False)."""
        if self._group is None:
            return False
        try:
            await asyncio.shield(self._group)
        except RuntimeError:
            return False
        return not self._broadcast_broken

    async def _join(self) -> SyncPlan:
        if self.plan is not None:
            return self.plan
        plan = await self.client.join_sync(self.member_id, "trainer", timeout=STARTUP_TIMEOUT_S)
        if plan.transport == "broadcast":
            from tidal.weightsync.broadcast import BroadcastGroup, host_store, in_daemon_thread

            store = host_store(self.advertise_host, STARTUP_TIMEOUT_S)
            address = f"{self.advertise_host}:{store.port}"
            self._store, self._store_address = store, address
            plan = await self.client.join_sync(
                self.member_id, "trainer", store_address=address, timeout=STARTUP_TIMEOUT_S
            )
            assert plan.seat is not None
            log.info("broadcast group: hosting its store at %s, waiting for replicas", address)
            self._group = in_daemon_thread(BroadcastGroup, store, plan.seat)
        self.plan = plan
        return plan

    async def _registered(self, version: int) -> WeightManifest | None:
        """The manifest of `version` if an earlier attempt did get it registered."""
        uploaded = self.plan is not None and self.plan.transport == "stream"
        if not uploaded and not version_dir(self.root, version).exists():
            return None
        latest = await self.client.latest()
        if latest is not None and latest.manifest.version == version:
            return latest.manifest
        return None

    async def _upload(
        self, version: int, state_dict: dict[str, torch.Tensor], plan: SyncPlan
    ) -> WeightManifest:
        manifest, files = await asyncio.to_thread(
            lambda: encode_version(
                version=version,
                step=version,
                state_dict=state_dict,
                config=self._config_for(version),
                **self._format_for(version),
                reuse=self._upload_buffer,
            )
        )
        await self.client.upload(manifest, files, chunk_bytes=plan.chunk_bytes)
        weights = files[WEIGHTS_FILE]
        self._upload_buffer = weights if isinstance(weights, bytearray) else None
        return manifest

    async def _broadcast(self, version: int, state_dict: dict[str, torch.Tensor]) -> None:
        """Send to the group when it is ready; a failure only disables broadcasting."""
        group = self._group
        if group is None or self._broadcast_broken or not group.done():
            return
        if group.exception() is not None:
            log.warning(
                "broadcast group did not form (%s); using the filesystem", group.exception()
            )
            self._broadcast_broken = True
            return
        from tidal.weightsync.broadcast import in_daemon_thread

        try:
            await in_daemon_thread(
                group.result().send,
                version,
                version,
                self._config_for(version),
                state_dict,
                inject_carrier(),
            )
            # The replicas copy the version into their engines now; the catch-up copy
            # (written next) would compete with them for the cores, so it waits for them.
            await in_daemon_thread(group.result().wait_confirmed, version)
        except RuntimeError as exc:  # a replica died mid-broadcast (gloo/NCCL error)
            log.warning("broadcast of version %d failed (%s); re-forming the group", version, exc)
            try:
                group.result().abandon()  # receivers still waiting on it rejoin now
            except RuntimeError as abandon_exc:
                log.warning("could not mark the broken group abandoned: %s", abandon_exc)
            self._group = asyncio.ensure_future(self._reform())

    async def _reform(self) -> BroadcastGroup:
        """A new generation of the group with the replicas that rejoin (weightsync waits
        `reform_window_s` for them); raises RuntimeError when none does."""
        from tidal.weightsync.broadcast import BroadcastGroup, in_daemon_thread

        plan = await self.client.join_sync(
            self.member_id, "trainer", store_address=self._store_address,
            timeout=STARTUP_TIMEOUT_S,
        )  # fmt: skip
        seat = plan.seat
        if seat is None or seat.world_size < 2:
            raise RuntimeError("no replica rejoined the broadcast group")
        log.info("broadcast group re-formed: generation %d, %d ranks", seat.generation,
                 seat.world_size)  # fmt: skip
        return await in_daemon_thread(BroadcastGroup, self._store, seat)

    def _write(self, version: int, state_dict: dict[str, torch.Tensor]) -> WeightManifest:
        folder = version_dir(self.root, version)
        if folder.exists():  # an unregistered leftover of a failed attempt: replace it
            shutil.rmtree(folder)
        return write_version(
            self.root,
            version=version,
            step=version,
            state_dict=state_dict,
            config=self._config_for(version),
            **self._format_for(version),
        )

    def _adapters_only(self, version: int) -> bool:
        return self.adapter_config is not None and version > BASE_VERSION

    def _format_for(self, version: int) -> dict[str, Any]:
        """Manifest fields of a version: full weights, or adapters on version 0."""
        if self._adapters_only(version):
            return {"format": LORA_ADAPTERS, "base_version": BASE_VERSION}
        return {"format": FULL_WEIGHTS, "base_version": None}

    def _config_for(self, version: int) -> dict[str, Any]:
        """config.json of a version: the model's, plus the adapter description when LoRA
        publishes adapters only (every version after 0, which holds the base weights)."""
        if self._adapters_only(version):
            adapters = {**(self.adapter_config or {}), "base_version": BASE_VERSION}
            return {**self.hf_config, "adapter_config": adapters}
        return self.hf_config
