"""Optimizer-state offload: AdamW/SGD whose states live off the device, in host memory
(`optim_cpu_offload`) or in memory-mapped files (`optim_offload = "disk"`).

One update engine, two state stores: every parameter is updated in fixed-size slices,
each slice's states copied from the store into a small reused device buffer pool and
back, so device (and, for disk, resident) memory for states is bounded by the pool
whatever the model size. AdamW and SGD are elementwise, so the slice-wise update is the
whole-tensor one; the math is torch's single-tensor update in the same order, and
`state_dict()` is torch's format. Sharded parameters: each rank offloads only its shard.
"""

from __future__ import annotations

import math
import mmap
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from tidal.models.dtensors import is_dtensor, local_shard

PAGE = mmap.PAGESIZE
FP32 = 4  # bytes per state element; states are fp32 like the master weights
STATE_KINDS = {"adamw": ("exp_avg", "exp_avg_sq"), "sgd": ("momentum_buffer",)}


def _align(n_bytes: int) -> int:
    return -(-n_bytes // PAGE) * PAGE


def _like_param(state: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """`state` (this rank's shard, shaped like `local_shard(p)`) as `p` is: a DTensor with
    the parameter's spec, or the plain tensor itself. FSDP2's own `DTensor(local, spec)`
    construction, not `DTensor.from_local`, which would copy host states onto a CUDA
    mesh's device and hold every state on the GPU during a save."""
    if not is_dtensor(p):
        return state
    from torch.distributed.tensor import DTensor  # imported already: `p` is one

    return DTensor(state, p._spec, requires_grad=False)  # type: ignore[call-arg]


def rank_directory(directory: Path | None) -> Path | None:
    """`directory/rank-<r>` under a multi-rank process group, else `directory`: ranks
    sharing a node or a filesystem never map the same files."""
    if directory is None or not dist.is_initialized() or dist.get_world_size() == 1:
        return directory
    return directory / f"rank-{dist.get_rank()}"


@dataclass(frozen=True)
class Slice:
    """Elements [start, stop) of the flattened parameter `index`."""

    index: int
    start: int
    stop: int


class HostStateStore:
    """States as flat fp32 host tensors, one per kind (pinned when CUDA is available)."""

    def __init__(self, kinds: tuple[str, ...], offsets: list[int], total: int) -> None:
        pin = torch.cuda.is_available()
        self.offsets = offsets
        self.flat = {k: torch.zeros(total, dtype=torch.float32, pin_memory=pin) for k in kinds}

    def view(self, kind: str, s: Slice) -> torch.Tensor:
        base = self.offsets[s.index]
        return self.flat[kind][base + s.start : base + s.stop]  # (stop - start,)

    def release(self, kind: str, s: Slice) -> None:
        """Nothing to release: host states stay resident."""

    def close(self) -> None:
        self.flat.clear()


class DiskStateStore:
    """States in one memory-mapped file per kind; written slices are dropped from RSS."""

    def __init__(
        self, kinds: tuple[str, ...], offsets: list[int], total: int, directory: Path | None
    ) -> None:
        self._owned = directory is None
        self.dir = Path(tempfile.mkdtemp(prefix="tidal-optim-")) if directory is None else directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.offsets = offsets
        self.maps: dict[str, mmap.mmap] = {}
        for kind in kinds:
            path = self.dir / f"{kind}.f32"
            with open(path, "wb") as f:  # sparse file of zeros: no disk written until used
                f.truncate(max(PAGE, total * FP32))
            with open(path, "r+b") as f:
                self.maps[kind] = mmap.mmap(f.fileno(), 0)

    def view(self, kind: str, s: Slice) -> torch.Tensor:
        base = self.offsets[s.index]
        n, offset = s.stop - s.start, (base + s.start) * FP32
        return torch.frombuffer(self.maps[kind], dtype=torch.float32, count=n, offset=offset)

    def release(self, kind: str, s: Slice) -> None:
        """Drop the slice's pages from this process's memory (they stay in the file)."""
        lo = ((self.offsets[s.index] + s.start) * FP32) // PAGE * PAGE
        hi = _align((self.offsets[s.index] + s.stop) * FP32)
        # On a shared file mapping this unmaps the pages; dirty ones stay in the page cache
        # and the kernel writes them back, so nothing is lost and RSS drops at once.
        self.maps[kind].madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def close(self) -> None:
        for m in self.maps.values():
            m.close()
        self.maps.clear()
        if self._owned:
            shutil.rmtree(self.dir, ignore_errors=True)


class OffloadedStateOptimizer(torch.optim.Optimizer):
    """AdamW or SGD over param groups, with states in a host or disk store."""

    def __init__(
        self,
        params: Iterable[Any],
        *,
        kind: Literal["adamw", "sgd"],
        store: Literal["host", "disk"],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        buffer_mb: float = 64.0,
        directory: Path | None = None,
    ) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, momentum=momentum, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.kind = kind
        self.kinds = STATE_KINDS[kind] if kind == "adamw" or momentum > 0 else ()
        all_params = [p for g in self.param_groups for p in g["params"]]
        for p in all_params:
            if p.dtype != torch.float32 or not local_shard(p).is_contiguous():
                raise ValueError("optimizer offload needs contiguous fp32 parameters")
        self._index = {id(p): i for i, p in enumerate(all_params)}
        offsets, total = [], 0
        for p in all_params:  # page-aligned regions, so a parameter's pages are its own
            offsets.append(total)
            total += _align(local_shard(p).numel() * FP32) // FP32  # this rank's shard only
        per_kind = int(buffer_mb * 2**20) // FP32 // max(1, len(self.kinds))
        self.slice_numel = max(PAGE // FP32, per_kind)  # elements per slice and buffer
        self.store: HostStateStore | DiskStateStore = (
            HostStateStore(self.kinds, offsets, total)
            if store == "host"
            else DiskStateStore(self.kinds, offsets, total, rank_directory(directory))
        )
        self._pool: dict[tuple[str, torch.device], torch.Tensor] = {}

    def _buffer(self, kind: str, device: torch.device, n: int) -> torch.Tensor:
        key = (kind, device)
        if key not in self._pool:
            self._pool[key] = torch.empty(self.slice_numel, dtype=torch.float32, device=device)
        return self._pool[key][:n]  # (n,) reused across slices and steps

    def _slices(self, p: torch.Tensor) -> Iterator[Slice]:
        i, n = self._index[id(p)], local_shard(p).numel()
        for start in range(0, n, self.slice_numel):
            yield Slice(i, start, min(n, start + self.slice_numel))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "step" not in state:
                    state["step"] = torch.tensor(0.0)
                state["step"] += 1
                for s in self._slices(p):
                    self._update_slice(p, s, group, int(state["step"].item()))
        return loss

    def _update_slice(self, p: torch.Tensor, s: Slice, group: dict[str, Any], step: int) -> None:
        assert p.grad is not None
        local = local_shard(p)  # this rank's shard: plain tensors only from here on
        param = local.view(-1)[s.start : s.stop]  # (n,) view into the parameter (shard)
        grad = local_shard(p.grad).view(-1)[s.start : s.stop]  # (n,)
        in_place = local.device.type == "cpu"  # the store is host memory: update it there
        bufs = {}
        for kind in self.kinds:  # store → device buffer
            if in_place:
                bufs[kind] = self.store.view(kind, s)
            else:
                bufs[kind] = self._buffer(kind, local.device, s.stop - s.start)
                bufs[kind].copy_(self.store.view(kind, s), non_blocking=True)
        if self.kind == "adamw":
            _adamw(param, grad, bufs["exp_avg"], bufs["exp_avg_sq"], group, step)
        else:
            _sgd(param, grad, bufs.get("momentum_buffer"), group, first=step == 1)
        for kind in self.kinds:  # device buffer → store
            if not in_place:
                self.store.view(kind, s).copy_(bufs[kind])
            self.store.release(kind, s)

    def state_dict(self) -> dict[str, Any]:
        """torch's optimizer format, states materialized in host memory (loads into a plain
        AdamW/SGD); a sharded parameter's states are DTensors with its spec."""
        sd = super().state_dict()
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in enumerate(params):
            if i not in sd["state"]:
                continue
            local = local_shard(p)
            for kind in self.kinds:
                full = torch.empty(local.numel(), dtype=torch.float32)  # (n_local,)
                for s in self._slices(p):
                    full[s.start : s.stop] = self.store.view(kind, s)
                    self.store.release(kind, s)
                sd["state"][i][kind] = _like_param(full.view(local.shape), p)
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Write the states into the store; only the step counts stay in `self.state`."""
        params = [p for g in self.param_groups for p in g["params"]]
        # Saved groups name parameters by index (torch) or by FQN (DCP); order matches ours.
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        by_id = dict(zip(saved_ids, params, strict=True))
        slim: dict[str, Any] = {"param_groups": state_dict["param_groups"], "state": {}}
        for i, entry in state_dict["state"].items():
            p = by_id[i]
            for kind in self.kinds:
                saved = local_shard(entry[kind].detach())  # this rank's shard
                if saved.numel() != local_shard(p).numel():
                    raise ValueError(
                        f"optimizer state {kind!r} of parameter {i!r} has {saved.numel()} "
                        f"elements here, its parameter {local_shard(p).numel()}: load a sharded "
                        "state through DCP (`set_state_dict`), which reshards it"
                    )
                flat = saved.reshape(-1).to("cpu", torch.float32)  # (n_local,)
                for s in self._slices(p):
                    self.store.view(kind, s).copy_(flat[s.start : s.stop])
                    self.store.release(kind, s)
            step = entry["step"]
            slim["state"][i] = {"step": torch.as_tensor(step, dtype=torch.float32).clone()}
        super().load_state_dict(slim)

    def close(self) -> None:
        """Unmap and delete the state files this optimizer created."""
        self.store.close()

    def __del__(self) -> None:
        store = getattr(self, "store", None)
        if store is not None:
            store.close()


def _adamw(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    group: dict[str, Any],
    step: int,
) -> None:
    """torch's single-tensor AdamW on one slice (all (n,), updated in place)."""
    lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
    param.mul_(1 - lr * group["weight_decay"])
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = math.sqrt(1 - beta2**step)
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)


def _sgd(
    param: torch.Tensor,
    grad: torch.Tensor,
    buf: torch.Tensor | None,
    group: dict[str, Any],
    *,
    first: bool,
) -> None:
    """torch's single-tensor SGD (L2 weight decay, momentum without dampening)."""
    if group["weight_decay"]:
        grad = grad.add(param, alpha=group["weight_decay"])
    if buf is not None:
        if first:
            buf.copy_(grad)
        else:
            buf.mul_(group["momentum"]).add_(grad)
        grad = buf
    param.add_(grad, alpha=-group["lr"])


def optimizer_state_store(
    optim_cpu_offload: bool, optim_offload: str
) -> Literal["host", "disk"] | None:
    """Which store the config asks for (None: a plain torch optimizer)."""
    if optim_offload == "disk":
        return "disk"
    return "host" if optim_cpu_offload else None
