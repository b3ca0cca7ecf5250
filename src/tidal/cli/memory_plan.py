"""`tidal plan @ cfg.toml --memory 80GiB [...]`: the memory planner's command line.

The planner's own flags are `PlanOptions`' fields (their spelling and help alike), split
off before the rest loads as an ordinary run config, so any `tidal rl` config plans as it
is, without importing torch. `--fit` prints a TOML overlay of the run config
(docs/memory-planner.md).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from tidal.cli.config import RunConfig
from tidal.common.config.help import help_text, option_line
from tidal.common.config.loading import BaseConfig, ConfigError, load_config, split_argv
from tidal.common.config.schema import field_default
from tidal.trainer.memory_planner.estimate import (
    MemoryPlan,
    Workload,
    activation_per_layer,
    plan_memory,
    resolve_precision,
)
from tidal.trainer.memory_planner.fit import fit
from tidal.trainer.memory_planner.levers import Levers
from tidal.trainer.memory_planner.model_size import param_counts

USAGE = "tidal plan @ cfg.toml --memory 80GiB [--world-size N] [--tokens N] [--fit] [--json]"
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """ "80GiB", "80 GB", "512MiB", "1e9" → bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", text)
    if m is None or m.group(2).lower() not in UNITS:
        raise ValueError(f"memory {text!r} is not a size like 80GiB, 24GB or 512MiB")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


class PlanOptions(BaseConfig):
    memory: int
    """Memory budget per rank, e.g. 80GiB (binary) or 80GB (decimal)."""
    world_size: int | None = Field(default=None, gt=0)
    """Ranks the model states are sharded over (FSDP full shard when > 1); default the
    run's trainer.world_size."""
    tokens: int | None = Field(default=None, gt=0)
    """Tokens per micro-batch; default the run's orchestrator.packing.micro_batch_tokens."""
    device: Literal["cpu", "cuda"] = "cuda"
    """What the budget is: GPU memory ("cuda") or host memory of a CPU run ("cpu")."""
    fit: bool = False
    """Pick the cheapest lever combination that fits and print the TOML to paste."""
    json_output: bool = Field(default=False, alias="json")
    """Print JSON (for tools) instead of a table."""

    @field_validator("memory", mode="before")
    @classmethod
    def _size(cls, value: Any) -> int:
        return parse_bytes(str(value))


def _flag(name: str) -> str:
    return "--" + (PlanOptions.model_fields[name].alias or name).replace("_", "-")


def plan_flags() -> dict[str, tuple[str, bool]]:
    """`--flag` → (the key `PlanOptions` validates it as, whether it is a switch)."""
    return {
        _flag(name): (info.alias or name, info.annotation is bool)
        for name, info in PlanOptions.model_fields.items()
    }


def split_plan_args(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """The planner's flags, and everything else (config files and overrides)."""
    flags = plan_flags()
    own: dict[str, Any] = {}
    rest: list[str] = []
    args = list(argv)
    while args:
        token = args.pop(0)
        flag, eq, value = token.partition("=")
        if flag not in flags:
            rest.append(token)
            continue
        key, switch = flags[flag]
        if eq:
            own[key] = value
        elif switch:
            own[key] = True
        elif args and not args[0].startswith(("--", "@")):
            own[key] = args.pop(0)
        else:
            raise ConfigError(f"{flag} needs a value")
    return own, rest


def plan_help() -> str:
    """The planner's own flags; the run config's keys are `tidal rl --help`'s."""
    lines = [f"usage: {USAGE}", "", "options:"]
    for name, info in PlanOptions.model_fields.items():
        lines.append(option_line(_flag(name), field_default(PlanOptions, name), info.description))
    lines.append(
        "\nAny run config key may follow as --section.key value: `--help SECTION` lists a "
        "section's keys (`--help trainer.model`), `tidal rl --help` the sections."
    )
    return "\n".join(lines)


def _gib(n: float) -> str:
    return f"{n / 2**30:8.2f} GiB"


def report(plan: MemoryPlan, budget: int, levers: Levers) -> str:
    lines = [f"levers: {', '.join(levers.names())}"]
    lines += [f"  {name:<24}{_gib(value)}" for name, value in plan.items.items()]
    verdict = "fits" if plan.peak <= budget else "does NOT fit"
    lines.append(f"  {'peak per rank':<24}{_gib(plan.peak)}  ({verdict} in {_gib(budget).strip()})")
    lines += [f"  note: {n}" for n in plan.notes]
    return "\n".join(lines)


def overlay(found: Levers, configured: Levers, world_size: int, config_world_size: int) -> str:
    """The TOML that turns the run config (levers `configured`, `config_world_size` ranks)
    into the planned one."""
    toml = found.to_toml(configured)
    if world_size == config_world_size:
        return toml
    head = f"[trainer]\nworld_size = {world_size}\n"
    return head if toml.startswith("# no lever needed") else f"{head}\n{toml}"


def run(argv: Sequence[str]) -> tuple[str, int]:
    """The planner's output and exit code (0 fits / found a fit, 1 does not)."""
    own, rest = split_plan_args(argv)
    try:
        options = PlanOptions.model_validate(own)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise ConfigError(f"plan option {error['loc'][0]}: {error['msg']}") from None
    config, _ = load_config(RunConfig, rest)
    args = config.trainer.model.decoder_args()
    tokens = options.tokens or config.orchestrator.packing.micro_batch_tokens
    world_size = options.world_size or config.trainer.world_size
    precision = resolve_precision(
        config.trainer.precision, options.device, param_counts(args).total
    )
    workload = Workload(tokens, world_size, options.device, precision)
    levers = Levers.from_config(config.trainer)
    plan = plan_memory(args, levers, workload)
    found = fit(args, levers, workload, options.memory) if options.fit else None
    if options.json_output:
        out: dict[str, Any] = {
            "parameters": param_counts(args).total,
            "tokens_per_micro_batch": tokens,
            "world_size": world_size,
            "precision": precision,
            "budget_bytes": options.memory,
            "current": {"levers": levers.names(), "items": plan.items, "peak": plan.peak},
            "activation_bytes_per_layer": activation_per_layer(args, workload),
        }
        if options.fit:
            out["fit"] = (
                None
                if found is None
                else {
                    "levers": found.levers.names(),
                    "items": found.plan.items,
                    "peak": found.plan.peak,
                    "step_time_factor": found.cost,
                    "reasons": found.reasons,
                    "toml": overlay(found.levers, levers, world_size, config.trainer.world_size),
                }
            )
        code = 0 if (found is not None if options.fit else plan.peak <= options.memory) else 1
        return json.dumps(out, indent=2), code
    head = f"{param_counts(args).total / 1e6:,.1f}M parameters, {tokens} tokens per micro-batch, "
    head += f"world size {world_size}, {options.device}, {precision}"
    per_layer = activation_per_layer(args, workload)
    text = [head, report(plan, options.memory, levers), "  activations per layer:"]
    text += [f"    {name:<22}{value / 2**20:10.1f} MiB" for name, value in per_layer.items()]
    if not options.fit:
        return "\n".join(text), 0 if plan.peak <= options.memory else 1
    if found is None:
        text.append(
            "\nno lever combination fits: raise --world-size, shorten micro-batches or use LoRA"
        )
        return "\n".join(text), 1
    text.append("\ncheapest combination that fits:")
    text.append(report(found.plan, options.memory, found.levers))
    reasons = found.reasons or ["the config fits as it is"]
    text.append(f"  predicted step time ×{found.cost:.2f}: " + "; ".join(reasons))
    toml = overlay(found.levers, levers, world_size, config.trainer.world_size)
    text.append("\npaste into the run config (or lay it over it with @):\n" + toml)
    return "\n".join(text), 0


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        section = split_argv(args).help
        if section is not None:
            print(help_text(RunConfig, section) if section else plan_help())
            raise SystemExit(0)
        text, code = run(args)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(text)
    raise SystemExit(code)
