"""Config errors name keys as the user writes them, also inside tagged sections."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from pydantic import Field

from tidal.common.config.loading import BaseConfig, ConfigError, load_config


class Circle(BaseConfig):
    type: Literal["circle"] = "circle"
    radius: float = 1.0
    label: str = ""


class Square(BaseConfig):
    type: Literal["square"] = "square"
    side: float = 1.0
    label: str = ""


Shape = Annotated[Circle | Square, Field(discriminator="type")]


class Scene(BaseConfig):
    shape: Shape = Circle()
    extras: list[Shape] = []


class Run(BaseConfig):
    scene: Scene = Scene()


def error(*argv: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(Run, list(argv), environ={})
    return str(err.value)


def test_key_of_another_type_is_named_with_the_valid_keys() -> None:
    message = error("--scene.shape.type", "square", "--scene.shape.radius", "2")
    assert "unknown key 'scene.shape.radius'" in message
    assert 'scene.shape.type = "square"' in message and '"circle"' in message
    assert "valid keys here: label, side, type" in message


def test_misspelt_key_of_the_chosen_type_suggests_the_closest() -> None:
    message = error("--scene.shape.type", "square", "--scene.shape.sid", "2")
    assert "did you mean 'scene.shape.side'?" in message


def test_unknown_type_lists_the_valid_types() -> None:
    message = error("--scene.shape.type", "hexagon")
    assert "'scene.shape.type'" in message and "circle, square" in message


def test_bad_value_in_a_tagged_section_names_the_key_without_the_type() -> None:
    message = error("--scene.shape.radius", "big")
    assert "'scene.shape.radius'" in message and "circle.radius" not in message


def test_unknown_key_in_a_list_entry_names_its_index() -> None:
    message = error("--scene.extras", '[{type = "square", radius = 1}]')
    assert "unknown key 'scene.extras[0].radius'" in message
    assert "valid keys here: label, side, type" in message
