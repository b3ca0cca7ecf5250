"""The memory levers as the planner sees them, read from a `TrainerConfig`.

The planner predicts from the config's field names, not the lever code, so `--fit` can
suggest a lever the config does not set yet. `to_toml(base)` writes an overlay that,
composed over the run config, gives exactly these levers: its tables are complete (a
partial one would merge with the config's), scalar levers `base` has on are written off
explicitly, and a table lever cannot be turned off (TOML has no "unset"): refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tidal.trainer.memory.chunk_size import resolve_chunk_size

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class Levers:
    ac_mode: Literal["none", "full", "selective"] = "none"
    ac_freq: int = 1
    ac_targets: tuple[str, ...] = ("norm", "mlp")
    ac_offloading: bool = False
    max_inflight_activations: int = 4
    lm_head_chunk: int | Literal["auto"] | None = None  # tokens per chunk; None = full logits
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    compile: bool = False
    optim_offload: Literal["none", "cpu", "disk"] = "none"
    optim_buffer_mb: float = 64.0
    fsdp_cpu_offload: bool = False
    optimizer: Literal["adamw", "sgd"] = "adamw"
    momentum: float = 0.0
    impl: Literal["auto", "custom", "hf"] = "auto"  # which implementation runs the model
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def from_config(cls, trainer: Any) -> Levers:
        """The levers `trainer` (a `TrainerConfig`) sets, read by field name."""
        model, optim = trainer.model, trainer.optim
        ac = getattr(model, "ac", None)
        offloading = getattr(model, "ac_offloading", None)
        chunk = getattr(model, "fused_lm_head_token_chunk_size", "disabled")
        lora = getattr(model, "lora", None)
        if optim.optim_offload == "disk":
            optim_offload: Literal["none", "cpu", "disk"] = "disk"
        else:
            optim_offload = "cpu" if optim.optim_cpu_offload else "none"
        return cls(
            ac_mode=ac.mode if ac is not None else "none",
            ac_freq=ac.freq if ac is not None else 1,
            ac_targets=tuple(ac.targets) if ac is not None else ("norm", "mlp"),
            ac_offloading=offloading is not None,
            max_inflight_activations=(
                offloading.max_inflight_activations if offloading is not None else 4
            ),
            lm_head_chunk=None if chunk == "disabled" else chunk,
            lora_rank=lora.rank if lora is not None else None,
            lora_targets=tuple(lora.target_modules) if lora is not None else DEFAULT_LORA_TARGETS,
            compile=getattr(model, "compile", None) is not None,
            optim_offload=optim_offload,
            optim_buffer_mb=optim.optim_offload_buffer_mb,
            fsdp_cpu_offload=getattr(model, "fsdp_cpu_offload", False),
            optimizer=optim.type,
            momentum=optim.momentum,
            impl=getattr(model, "impl", "auto"),
        )

    def names(self) -> list[str]:
        """Short names of the levers that are on (for tables and reasoning)."""
        on = []
        if self.ac_mode == "full":
            on.append(f"ac full (every {self.ac_freq})")
        elif self.ac_mode == "selective":
            on.append(f"ac selective ({', '.join(self.ac_targets)})")
        if self.ac_offloading:
            on.append("activation offloading")
        if self.lm_head_chunk is not None:
            on.append(f"chunked LM head ({self.lm_head_chunk})")
        if self.lora_rank is not None:
            on.append(f"LoRA r={self.lora_rank}")
        if self.compile:
            on.append("compile")
        if self.optim_offload != "none":
            on.append(f"optimizer offload ({self.optim_offload})")
        if self.fsdp_cpu_offload:
            on.append("FSDP CPU offload")
        return on or ["none"]

    def to_toml(self, base: Levers | None = None) -> str:
        """The `[trainer.model]` / `[trainer.optim]` keys that give these levers when laid
        over a config whose levers are `base` (default: none on)."""
        was = base or Levers()
        if (self.ac_mode == "none" and was.ac_mode != "none") or (
            was.ac_offloading and not self.ac_offloading
        ):
            raise ValueError("an overlay cannot remove the config's [trainer.model.ac*] tables")
        model: list[str] = []
        if self.lm_head_chunk is not None:
            chunk = '"auto"' if self.lm_head_chunk == "auto" else str(self.lm_head_chunk)
            model.append(f"fused_lm_head_token_chunk_size = {chunk}")
        elif was.lm_head_chunk is not None:
            model.append('fused_lm_head_token_chunk_size = "disabled"')
        if self.fsdp_cpu_offload or was.fsdp_cpu_offload:
            model.append(f"fsdp_cpu_offload = {_toml_bool(self.fsdp_cpu_offload)}")
        tables = self._model_tables()
        optim: list[str] = []
        if "cpu" in (self.optim_offload, was.optim_offload):
            optim.append(f"optim_cpu_offload = {_toml_bool(self.optim_offload == 'cpu')}")
        if "disk" in (self.optim_offload, was.optim_offload):
            optim.append(f'optim_offload = "{"disk" if self.optim_offload == "disk" else "none"}"')
        out = []
        if model:
            out.append("[trainer.model]\n" + "\n".join(model) + "\n")
        out.extend(tables)
        if optim:
            out.append("[trainer.optim]\n" + "\n".join(optim) + "\n")
        return "\n".join(out) if out else "# no lever needed\n"

    def _model_tables(self) -> list[str]:
        """Complete `[trainer.model.*]` tables of the table levers that are on."""
        tables: list[str] = []
        if self.ac_mode != "none":
            targets = ", ".join(f'"{t}"' for t in self.ac_targets)
            tables.append(
                f'[trainer.model.ac]\nmode = "{self.ac_mode}"\nfreq = {self.ac_freq}\n'
                f"targets = [{targets}]\n"
            )
        if self.ac_offloading:
            tables.append(
                "[trainer.model.ac_offloading]\n"
                f"max_inflight_activations = {self.max_inflight_activations}\n"
            )
        if self.lora_rank is not None:
            targets = ", ".join(f'"{t}"' for t in self.lora_targets)
            tables.append(
                f"[trainer.model.lora]\nrank = {self.lora_rank}\ntarget_modules = [{targets}]\n"
            )
        if self.compile:
            tables.append("[trainer.model.compile]\n")
        return tables


def _toml_bool(value: bool) -> str:
    return "true" if value else "false"


def chunk_tokens(levers: Levers, vocab_size: int, tokens: int) -> int | None:
    """Tokens per LM-head chunk (None: unchunked), resolved as the trainer does."""
    if levers.lm_head_chunk is None:
        return None
    chunk = resolve_chunk_size(levers.lm_head_chunk, vocab_size)
    assert chunk is not None
    return min(tokens, chunk)
