"""`--help` lists the keys set first, one section, or every key, with defaults as TOML values."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import Field

from tidal.common.config.help import type_name
from tidal.common.config.loading import BaseConfig, ConfigError, help_text
from tidal.common.config.schema import FIRST


class Circle(BaseConfig):
    type: Literal["circle"] = "circle"
    """Shape kind."""
    radius: float = 1.0
    """Circle radius."""
    label: str = ""
    """Caption."""


class Square(BaseConfig):
    type: Literal["square"] = "square"
    """Shape kind."""
    side: float = 1.0
    """Square side."""
    label: str = ""
    """Caption."""


Shape = Annotated[Circle | Square, Field(discriminator="type")]


class Lora(BaseConfig):
    rank: int = 8
    """Adapter rank."""


class Data(BaseConfig):
    path: Path
    """Where the data is."""


class Run(BaseConfig):
    name: Annotated[str, FIRST] = "run"
    """Run name."""
    output_dir: Path = Path("outputs")
    """Output folder."""
    betas: tuple[float, float] = (0.9, 0.95)
    """Adam betas."""
    seed: int | None = None
    """Seed; unset means random."""
    shape: Annotated[Shape, FIRST] = Circle()
    """What to draw."""
    lora: Lora | None = None
    """Adapters; unset = off."""
    data: Data | None = None
    """Training data."""


def line(text: str, key: str) -> str:
    return next(ln for ln in text.splitlines() if ln.strip().startswith(f"--{key} "))


def test_defaults_are_toml_values() -> None:
    text = help_text(Run)
    assert '(default: "outputs")' in line(text, "output_dir")
    assert "(default: [0.9, 0.95])" in line(text, "betas")
    assert "PosixPath" not in text


def test_keys_are_spelt_as_in_toml() -> None:
    assert "--output_dir " in help_text(Run) and "--output-dir" not in help_text(Run)


def test_none_default_shows_unset() -> None:
    assert "(default: unset)" in line(help_text(Run), "seed")


def test_required_key_shows_required() -> None:
    text = help_text(Run)
    assert "(required" in line(text, "data.path")
    assert "PydanticUndefined" not in text


def test_keys_of_an_optional_section_are_listed() -> None:
    assert "(default: 8)" in line(help_text(Run), "lora.rank")


def test_keys_of_every_variant_are_listed_with_their_type() -> None:
    text = help_text(Run)
    assert 'type = "circle"' in line(text, "shape.radius")
    assert 'type = "square"' in line(text, "shape.side")
    assert "Circle(" not in text


def test_tagged_type_lists_its_choices_and_default() -> None:
    type_line = line(help_text(Run), "shape.type")
    assert '(default: "circle"' in type_line and '"square"' in type_line


def test_keys_every_variant_shares_are_listed_once() -> None:
    text = help_text(Run)
    assert sum(ln.strip().startswith("--shape.label ") for ln in text.splitlines()) == 1


def test_short_help_lists_the_keys_marked_first_and_the_sections() -> None:
    text = help_text(Run, "")
    assert line(text, "name") and '(default: "circle"' in line(text, "shape.type")
    assert "--output_dir" not in text and "--shape.radius" not in text
    assert text.splitlines()[-1] == "  shape, lora, data"


def test_help_section_lists_only_that_section() -> None:
    text = help_text(Run, "lora")
    assert text.startswith("[lora]") and "(default: 8)" in line(text, "lora.rank")
    assert "--output_dir" not in text and "--data.path" not in text


def test_help_of_a_tagged_section_lists_every_variant() -> None:
    text = help_text(Run, "shape")
    assert line(text, "shape.radius") and line(text, "shape.side")


def test_help_of_one_key_lists_that_key() -> None:
    assert help_text(Run, "lora.rank").strip().splitlines()[0] == "--lora.rank (default: 8)"


def test_help_accepts_kebab_case() -> None:
    assert line(help_text(Run, "output-dir"), "output_dir")


def test_unknown_section_names_the_closest_valid_one() -> None:
    with pytest.raises(ConfigError, match=r"did you mean 'lora'\?"):
        help_text(Run, "lorra")


def test_unknown_section_without_a_close_match_lists_the_sections() -> None:
    with pytest.raises(ConfigError, match=r"sections: shape, lora, data, or all"):
        help_text(Run, "zzz")


def test_type_names_read_as_in_toml() -> None:
    assert type_name(int | None) == "int | None"
    assert type_name(Literal["a", "b"]) == '"a" | "b"'
    assert type_name(list[str]) == "list[str]"
    assert type_name(tuple[float, float]) == "tuple[float, float]"
