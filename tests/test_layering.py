"""The layer order of docs/CONVENTIONS.md, checked on every import of every module.

    cli → api → service → planner → adapters (importers, exporters, storage, profiling)
        → settings → cost_model

A module may import its own package, a peer in its layer, or any lower layer; never a higher
one, and the packages' import graph has no cycle.  Every import counts, also one inside a
function or under ``TYPE_CHECKING`` (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("cost_model", "planner_service")
SKIP_DIRS = {"migrations", "__pycache__"}

#: Layers from the top; each names the packages in it.  ``planner_service`` itself (the package
#: root) and ``settings`` are configuration leaves every service layer may read.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("cli", frozenset({"planner_service.cli"})),
    ("api", frozenset({"planner_service.api"})),
    ("service", frozenset({"planner_service.service"})),
    ("planner", frozenset({"planner_service.planner"})),
    (
        "adapters",
        frozenset({"planner_service.importers", "planner_service.exporters", "planner_service.storage", "planner_service.profiling",
                   "planner_service.observations"}),
    ),
    ("settings", frozenset({"planner_service.settings", "planner_service"})),
    ("cost_model", frozenset({"cost_model"})),
)
RANK = {package: len(LAYERS) - i for i, (_, packages) in enumerate(LAYERS) for package in packages}
LAYER_OF = {package: name for name, packages in LAYERS for package in packages}


def package_of(module: str) -> str | None:
    """The layered package a dotted module name belongs to (None: not ours)."""
    parts = module.split(".")
    if parts[0] == "cost_model":
        return "cost_model"
    if parts[0] != "planner_service":
        return None
    return "planner_service" if len(parts) == 1 else f"planner_service.{parts[1]}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> list[Path]:
    return sorted(
        p for top in SOURCES for p in (ROOT / top).rglob("*.py") if not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
    )


def imports_of(path: Path) -> Iterator[tuple[str, int]]:
    """Absolute module names imported anywhere in ``path`` (relative imports resolved)."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                yield ".".join([*base, node.module] if node.module else base), node.lineno
            elif node.module:
                yield node.module, node.lineno


def package_edges() -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) → where, for every import across packages."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in source_files():
        src = package_of(module_name(path))
        assert src is not None
        for imported, line in imports_of(path):
            dst = package_of(imported)
            if dst is not None and dst != src:
                edges.setdefault((src, dst), []).append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    return edges


def find_cycle(edges: set[tuple[str, str]]) -> list[str] | None:
    """One cycle of the directed graph, as its nodes in order (None: acyclic)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_every_module_belongs_to_a_layer() -> None:
    files = source_files()
    assert len(files) > 50  # the scan found the packages
    unknown = sorted({package_of(module_name(p)) for p in files} - set(RANK), key=str)
    assert not unknown, f"packages without a layer (add them to LAYERS and docs/CONVENTIONS.md): {unknown}"


def test_no_module_imports_a_higher_layer() -> None:
    upward = [
        f"{where} ({LAYER_OF[src]} → {LAYER_OF[dst]})"
        for (src, dst), places in sorted(package_edges().items())
        if RANK[dst] > RANK[src]
        for where in places
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycle_between_packages() -> None:
    edges = package_edges()
    cycle = find_cycle(set(edges))
    assert cycle is None, "import cycle: " + " → ".join(cycle) + "\n" + "\n".join(
        edges[(a, b)][0] for a, b in itertools.pairwise(cycle)
    )


@pytest.mark.parametrize(
    ("edges", "has_cycle"),
    [({("a", "b"), ("b", "c")}, False), ({("a", "b"), ("b", "c"), ("c", "a")}, True), ({("a", "a")}, True)],
)
def test_cycle_finder(edges: set[tuple[str, str]], has_cycle: bool) -> None:
    assert (find_cycle(edges) is not None) is has_cycle


def test_package_of() -> None:
    assert package_of("planner_service.api.routes.launch") == "planner_service.api"
    assert package_of("cost_model.graph.ir") == "cost_model"
    assert package_of("numpy") is None
