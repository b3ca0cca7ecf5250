"""`--help` for config classes: every key a user can set, with its default and docstring.

Decisions:
- Keys are spelt as in TOML (`--run.output_dir`); flags accept that spelling and the
  kebab-case one alike, so one spelling serves the flag and the file.
- Defaults print as TOML values (`"outputs"`, `[0.9, 0.95]`, `{}`), never Python reprs; a
  key without a default says `required`, a None default says `unset` (TOML has no null).
- Like a TOML file, a table's own keys come first, then its sub-tables, each under a
  `[table]` header carrying the field's docstring.
- Optional sections (`lora: LoRAConfig | None = None`) list their keys too, under a header
  saying the section is off until one of its keys is set.
- A tagged section lists its tag with the valid types (each with its class docstring),
  the keys every type shares once, then each type's own keys marked `type = "..."`: keys
  of types other than the default are what users most need to find.
- A list of sections (`[[orchestrator.tasks]]`) points at a field of the same shape when
  there is one, else lists its entries' keys under `key[]`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from typing import Any

import tomli_w
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from tidal.common.config.schema import ListOf, Section, Shape, Tagged, field_default, field_shape

INDENT = "      "


def toml_value(value: Any) -> str:
    """A value as it would be written in TOML; None (no TOML spelling) as `unset`."""
    value = to_jsonable_python(value)
    if value is None:
        return "unset"
    if isinstance(value, dict):
        items = (f"{_toml_key(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return tomli_w.dumps({"v": value})[len("v = ") :].strip()


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def option_line(flag: str, default: Any, doc: str | None, notes: tuple[str, ...] = ()) -> str:
    """`  --flag (default: X; note)` and the docstring below it."""
    shown = "required" if default is PydanticUndefined else f"default: {toml_value(default)}"
    text = f"  {flag} ({'; '.join((shown, *notes))})"
    doc = " ".join((doc or "").split())
    return f"{text}\n{INDENT}{doc}" if doc else text


def _default(cls: type[BaseModel], name: str, instance: Any) -> Any:
    if isinstance(instance, cls) and name in type(instance).model_fields:
        return getattr(instance, name)
    return field_default(cls, name)


class _Renderer:
    """Walks the config classes from `root`; each method yields help lines."""

    def __init__(self, root: type[BaseModel]) -> None:
        self.root = root

    def section(
        self,
        cls: type[BaseModel],
        prefix: str,
        instance: Any,
        notes: tuple[str, ...],
        skip: frozenset[str] = frozenset(),
    ) -> Iterator[str]:
        subsections = []
        for name, info in cls.model_fields.items():
            if name in skip:
                continue
            shape, default = field_shape(cls, name), _default(cls, name, instance)
            if isinstance(shape, Section | Tagged):
                subsections.append((name, info, shape, default))
            else:
                yield self.leaf(prefix + name, shape, default, info, notes)
        for name, info, shape, default in subsections:
            yield from self.subsection(prefix + name, info, shape, default, notes)

    def leaf(
        self, key: str, shape: Shape | None, default: Any, info: FieldInfo, notes: tuple[str, ...]
    ) -> str:
        line = option_line(f"--{key}", default, info.description, notes)
        if isinstance(shape, ListOf) and isinstance(shape.item, Section | Tagged):
            same = _find(shape.item, self.root, "")
            if same is not None:
                return f"{line}\n{INDENT}Each [[{key}]] entry takes the keys of {same}."
            entries = "\n".join(self.subsection(f"{key}[]", info, shape.item, None, notes))
            return f"{line}\n{entries}"
        return line

    def subsection(
        self,
        key: str,
        info: FieldInfo,
        shape: Section | Tagged,
        default: Any,
        notes: tuple[str, ...],
    ) -> Iterator[str]:
        doc = " ".join((info.description or "").split())
        yield f"\n[{key}]" + (f"  {doc}" if doc else "")
        if shape.optional and default is None:
            yield f"{INDENT}Optional: unset by default; setting any of its keys turns it on."
        if isinstance(shape, Section):
            yield from self.section(shape.cls, f"{key}.", default, notes)
        else:
            yield from self.tagged(key, shape, default, notes)

    def tagged(
        self, key: str, shape: Tagged, default: Any, notes: tuple[str, ...]
    ) -> Iterator[str]:
        variants = [cls for _, cls in shape.variants]
        first = next((cls for cls in variants if isinstance(default, cls)), variants[0])
        yield f"{INDENT}`{shape.key}` picks the keys below; a new {shape.key} replaces the section."
        tag = getattr(default, shape.key, PydanticUndefined)
        choices = "one of " + ", ".join(toml_value(t) for t in shape.tags)
        yield option_line(f"--{key}.{shape.key}", tag, None, (*notes, choices))
        for tag_value, cls in shape.variants:
            doc = _summary(cls) or cls.model_fields[shape.key].description or ""
            yield f"{INDENT}{toml_value(tag_value)}: {doc}".rstrip()
        shared = frozenset(
            name
            for name in first.model_fields
            if all(_same_field(first, c, name) for c in variants)
        )
        not_shared = frozenset(first.model_fields) - shared
        yield from self.section(first, f"{key}.", default, notes, skip=not_shared | {shape.key})
        for tag_value, cls in shape.variants:
            note = f"{shape.key} = {toml_value(tag_value)}"
            skip = shared | {shape.key}
            yield from self.section(cls, f"{key}.", default, (*notes, note), skip=skip)


def _summary(cls: type[BaseModel]) -> str:
    """The first paragraph of a class's own docstring (not inherited), on one line."""
    doc = cls.__dict__.get("__doc__") or ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def _same_field(a: type[BaseModel], b: type[BaseModel], name: str) -> bool:
    """Whether `name` means the same in both variants (type, doc and default)."""
    if name not in b.model_fields:
        return False
    fa, fb = a.model_fields[name], b.model_fields[name]
    same_default = field_default(a, name) == field_default(b, name)
    return fa.annotation == fb.annotation and fa.description == fb.description and same_default


def _find(target: Section | Tagged, cls: type[BaseModel], prefix: str) -> str | None:
    """The first key below `cls` holding a section shaped like `target` (optional or not)."""
    wanted = dataclasses.replace(target, optional=False)
    for name in cls.model_fields:
        child = field_shape(cls, name)
        if isinstance(child, Section | Tagged):
            if dataclasses.replace(child, optional=False) == wanted:
                return prefix + name
            inner = child.cls if isinstance(child, Section) else None
            found = None if inner is None else _find(target, inner, f"{prefix}{name}.")
            if found is not None:
                return found
    return None


def help_text(cls: type[BaseModel]) -> str:
    """Every key of `cls` a user can set, one entry each (see the module docstring)."""
    return "\n".join(_Renderer(cls).section(cls, "", None, ()))
