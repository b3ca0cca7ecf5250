"""What a key of a config class is: a section, a tagged section, a list, a table or a value.

Read from the annotations pydantic already holds, so there is no second schema to keep in
sync and a new tagged section needs no registration. Only string discriminators are
understood; a tagged section's variant comes from the data's tag, else the field's
default. `FIRST` marks the keys the short `--help` lists.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Discriminator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


class _First:
    """Field marker, `lr: Annotated[float, FIRST] = 1e-3`: a key users set first, listed
    by the short `--help` (the one place that choice is made, beside the field)."""

    def __repr__(self) -> str:
        return "FIRST"


FIRST = _First()


@dataclass(frozen=True)
class Section:
    """A nested config model; `optional` when the field may be unset (None)."""

    cls: type[BaseModel]
    optional: bool = False


@dataclass(frozen=True)
class Tagged:
    """A union of config models told apart by the value of their `key` field."""

    key: str
    variants: tuple[tuple[str, type[BaseModel]], ...]
    optional: bool = False

    def variant(self, tag: Any) -> type[BaseModel] | None:
        return next((cls for name, cls in self.variants if name == tag), None)

    @property
    def tags(self) -> list[str]:
        return [name for name, _ in self.variants]


@dataclass(frozen=True)
class ListOf:
    """A list (TOML array) whose entries have shape `item`."""

    item: Shape


@dataclass(frozen=True)
class Table:
    """A free-form table (`dict[str, X]`): any key, values of shape `value`."""

    value: Shape


@dataclass(frozen=True)
class Value:
    """Anything else: a leaf the user sets as one TOML value."""

    annotation: Any

    @property
    def is_bool(self) -> bool:
        members = typing.get_args(self.annotation) if is_union(self.annotation) else ()
        members = tuple(m for m in members if m is not type(None)) or (self.annotation,)
        return all(m is bool for m in members)


Shape = Section | Tagged | ListOf | Table | Value


def is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _discriminator_of(metadata: typing.Iterable[Any]) -> str | None:
    for item in metadata:
        found = item.discriminator if isinstance(item, FieldInfo | Discriminator) else None
        if isinstance(found, Discriminator):
            found = found.discriminator
        if isinstance(found, str):
            return found
    return None


def _tags(cls: type[BaseModel], key: str) -> list[str]:
    info = cls.model_fields.get(key)
    if info is None or typing.get_origin(info.annotation) is not typing.Literal:
        return []
    return [str(tag) for tag in typing.get_args(info.annotation)]


def shape_of(annotation: Any, discriminator: str | None = None) -> Shape:
    """What a value of `annotation` is, to the loader (see the module docstring)."""
    if typing.get_origin(annotation) is typing.Annotated:
        inner, *metadata = typing.get_args(annotation)
        return shape_of(inner, _discriminator_of(metadata) or discriminator)
    if is_union(annotation):
        members = [m for m in typing.get_args(annotation) if m is not type(None)]
        optional = len(members) < len(typing.get_args(annotation))
        if len(members) == 1:
            inner = shape_of(members[0], discriminator)
            if isinstance(inner, Section | Tagged):
                return dataclasses.replace(inner, optional=optional)
            return Value(annotation)
        models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
        if discriminator is not None and len(models) == len(members):
            variants = tuple((tag, cls) for cls in models for tag in _tags(cls, discriminator))
            return Tagged(discriminator, variants, optional)
        return Value(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return Section(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and len(args) == 1:
        return ListOf(shape_of(args[0]))
    if origin is dict and len(args) == 2:
        return Table(shape_of(args[1]))
    return Value(annotation)


def field_shape(cls: type[BaseModel], name: str) -> Shape | None:
    """The shape of field `name` of `cls`, or None when `cls` has no such field."""
    info = cls.model_fields.get(name)
    if info is None:
        return None
    return shape_of(info.annotation, _discriminator_of([info]))


def field_default(cls: type[BaseModel], name: str) -> Any:
    """The field's default value (factories called); PydanticUndefined when required."""
    info = cls.model_fields.get(name)
    if info is None or info.is_required():
        return PydanticUndefined
    return info.get_default(call_default_factory=True)


def current_tag(tagged: Tagged, data: Any, default: Any) -> Any:
    """The tag in effect: the data's own, else the default model's, else None."""
    if isinstance(data, Mapping) and tagged.key in data:
        return data[tagged.key]
    return getattr(default, tagged.key, None) if isinstance(default, BaseModel) else None


def resolve(cls: type[BaseModel], parts: list[str], data: Mapping[str, Any]) -> Shape | None:
    """The shape of the key at `parts` below `cls`, given the composed `data` (which picks
    the variant of tagged sections); None when no such key exists. Inside free-form
    tables and plain values the shape is `Value(Any)`: the loader cannot know more."""
    shape: Shape | None = Section(cls)
    node: Any = data
    default: Any = None
    for part in parts:
        if isinstance(shape, Tagged):
            shape = _as_section(shape, node, default)
        if isinstance(shape, Section):
            owner = shape.cls
            shape = field_shape(owner, part)
            default = getattr(default, part, None) if isinstance(default, BaseModel) else None
            if default is None:
                default = field_default(owner, part)
        elif isinstance(shape, Table):
            shape = shape.value
        elif shape is None:
            return None
        else:  # inside a list or a plain value: nothing more is known
            return Value(Any)
        node = node.get(part) if isinstance(node, Mapping) else None
    return shape


def _as_section(tagged: Tagged, node: Any, default: Any) -> Section | None:
    variant = tagged.variant(current_tag(tagged, node, default))
    return None if variant is None else Section(variant)
