"""The trainer and the orchestrator share the micro-batch contract through tidal.batch only:
neither service's code imports the other's package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[3] / "services"


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.parametrize(
    ("service", "other"), [("trainer", "orchestrator"), ("orchestrator", "trainer")]
)
def test_a_service_does_not_import_the_other(service: str, other: str) -> None:
    sources = sorted((SERVICES / service / "src").rglob("*.py"))
    assert sources
    offenders = [
        f"{path.relative_to(SERVICES)}: {name}"
        for path in sources
        for name in sorted(imported_modules(path))
        if name == f"tidal.{other}" or name.startswith(f"tidal.{other}.")
    ]
    assert offenders == []
