"""Tagged sections compose: a new `type` replaces the section, the same `type` merges."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from tidal.common.config.loading import BaseConfig, load_config


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


class Run(BaseConfig):
    scene: Scene = Scene()


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def circle_file(tmp_path: Path) -> str:
    return write(tmp_path, "a.toml", '[scene.shape]\ntype = "circle"\nradius = 2\nlabel = "a"\n')


def test_later_file_with_another_type_replaces_the_section(tmp_path: Path) -> None:
    b = write(tmp_path, "b.toml", '[scene.shape]\ntype = "square"\nside = 3\n')
    config, _ = load_config(Run, ["@", circle_file(tmp_path), "@", b], environ={})
    assert config.scene.shape == Square(side=3)


def test_flag_with_another_type_replaces_the_section(tmp_path: Path) -> None:
    argv = ["@", circle_file(tmp_path), "--scene.shape.type", "square"]
    config, _ = load_config(Run, argv, environ={})
    assert config.scene.shape == Square()


def test_flags_given_with_the_new_type_are_kept(tmp_path: Path) -> None:
    argv = ["@", circle_file(tmp_path), "--scene.shape.side", "4", "--scene.shape.type", "square"]
    config, _ = load_config(Run, argv, environ={})
    assert config.scene.shape == Square(side=4)


def test_environment_with_another_type_replaces_the_section(tmp_path: Path) -> None:
    env = {"TIDAL_SCENE__SHAPE__TYPE": "square"}
    config, _ = load_config(Run, ["@", circle_file(tmp_path)], environ=env)
    assert config.scene.shape == Square()


def test_same_type_merges_keys(tmp_path: Path) -> None:
    b = write(tmp_path, "b.toml", '[scene.shape]\ntype = "circle"\nlabel = "b"\n')
    config, _ = load_config(Run, ["@", circle_file(tmp_path), "@", b], environ={})
    assert config.scene.shape == Circle(radius=2, label="b")


def test_keys_without_a_type_belong_to_the_default_type() -> None:
    config, _ = load_config(Run, ["--scene.shape.radius", "3"], environ={})
    assert config.scene.shape == Circle(radius=3)


def test_switching_away_from_the_default_type_drops_its_keys(tmp_path: Path) -> None:
    a = write(tmp_path, "a.toml", "[scene.shape]\nradius = 2\n")
    config, _ = load_config(Run, ["@", a, "--scene.shape.type", "square"], environ={})
    assert config.scene.shape == Square()
