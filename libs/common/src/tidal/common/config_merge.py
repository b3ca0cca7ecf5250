"""Composing config layers (files, environment, flags) with knowledge of the config classes.

Decisions:
- Layers merge in order; tables merge key by key, anything else replaces (lists too: a
  later `tasks` list is the whole mixture, not an append).
- A flag without a value (`--orchestrator.resume`) means true for a boolean key only; for
  any other known key it is an error naming the flag (it used to become `true`, which
  pydantic read as 1: `--trainer.optim.lr` trained with lr = 1.0). Where the type is not
  known (an unknown key, a free-form table) it stays `true`: validation then names an
  unknown key with the closest valid one, and free-form values are the reader's to judge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from tidal.common.config_schema import Shape, Value, resolve
from tidal.common.errors import ConfigError


class _BareFlag:
    """Placeholder for a flag given without a value, until its key's type is known."""

    def __repr__(self) -> str:
        return "<flag without value>"


BARE_FLAG = _BareFlag()


def key_parts(dotted: str) -> list[str]:
    """`a.b-c` → ["a", "b_c"]: flags may be kebab-case, TOML keys are snake_case."""
    return [part.replace("-", "_") for part in dotted.split(".")]


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Merge `update` into a copy of `base`; tables merge, everything else replaces."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b-c` (kebab or snake case) to value, creating tables on the way."""
    *parents, last = key_parts(dotted)
    node = data
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[last] = value


def flag_layer(
    overrides: Sequence[tuple[str, str | None]], parse: Callable[[str], Any]
) -> dict[str, Any]:
    """One layer from `(dotted key, raw value)` pairs; None (a bare flag) is a placeholder
    that `resolve_bare_flags` turns into true or an error."""
    layer: dict[str, Any] = {}
    for key, raw in overrides:
        set_dotted(layer, key, BARE_FLAG if raw is None else parse(raw))
    return layer


def _bare_paths(data: Mapping[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for key, value in data.items():
        if value is BARE_FLAG:
            yield (*path, key)
        elif isinstance(value, Mapping):
            yield from _bare_paths(value, (*path, key))


def _takes_bare_flag(shape: Shape | None) -> bool:
    if shape is None:  # unknown key: validation reports it, with the closest valid name
        return True
    return isinstance(shape, Value) and (shape.is_bool or shape.annotation is Any)


def resolve_bare_flags(
    cls: type[BaseModel], data: dict[str, Any], overrides: Sequence[tuple[str, str | None]]
) -> None:
    """Set every bare flag left in `data` to true, or raise ConfigError naming the flag."""
    flags = {tuple(key_parts(key)): f"--{key}" for key, raw in overrides if raw is None}
    for path in list(_bare_paths(data)):
        if not _takes_bare_flag(resolve(cls, list(path), data)):
            flag = flags.get(path, "--" + ".".join(path))
            raise ConfigError(
                f"{flag} needs a value ({flag} VALUE); only a boolean key may be given "
                "without one, meaning true"
            )
        node = data
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = True
