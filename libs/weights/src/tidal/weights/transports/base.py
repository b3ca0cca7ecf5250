"""The weight transport interface: a sender (trainer) and a receiver (replica) per path.

One file per transport, each with a `WeightSender` and a `WeightReceiver`; `factory`
picks the pair once, so the trainer's publisher and inference's reloader keep only
version policy and never compare transport names. A sender moves a version's bytes and
has weightsync register it. A receiver `fetch`es a registered version (every path can)
and `run`s to receive versions pushed to it (only broadcast pushes).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidal.weights.manifest import FULL_WEIGHTS, WeightManifest

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class VersionPayload:
    """One version as the trainer hands it to a sender."""

    version: int
    step: int
    state_dict: Mapping[str, torch.Tensor]
    hf_config: dict[str, Any]
    format: str = FULL_WEIGHTS
    base_version: int | None = None
    """For LoRA adapter versions: the version whose full weights they apply to."""
    trace_context: dict[str, str] = field(default_factory=dict)
    """The publish span's context, carried to the replicas' load spans."""
    files: Mapping[str, bytes] = field(default_factory=dict)
    """Companion files (tokenizer files, generation_config.json) written beside the
    weights and config.json, in the manifest like them (`codec.encode_files`)."""


@dataclass(frozen=True)
class ReceivedVersion:
    """A version pushed to a replica (broadcast); its tensors are valid until the next."""

    version: int
    step: int
    hf_config: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    trace_context: dict[str, str]


Install = Callable[[ReceivedVersion], Awaitable[None]]
"""The replica's handler of a pushed version: hands it to the engine (which copies it)."""


class WeightSender(ABC):
    """Trainer side of a data path."""

    async def start(self) -> None:
        """Prepare the path (broadcast: start forming the group); called once."""
        return None  # the filesystem and stream paths need nothing

    async def ready(self) -> bool:
        """Wait until the path can carry versions itself; False if it never will
        (broadcast: the group failed to form, so versions go by the filesystem)."""
        return True

    @abstractmethod
    async def send(self, payload: VersionPayload) -> WeightManifest:
        """Move the version's bytes and have weightsync register it; its manifest."""


class WeightReceiver(ABC):
    """Replica side of a data path."""

    source = "filesystem"
    """How pulled versions arrive (the load log's and span's label)."""

    @abstractmethod
    async def fetch(
        self, manifest: WeightManifest, *, reuse: bool = False
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(HF config, state dict) of a registered version, verified. With `reuse` the
        receiver may land it in the previous `reuse` fetch's buffers (the caller has
        installed, i.e. copied, that version already)."""

    async def run(self, install: Install) -> None:
        """Receive pushed versions until the sender stops, calling `install` for each."""
        return None  # only broadcast pushes
