"""Publishing weight versions: which version, in which format, and retrying safely.

Version `v` holds the weights after step `v`; version 0 is published once at start-up,
and a fresh trainer refuses to start over existing versions, a resumed one over versions
newer than its checkpoint. The data path is weightsync's choice (`JoinSync`), carried by
its sender (`tidal.weights.transports`); this module keeps only the version policy: LoRA
adapter-only versions on version 0, the HF folder's other files, idempotent retries while
weightsync is down (`trainer.weightsync_timeout_s`), and on the filesystem path a version
staged under a hidden name before it may be published (docs/weightsync.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import grpc
import torch
from opentelemetry import trace

from tidal.common.errors import FailedPrecondition, Unavailable
from tidal.common.observability.tracing import inject_carrier
from tidal.weights.client import WeightSyncClient
from tidal.weights.folder import StagedVersion
from tidal.weights.manifest import FULL_WEIGHTS, LORA_ADAPTERS, WeightManifest
from tidal.weights.transport_choice import TransportChoice
from tidal.weights.transports.base import VersionPayload, WeightSender
from tidal.weights.transports.factory import make_sender
from tidal.weights.transports.filesystem import FilesystemSender

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

T = TypeVar("T")
WAIT_S = 300.0
PROBE_S = 5.0
"""Deadline of one call while waiting for weightsync (the channel waits for it to be ready)."""
WAIT_LOG_EVERY_S = 10.0
_DOWN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
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
        files: Mapping[str, bytes] | None = None,
        weightsync_address: str = "(unknown address)",
        wait_s: float = WAIT_S,
    ) -> None:
        self.root = root
        self.client = client
        self.weightsync_address = weightsync_address
        self.wait_s = wait_s
        self.hf_config = hf_config
        self.member_id = member_id
        self.advertise_host = advertise_host
        """Host the replicas reach this trainer's TCP store at (broadcast path)."""
        # LoRA adapter-only publishing: versions after 0 hold adapters, described in
        # config.json under "adapter_config" (docs/weightsync.md).
        self.adapter_config = adapter_config
        self.files = dict(files or {})
        """The non-weight files of every version (hf_folder_files.py)."""
        self.newest = -1  # newest version this process published
        self.choice: TransportChoice | None = None
        self.sender: WeightSender | None = None

    async def check_fresh(self) -> None:
        """Raise FailedPrecondition when weightsync already holds versions (no resume yet)."""
        latest = await self._while_down("start", lambda: self.client.latest(timeout=PROBE_S))
        if latest is not None:
            raise FailedPrecondition(
                f"weightsync already has version {latest.manifest.version} (at "
                f"{latest.manifest.location}); the trainer starts from fresh weights and cannot "
                "resume a run yet. Start with a new run name (--run.name) or an empty weights "
                "root."
            )

    async def check_resumable(self, step: int) -> bool:
        """For a trainer resumed at `step`: True if weightsync already holds version `step`.

        Raises FailedPrecondition when it holds a newer version (a trained step lost).
        """
        latest = await self._while_down("resume", lambda: self.client.latest(timeout=PROBE_S))
        if latest is None:
            return False
        newest = latest.manifest.version
        if newest > step:
            held = (
                f"the checkpoint of step {step} and the journal after it"
                if step
                else "the initial weights (no checkpoint or journaled step)"
            )
            raise FailedPrecondition(
                f"weightsync already has version {newest}, newer than {held}; steps "
                f"{step + 1}..{newest} are in no checkpoint or journal entry, so they would "
                "be lost. Start a new run, or keep trainer.ckpt.journal on (with "
                "trainer.ckpt.interval > 0)."
            )
        if newest == step:
            self.newest = step
        return newest == step

    async def stage(
        self, version: int, state_dict: dict[str, torch.Tensor]
    ) -> StagedVersion | None:
        """Write version `version`'s folder, not yet visible (filesystem path only; None on
        the others, whose bytes move at publish): `publish(..., staged=)` commits it."""
        sender = await self._join()
        if not isinstance(sender, FilesystemSender):
            return None
        return await asyncio.to_thread(sender.stage, self.payload(version, state_dict))

    async def publish(
        self,
        version: int,
        state_dict: dict[str, torch.Tensor],
        *,
        staged: StagedVersion | None = None,
    ) -> WeightManifest:
        """Publish version `version` by the run's data path; returns its manifest. With
        `staged` (from `stage`) the folder is already written: it is committed."""
        sender = await self._join()
        assert self.choice is not None
        with tracer.start_as_current_span(
            "trainer.publish", attributes={"version": version, "transport": self.choice.transport}
        ):

            async def attempt() -> WeightManifest:
                nonlocal staged
                registered = await self._registered(version)
                if registered is not None:  # an earlier attempt got it registered
                    return registered
                if staged is not None and isinstance(sender, FilesystemSender):
                    try:
                        return await sender.send_staged(staged)
                    except FileNotFoundError:  # a restarted weightsync swept the temp folder
                        log.info("version %d's staged folder is gone; writing it again", version)
                        staged = None
                return await sender.send(self.payload(version, state_dict))

            manifest = await self._while_down(f"publish version {version}", attempt)
            self.newest = version
            log.info("published version %d", version, extra={"fields": {"dir": manifest.location}})
            return manifest

    def payload(self, version: int, state_dict: dict[str, torch.Tensor]) -> VersionPayload:
        """Version `version` as a sender takes it: format and config.json by the policy
        below, and the current span's context (parent of the replicas' loads)."""
        config = self._config_for(version)
        floats = {t.dtype for t in state_dict.values() if t.is_floating_point()}
        if floats == {torch.bfloat16}:  # trainer.publish_dtype: config.json says what is in it
            config = {**config, "torch_dtype": "bfloat16"}
        return VersionPayload(
            version=version,
            step=version,
            state_dict=state_dict,
            hf_config=config,
            trace_context=inject_carrier(),
            files=self.files,
            **self._format_for(version),
        )

    async def transport_ready(self) -> bool:
        """Wait until the run's path can carry versions itself (broadcast: the group has
        formed); False when it never will, or before the first publish."""
        return self.sender is not None and await self.sender.ready()

    async def _join(self) -> WeightSender:
        if self.sender is not None:
            return self.sender
        choice = await self._while_down(
            "join",
            lambda: self.client.join_sync(self.member_id, "trainer", timeout=PROBE_S),
        )
        sender = make_sender(
            choice,
            client=self.client,
            root=self.root,
            member_id=self.member_id,
            advertise_host=self.advertise_host,
        )
        await sender.start()
        self.choice, self.sender = choice, sender
        return sender

    async def _while_down(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`, repeated while weightsync is unreachable, for at most `wait_s`."""
        started = time.monotonic()
        logged = -WAIT_LOG_EVERY_S
        backoff = 0.2
        while True:
            try:
                return await call()
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _DOWN:
                    raise
                waited = time.monotonic() - started
                if waited >= self.wait_s:
                    raise Unavailable(
                        f"weightsync at {self.weightsync_address} did not answer for "
                        f"{waited:.0f}s ({what}: {exc.code().name}); is it running? "
                        "(trainer.weightsync_timeout_s sets how long the trainer waits)"
                    ) from None
                if waited - logged >= WAIT_LOG_EVERY_S:
                    logged = waited
                    log.warning(
                        "waiting for weightsync at %s (%s: %s, %.0fs of %.0fs)",
                        self.weightsync_address,
                        what,
                        exc.code().name,
                        waited,
                        self.wait_s,
                    )
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, 2.0)

    async def _registered(self, version: int) -> WeightManifest | None:
        """The manifest of `version` if an earlier attempt did get it registered."""
        latest = await self.client.latest()
        if latest is not None and latest.manifest.version == version:
            return latest.manifest
        return None

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
