"""The package boundaries of DESIGN.md §4, read from the source: no service package imports
or depends on another (so `pip install` of one service never brings another: the
inference image holds no trainer), no import cycle exists among the project's own
modules, and the trainer's building blocks never import the trainer's top level.

Imports are read with `ast` from every module under `services/*/src`, `libs/*/src` and
`src/`, at module level and inside functions alike (a lazy import is still a
dependency), relative imports resolved. Generated protobuf code (`tidal.rpc`) is left
out. Cycles are the strongly connected components of that graph (Tarjan's algorithm,
iterative: the graph has ~200 nodes, networkx is not a dependency of the suite).
"""

from __future__ import annotations

import ast
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = [*ROOT.glob("services/*/src"), *ROOT.glob("libs/*/src"), ROOT / "src"]
# Known and being removed: a new one fails, and so does one that is gone but
# still listed, so these lists only shrink.
KNOWN_CROSS_SERVICE: set[tuple[str, str]] = set()
KNOWN_CYCLES: list[set[str]] = []


def project_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for src in SOURCE_ROOTS:
        for path in src.rglob("*.py"):
            parts = list(path.relative_to(src).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if parts[:1] == ["tidal"] and parts[1:2] != ["rpc"]:
                modules[".".join(parts)] = path
    return modules


def imported_names(module: str, path: Path) -> Iterator[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for name in imported_names(module, path):
            while name and name not in modules:  # `from pkg import name`: the module pkg
                name = name.rpartition(".")[0]
            if name and name != module:
                graph[module].add(name)
    return graph


def service_of(module: str, modules: dict[str, Path]) -> str | None:
    parts = modules[module].relative_to(ROOT).parts
    return parts[1] if parts[0] == "services" else None


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_no_service_package_imports_another() -> None:
    modules = project_modules()
    graph = import_graph()
    crossing = {
        (m, t)
        for m, targets in graph.items()
        for t in targets
        if service_of(m, modules) and service_of(t, modules)
        if service_of(m, modules) != service_of(t, modules)
    }
    assert crossing - KNOWN_CROSS_SERVICE == set(), "shared code belongs in libs/ (DESIGN §4)"
    assert KNOWN_CROSS_SERVICE - crossing == set(), "gone: remove it from KNOWN_CROSS_SERVICE"


def test_no_service_package_depends_on_another() -> None:
    """Dependencies and optional extras alike: an extra is still an install path."""
    services = {p.parent.name: p for p in ROOT.glob("services/*/pyproject.toml")}
    names = {f"tidal-{name}" for name in services}
    for name, path in services.items():
        project = tomllib.loads(path.read_text())["project"]
        requirements = list(project.get("dependencies", []))
        for extra in project.get("optional-dependencies", {}).values():
            requirements += extra
        required = {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0] for r in requirements}
        assert required & names == set(), f"services/{name} depends on {required & names}"


def test_no_import_cycles_among_project_modules() -> None:
    found = cycles(import_graph())
    assert [c for c in found if c not in KNOWN_CYCLES] == []
    assert [c for c in KNOWN_CYCLES if c not in found] == [], "gone: remove it from KNOWN_CYCLES"


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [{"a", "b", "c"}]


def test_the_walk_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    path = tmp_path / "mod.py"
    path.write_text("def f():\n    from tidal.x import y\n    from . import sibling\n")
    names = set(imported_names("tidal.pkg.mod", path))
    assert {"tidal.x", "tidal.x.y", "tidal.pkg", "tidal.pkg.sibling"} <= names


def package_of(module: str, modules: dict[str, Path]) -> str:
    """The installable package a module belongs to: a service, a library, or the CLI."""
    parts = modules[module].relative_to(ROOT).parts
    return parts[1] if parts[0] in ("services", "libs") else "cli"


def runs_as_a_program(path: Path) -> bool:
    """A `python -m` entry point (the container health probe, `tidal certs`) has users
    outside the import graph: deployments run it."""
    return '__name__ == "__main__"' in path.read_text()


def common_consumers(graph: dict[str, set[str]], modules: dict[str, Path]) -> dict[str, set[str]]:
    """For each `tidal.common` module, the other packages that import it directly or
    through other `tidal.common` modules."""
    common = {m for m in modules if package_of(m, modules) == "common"}
    consumers: dict[str, set[str]] = {m: set() for m in common}
    for module, targets in graph.items():
        if module in common:
            continue
        seen, todo = set(), [t for t in targets if t in common]
        while todo:
            target = todo.pop()
            if target not in seen:
                seen.add(target)
                todo.extend(t for t in graph[target] if t in common)
        for target in seen:
            consumers[target].add(package_of(module, modules))
    return consumers


def test_every_common_module_serves_more_than_one_package() -> None:
    """`tidal.common` holds what several packages share; a module only one package uses
    belongs in that package."""
    modules = project_modules()
    consumers = common_consumers(import_graph(), modules)
    lonely = {
        module: sorted(users)
        for module, users in consumers.items()
        if len(users) < 2 and not runs_as_a_program(modules[module])
        if not module.endswith("__init__") and modules[module].name != "__init__.py"
    }
    assert lonely == {}, "move each to the package that uses it"


def test_the_consumer_count_follows_imports_through_common() -> None:
    graph = {"tidal.x.a": {"tidal.common.b"}, "tidal.common.b": {"tidal.common.c"}}
    graph |= {"tidal.common.c": set(), "tidal.y.d": {"tidal.common.c"}}
    modules = {
        "tidal.x.a": ROOT / "services/x/src/tidal/x/a.py",
        "tidal.y.d": ROOT / "libs/y/src/tidal/y/d.py",
        "tidal.common.b": ROOT / "libs/common/src/tidal/common/b.py",
        "tidal.common.c": ROOT / "libs/common/src/tidal/common/c.py",
    }
    assert common_consumers(graph, modules) == {
        "tidal.common.b": {"x"},
        "tidal.common.c": {"x", "y"},
    }


def test_trainer_building_blocks_never_import_the_trainer_top_level() -> None:
    """The trainer's sub-packages (parallel/, memory/, persistence/, memory_planner/) are
    building blocks: they import each other and the libraries, never a top-level module
    (config, training step, leader, service), since those compose them."""
    modules = project_modules()
    folder = ROOT / "services/trainer/src/tidal/trainer"
    top = {m for m, p in modules.items() if p.parent == folder and p.name != "__init__.py"}
    blocks = {m for m, p in modules.items() if folder in p.parents and p.parent != folder}
    graph = import_graph()
    assert blocks and top, "the trainer's folder moved: update this test"
    assert {(m, t) for m in blocks for t in graph[m] & top} == set()
