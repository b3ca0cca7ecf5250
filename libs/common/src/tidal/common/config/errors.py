"""pydantic's validation errors as one line each, naming keys the way users write them.

`locate` walks an error location through the config classes, dropping the tag and union
member names pydantic puts in it. An unknown key names the closest valid key (in a tagged
section, the type it belongs to), a moved key its replacement (`moved_keys`), a bad tag
the valid types; docs/config.md, "Errors", shows the messages.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from tidal.common.config.help import toml_value
from tidal.common.config.schema import ListOf, Section, Shape, Table, Tagged, field_shape


@dataclass
class _Location:
    path: str
    """The user's dotted key (tags and union member names dropped)."""
    shape: Shape | None
    """What the location holds; None for a key its section does not have."""
    owner: type[BaseModel] | None = None
    """The config class the last key was looked up in."""
    tagged: tuple[str, Tagged, str] | None = None
    """(section path, tagged section, chosen tag) when `owner` is a variant."""


def _join(path: str, key: Any) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key)


def locate(cls: type[BaseModel], loc: tuple[int | str, ...]) -> _Location:
    """Walk a pydantic error location through the config classes."""
    here = _Location("", Section(cls))
    entered: tuple[str, Tagged, str] | None = None
    for part in loc:
        shape = here.shape
        if isinstance(shape, Tagged) and (variant := shape.variant(part)) is not None:
            entered = (here.path, shape, str(part))
            here.shape = Section(variant)
        elif isinstance(shape, Section):
            here = _Location(_join(here.path, part), field_shape(shape.cls, str(part)))
            here.owner, here.tagged, entered = shape.cls, entered, None
        elif isinstance(shape, ListOf):
            here = _Location(_join(here.path, part), shape.item)
        elif isinstance(shape, Table):
            here = _Location(_join(here.path, part), shape.value)
        elif isinstance(part, int):  # an element of a tuple or an untyped list
            here = _Location(_join(here.path, part), None)
        # else: the name of a plain union's member, not part of the user's key
    return here


def _unknown_key(cls: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    here = locate(cls, loc)
    key = str(loc[-1])
    parent = here.path[: -len(key)].rstrip(".")
    moved = getattr(here.owner, "moved_keys", {}).get(key)
    if moved is not None:
        until = getattr(here.owner, "moved_keys_until", "")
        until = f" (this pointer is removed after {until})" if until else ""
        return f"unknown key '{here.path}'; the key moved, it was replaced by '{moved}'{until}"
    valid = sorted(here.owner.model_fields) if here.owner is not None else []
    choices = f"valid keys here: {', '.join(valid)}" if valid else ""
    if here.tagged is not None:
        section, tagged, tag = here.tagged
        owners = [toml_value(t) for t, c in tagged.variants if t != tag and key in c.model_fields]
        where = f" for {section}.{tagged.key} = {toml_value(tag)}"
        where += f" (it is a key of type {' and '.join(owners)})" if owners else ""
        if owners or not choices:
            return f"unknown key '{here.path}'{where}" + (f"; {choices}" if choices else "")
    else:
        where = ""
    close = difflib.get_close_matches(key.replace("-", "_"), valid, n=1, cutoff=0.5)
    hint = f"did you mean '{_join(parent, close[0])}'?" if close else choices
    return f"unknown key '{here.path}'{where}" + (f"; {hint}" if hint else "")


def _bad_tag(cls: type[BaseModel], error: Mapping[str, Any]) -> str:
    here = locate(cls, error["loc"])
    if not isinstance(here.shape, Tagged):
        return f"'{here.path}': {error['msg']}"
    key, tags = _join(here.path, here.shape.key), here.shape.tags
    if error["type"] == "union_tag_not_found":
        return f"'{here.path}': no {here.shape.key} given; set {key} to one of: {', '.join(tags)}"
    tag = str((error.get("ctx") or {}).get("tag", ""))
    close = difflib.get_close_matches(tag, tags, n=1, cutoff=0.5)
    hint = f"; did you mean {toml_value(close[0])}?" if close else ""
    return f"'{key}': unknown type {toml_value(tag)}; valid types: {', '.join(tags)}{hint}"


def describe_error(cls: type[BaseModel], error: Mapping[str, Any]) -> str:
    """One line for one of pydantic's errors on data validated as `cls`."""
    if error["type"] == "extra_forbidden":
        return _unknown_key(cls, error["loc"])
    if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        return _bad_tag(cls, error)
    path = locate(cls, error["loc"]).path
    where = f"'{path}': " if path else ""
    return f"{where}{error['msg']} (got {error.get('input')!r})"
