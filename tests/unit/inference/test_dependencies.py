"""Inference shares the model with the trainer through `tidal-models`, never the trainer itself
(DESIGN §4: a service package never imports another service package)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
INFERENCE = ROOT / "services" / "inference"


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


def test_the_inference_package_depends_on_the_model_library_not_the_trainer() -> None:
    project = tomllib.loads((INFERENCE / "pyproject.toml").read_text())["project"]
    names = {
        req.split("[")[0].split(">")[0].split("=")[0].strip() for req in project["dependencies"]
    }
    assert "tidal-models" in names and "tidal-trainer" not in names


def test_no_inference_module_imports_the_trainer() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in imported_modules(path) if m.startswith("tidal.trainer")
        )
        for path in sorted((INFERENCE / "src").rglob("*.py"))
    }
    assert {path: mods for path, mods in offenders.items() if mods} == {}
