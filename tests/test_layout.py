"""The rooms hold: no import cycles between modules, the cost app never imports the memory app
(memory_ui joins in through costboard.hooks), and no runtime module imports the dev tools."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("costboard", "memory_ui", "devtools")
# The Django project's own modules name every app: they may import memory_ui.
PROJECT_MODULES = {"costboard.urls", "costboard.settings", "costboard.wsgi", "costboard.celery"}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules `path` imports (at any depth: lazy imports count too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in known else base)
    resolved = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(path, name, known) for name, path in found.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(planted) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_real_imports() -> None:
    graph = import_graph()
    # positive controls: edges the code is known to have
    assert "costboard.budgets.engine" in graph["costboard.budgets.services"]
    assert "costboard.hooks" in graph["memory_ui.hooks"]
    assert "costboard.models" in graph["memory_ui.models"]


def test_no_module_imports_itself_back() -> None:
    assert cycles(import_graph()) == []


def test_the_cost_app_never_imports_the_memory_app() -> None:
    graph = import_graph()
    offenders = {
        name: sorted(t for t in targets if t.startswith("memory_ui"))
        for name, targets in graph.items()
        if name.startswith("costboard") and name not in PROJECT_MODULES
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_runtime_modules_never_import_the_dev_tools() -> None:
    graph = import_graph()
    offenders = {
        name: sorted(t for t in targets if t.startswith("devtools"))
        for name, targets in graph.items()
        if not name.startswith("devtools")
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_budget_engine_is_pure() -> None:
    """No database, no clock: it imports neither Django nor the models."""
    source = (ROOT / "costboard" / "budgets" / "engine.py").read_text()
    tree = ast.parse(source)
    imported = {
        alias.name if isinstance(node, ast.Import) else node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert not any(name.startswith(("django", "costboard")) for name in imported)
    assert "now(" not in source and "today(" not in source
