"""Composes config layers (one file, the environment, all flags) knowing the config classes.

Tables merge key by key and anything else replaces. A tagged section whose tag a layer
changes is replaced by that layer's table, one given without its tag takes the default's.
A flag without a value is true for a boolean key and an error naming the flag for any
other (docs/config.md, "Composing a run").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from tidal.common.config.schema import (
    Section,
    Shape,
    Table,
    Tagged,
    Value,
    current_tag,
    field_default,
    field_shape,
    resolve,
)
from tidal.common.errors import ConfigError


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
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def merge_layer(
    cls: type[BaseModel], base: Mapping[str, Any], layer: Mapping[str, Any], default: Any = None
) -> dict[str, Any]:
    """`layer` merged over `base`, both raw data for `cls` whose default is `default`."""
    out = dict(base)
    for key, value in layer.items():
        if isinstance(default, BaseModel) and key in type(default).model_fields:
            key_default = getattr(default, key)
        else:
            key_default = field_default(cls, key)
        out[key] = _merge_value(field_shape(cls, key), out.get(key), value, key_default)
    return out


def _merge_value(shape: Shape | None, previous: Any, value: Any, default: Any) -> Any:
    if not isinstance(value, Mapping):
        return value
    base = previous if isinstance(previous, dict) else {}
    if isinstance(shape, Tagged):
        return _merge_tagged(shape, base, value, default)
    if isinstance(shape, Section):
        return merge_layer(shape.cls, base, value, default)
    if isinstance(shape, Table):
        out = dict(base)
        for key, item in value.items():
            out[key] = _merge_value(shape.value, out.get(key), item, PydanticUndefined)
        return out
    return deep_merge(base, value)


def _merge_tagged(
    tagged: Tagged, previous: dict[str, Any], layer: Mapping[str, Any], default: Any
) -> dict[str, Any]:
    old = current_tag(tagged, previous, default)
    new = layer.get(tagged.key, old)
    base = previous if new == old else {}
    variant = tagged.variant(new)
    if variant is None:  # an unknown tag: validation names it with the valid ones
        return deep_merge(base, layer)
    merged = merge_layer(variant, base, layer, default if isinstance(default, variant) else None)
    return {tagged.key: new, **merged}


def flag_layer(
    overrides: Sequence[tuple[str, str | None]], parse: Callable[[str], Any]
) -> dict[str, Any]:
    """One layer from `(dotted key, raw value)` pairs; a bare flag (None) is true until
    `check_bare_flags` has seen its key's type."""
    layer: dict[str, Any] = {}
    for key, raw in overrides:
        set_dotted(layer, key, True if raw is None else parse(raw))
    return layer


def _takes_bare_flag(shape: Shape | None) -> bool:
    if shape is None:  # unknown key: validation reports it, with the closest valid name
        return True
    return isinstance(shape, Value) and (shape.is_bool or shape.annotation is Any)


def check_bare_flags(
    cls: type[BaseModel], data: Mapping[str, Any], overrides: Sequence[tuple[str, str | None]]
) -> None:
    """Raise ConfigError naming a flag given without a value whose key is not boolean."""
    for key, raw in overrides:
        path, node = key_parts(key), data
        for part in path:
            node = node.get(part) if isinstance(node, Mapping) else None
        if raw is None and node is True and not _takes_bare_flag(resolve(cls, path, data)):
            raise ConfigError(
                f"--{key} needs a value (--{key} VALUE); only a boolean key may be given "
                "without one, meaning true"
            )
