"""Activation offloading: tensors autograd saves in forward live in host memory until backward.

`saved_tensors_hooks`: pack copies a saved activation to host memory on a CUDA side
stream (at most `max_inflight` copies outstanding), unpack brings it back with a bounded
prefetch of the next ones backward will ask for. Parameters, views of them (FSDP's
gathered weights included) and tiny tensors are kept as they are, so FSDP frees and
regathers its parameters as without the lever. On a CPU device activations already are
in host memory: the lever keeps them (`copy_on_cpu` runs the bookkeeping for tests).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tidal.models.dtensors import is_dtensor, local_shard


@dataclass
class _OffloadedActivation:
    host: torch.Tensor
    device: torch.device
    copied: Any = None  # CUDA event: device→host copy done
    fetched: torch.Tensor | None = None  # prefetched device copy
    ready: Any = None  # CUDA event: host→device copy done


@dataclass
class ActivationOffloader:
    """One forward/backward's offloading state; use `with offloader.hooks():` around forward."""

    max_inflight: int
    min_bytes: int = 1024
    copy_on_cpu: bool = False  # CPU device: copy anyway (tests the mechanism; saves nothing)
    resident: set[int] = field(default_factory=set)  # storages never offloaded (parameters)
    handles: list[_OffloadedActivation] = field(default_factory=list)
    offloaded_bytes: int = 0
    _pending: list[tuple[_OffloadedActivation, torch.Tensor]] = field(default_factory=list)
    _stream: Any = None

    def __post_init__(self) -> None:
        if self.max_inflight < 1:
            raise ValueError(
                f"ac_offloading.max_inflight_activations must be >= 1, got {self.max_inflight}"
            )

    @property
    def copies_in_flight(self) -> int:
        """Device tensors whose host copies have not finished (bounded by `max_inflight`)."""
        return len(self._pending)

    def _side_stream(self, device: torch.device) -> Any:
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        return self._stream

    def _pack(self, tensor: torch.Tensor) -> Any:
        cuda = tensor.device.type == "cuda"
        if (
            not (cuda or self.copy_on_cpu)
            or isinstance(tensor, nn.Parameter)
            or is_dtensor(tensor)
            or isinstance(tensor._base, nn.Parameter)  # e.g. FSDP's unsharded weight, transposed
            or tensor.untyped_storage().data_ptr() in self.resident  # a view of a parameter
            or tensor.numel() * tensor.element_size() < self.min_bytes
        ):
            return tensor
        if len(self._pending) >= self.max_inflight:
            self._wait_oldest()
        if cuda:
            handle = self._copy_out_cuda(tensor)
        else:
            handle = _OffloadedActivation(host=tensor.detach().clone(), device=tensor.device)
        # Keep the device tensor alive until its copy is done (then it can be freed).
        self._pending.append((handle, tensor))
        self.handles.append(handle)
        self.offloaded_bytes += handle.host.numel() * handle.host.element_size()
        return len(self.handles) - 1

    def _copy_out_cuda(self, tensor: torch.Tensor) -> _OffloadedActivation:
        stream = self._side_stream(tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        with torch.cuda.stream(stream):
            host.copy_(tensor, non_blocking=True)
            tensor.record_stream(stream)  # its memory is not reused before the copy is done
            event = torch.cuda.Event()
            event.record(stream)
        return _OffloadedActivation(host=host, device=tensor.device, copied=event)

    def _wait_oldest(self) -> None:
        handle, _ = self._pending.pop(0)
        if handle.copied is not None:
            handle.copied.synchronize()

    def _fetch(self, index: int) -> None:
        handle = self.handles[index]
        if handle.fetched is not None:
            return
        if handle.device.type != "cuda":
            handle.fetched = handle.host.to(handle.device, copy=True)
            return
        stream = self._side_stream(handle.device)
        handle.copied.synchronize()
        with torch.cuda.stream(stream):
            handle.fetched = handle.host.to(handle.device, non_blocking=True)
            handle.ready = torch.cuda.Event()
            handle.ready.record(stream)

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        index: int = packed
        self._fetch(index)
        # Bounded prefetch of the tensors backward will ask for next (saved earlier).
        for ahead in range(max(0, index - self.max_inflight), index):
            self._fetch(ahead)
        handle = self.handles[index]
        tensor = handle.fetched
        assert tensor is not None
        if handle.ready is not None:
            current = torch.cuda.current_stream(handle.device)
            current.wait_event(handle.ready)
            tensor.record_stream(current)
        handle.fetched = None  # the caller owns it now; refetch if unpacked again
        return tensor

    @contextlib.contextmanager
    def hooks(self) -> Iterator[ActivationOffloader]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self
        self._pending.clear()  # device tensors whose copies are in flight may be freed later


def activation_offloading(
    config: Any, model: nn.Module, *, copy_on_cpu: bool = False
) -> contextlib.AbstractContextManager[Any]:
    """A fresh offloader's hooks for `config` (`ActivationOffloadingConfig`), or a no-op.

    `model`'s parameters (and views of them, e.g. the transposed weight a linear layer
    saves) stay where they are.
    """
    if config is None:
        return contextlib.nullcontext()
    offloader = ActivationOffloader(
        max_inflight=config.max_inflight_activations,
        min_bytes=config.min_offload_bytes,
        copy_on_cpu=copy_on_cpu,
        resident={local_shard(p).untyped_storage().data_ptr() for p in model.parameters()},
    )
    return offloader.hooks()
