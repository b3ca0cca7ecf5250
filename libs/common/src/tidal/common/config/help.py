"""The config classes as a reference: a heading per section, a line per key a user can set.

One walk (`entries`) serves `--help` (short, one section, or all) and docs/config.md, so
the two never disagree. Keys are spelt as in TOML and defaults written as TOML values; a
table's own keys come before its sub-tables, as in a TOML file. docs/config.md says how
optional, tagged and list sections read.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import textwrap
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import tomli_w
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from tidal.common.config.schema import (
    FIRST,
    ListOf,
    Section,
    Shape,
    Tagged,
    field_default,
    field_shape,
    is_union,
)
from tidal.common.errors import ConfigError

INDENT = "      "


@dataclass(frozen=True)
class Key:
    path: str
    kind: str
    """The value's type as a user reads it (`int`, `"a" | "b"`, `list[str]`)."""
    default: Any
    """PydanticUndefined when the key is required."""
    doc: str
    notes: tuple[str, ...] = ()
    """Shown beside the default: the variant a key belongs to (`type = "countdown"`)."""
    tag: bool = False
    """The key choosing a tagged section's variant; `kind` lists its choices."""
    first: bool = False
    """Marked `FIRST`: listed by the short `--help`."""
    more: tuple[str, ...] = ()
    """Lines below the docstring: each variant of a tag, where a list's entries are listed."""


@dataclass(frozen=True)
class Heading:
    path: str
    doc: str
    notes: tuple[str, ...] = ()


Entry = Key | Heading


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


def type_name(annotation: Any) -> str:
    """`float`, `int | None`, `"a" | "b"`, `list[str]`: a type as a config user reads it."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(toml_value(arg) for arg in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if is_union(annotation):
        return " | ".join(type_name(arg) for arg in args)
    if args:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(map(type_name, args))}]"
    if annotation is Ellipsis:
        return "..."
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def option_line(flag: str, default: Any, doc: str | None, notes: tuple[str, ...] = ()) -> str:
    """`  --flag (default: X; note)` and the docstring below it."""
    shown = "required" if default is PydanticUndefined else f"default: {toml_value(default)}"
    return "\n".join([f"  {flag} ({'; '.join((shown, *notes))})", *_wrap(doc)])


def _wrap(text: str | None) -> list[str]:
    return textwrap.wrap(_one_line(text), 92, initial_indent=INDENT, subsequent_indent=INDENT)


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())


def _default(cls: type[BaseModel], name: str, instance: Any) -> Any:
    if isinstance(instance, cls) and name in type(instance).model_fields:
        return getattr(instance, name)
    return field_default(cls, name)


class _Walk:
    """Walks the config classes from `root`; each method yields entries."""

    def __init__(self, root: type[BaseModel]) -> None:
        self.root = root

    def section(
        self,
        cls: type[BaseModel],
        prefix: str,
        instance: Any,
        notes: tuple[str, ...],
        skip: frozenset[str] = frozenset(),
    ) -> Iterator[Entry]:
        subsections = []
        for name, info in cls.model_fields.items():
            if name in skip:
                continue
            shape, default = field_shape(cls, name), _default(cls, name, instance)
            if isinstance(shape, Section | Tagged):
                subsections.append((name, info, shape, default))
            else:
                yield from self.leaf(prefix + name, shape, default, info, notes)
        for name, info, shape, default in subsections:
            yield from self.subsection(prefix + name, info, shape, default, notes)

    def leaf(
        self, key: str, shape: Shape | None, default: Any, info: FieldInfo, notes: tuple[str, ...]
    ) -> Iterator[Entry]:
        item = shape.item if isinstance(shape, ListOf) else None
        same = _find(item, self.root, "") if isinstance(item, Section | Tagged) else None
        more = (f"Each [[{key}]] entry takes the keys of {same}.",) if same else ()
        doc, first = _one_line(info.description), FIRST in info.metadata
        yield Key(key, type_name(info.annotation), default, doc, notes, False, first, more)
        if isinstance(item, Section | Tagged) and same is None:
            yield from self.subsection(f"{key}[]", info, item, None, notes)

    def subsection(
        self,
        key: str,
        info: FieldInfo,
        shape: Section | Tagged,
        default: Any,
        notes: tuple[str, ...],
    ) -> Iterator[Entry]:
        extra: tuple[str, ...] = ()
        if shape.optional and default is None:
            extra = ("Optional: unset by default; setting any of its keys turns it on.",)
        if isinstance(shape, Section):
            yield Heading(key, _one_line(info.description), extra)
            yield from self.section(shape.cls, f"{key}.", default, notes)
            return
        tag_key, variants = shape.key, [cls for _, cls in shape.variants]
        picks = f"`{tag_key}` picks the keys below; a new {tag_key} replaces the section."
        yield Heading(key, _one_line(info.description), (*extra, picks))
        kinds = tuple(
            f"{toml_value(tag)}: {_summary(cls) or cls.model_fields[tag_key].description or ''}"
            for tag, cls in shape.variants
        )
        tag = getattr(default, tag_key, PydanticUndefined)
        kind = " | ".join(toml_value(t) for t in shape.tags)
        yield Key(f"{key}.{tag_key}", kind, tag, "", notes, True, FIRST in info.metadata, kinds)
        chosen = next((cls for cls in variants if isinstance(default, cls)), variants[0])
        shared = frozenset(
            n for n in chosen.model_fields if all(_same_field(chosen, c, n) for c in variants)
        )
        not_shared = frozenset(chosen.model_fields) - shared
        yield from self.section(chosen, f"{key}.", default, notes, not_shared | {tag_key})
        for tag_value, cls in shape.variants:
            note = f"{tag_key} = {toml_value(tag_value)}"
            yield from self.section(cls, f"{key}.", default, (*notes, note), shared | {tag_key})


def _summary(cls: type[BaseModel]) -> str:
    """The first paragraph of a class's own docstring (not inherited), on one line."""
    return _one_line((cls.__dict__.get("__doc__") or "").strip().split("\n\n")[0])


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


def entries(cls: type[BaseModel]) -> list[Entry]:
    """Every section and key of `cls`, in the order a TOML file would hold them."""
    return list(_Walk(cls).section(cls, "", None, ()))


def render(entry: Entry) -> str:
    """One entry as `--help` prints it."""
    if isinstance(entry, Heading):
        head = f"\n[{entry.path}]" + (f"  {entry.doc}" if entry.doc else "")
        return "\n".join([head, *(line for note in entry.notes for line in _wrap(note))])
    choices = (f"one of {entry.kind.replace(' | ', ', ')}",) if entry.tag else ()
    line = option_line(f"--{entry.path}", entry.default, entry.doc, (*entry.notes, *choices))
    return "\n".join([line, *(line for more in entry.more for line in _wrap(more))])


def _select(items: list[Entry], section: str) -> list[Entry]:
    want = section.replace("-", "_")
    chosen = [e for e in items if e.path == want or e.path.startswith((f"{want}.", f"{want}["))]
    if chosen:
        return chosen
    paths = list(dict.fromkeys(e.path for e in items if "[]" not in e.path))
    close = [p for p in paths if p.endswith(f".{want}")][:3]
    close = close or difflib.get_close_matches(want, paths, n=1, cutoff=0.6)
    tops = [e.path for e in items if isinstance(e, Heading) and "." not in e.path]
    hint = " or ".join(f"'{p}'" for p in close)
    hint = f"did you mean {hint}?" if close else f"sections: {', '.join(tops)}, or all"
    raise ConfigError(f"--help {section}: no such section or key; {hint}")


def _section_index(items: list[Entry]) -> list[str]:
    """The sections, one line per top-level section with sub-sections."""
    headings = [e.path for e in items if isinstance(e, Heading) and "[]" not in e.path]
    tops = [h for h in headings if "." not in h]
    lone = [t for t in tops if not any(h.startswith(f"{t}.") for h in headings)]
    lines = [", ".join(lone)] if lone else []
    for top in (t for t in tops if t not in lone):
        subs = [h[len(top) + 1 :] for h in headings if h.startswith(f"{top}.")]
        lines.append(f"{top}: {', '.join(subs)}")
    wrap = textwrap.TextWrapper(width=92, initial_indent="  ", subsequent_indent=INDENT)
    return [wrapped for line in lines for wrapped in wrap.wrap(line)]


def help_text(cls: type[BaseModel], section: str = "all") -> str:
    """`--help` of `cls`: "" the keys marked FIRST and the sections, "all" every key, else
    one section or key; an unknown one raises ConfigError naming the closest."""
    items = entries(cls)
    if section:
        chosen = items if section == "all" else _select(items, section)
        return "\n".join(render(entry) for entry in chosen).lstrip("\n")
    first = [render(e) for e in items if isinstance(e, Key) and e.first]
    head = ["Keys set first:", *first, ""] if first else []
    more = "Sections (`--help SECTION` lists one section or key, `--help all` every key):"
    return "\n".join([*head, more, *_section_index(items)])
