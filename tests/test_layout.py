"""The rooms hold: the packages keep the order docs/architecture.md states (its `layers` list),
no import cycles between modules or packages, the cost app never imports the memory app
(memory_ui joins in through costboard.hooks), and no runtime module imports the dev tools."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MEMORY = ROOT / "docs" / "memory.md"  # memory_ui's own modules, in its "Layers"
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


@cache  # every test reads the same sources; none changes the graph it is given
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


def test_the_settings_import_no_module_of_ours() -> None:
    """Settings are read before Django is set up: the settings our modules parse are checked
    as the app starts (costboard/apps.py), not by importing those modules here."""
    assert import_graph()["costboard.settings"] == set()


def test_budgets_hold_budget_code_only() -> None:
    """What every capability shares (egress, retention) lives beside projects and the outbox,
    not inside budgets/, where it was once put because alerts or the sweep called it."""
    found = {name.rpartition(".")[2] for name in import_graph() if ".budgets." in name}
    assert not found & {"egress", "retention"}
    assert "costboard.retention" in import_graph()


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


def stated_layers(text: str) -> list[list[str]]:
    """The `layers` block of docs/architecture.md: a line per layer, top first."""
    block = re.search(r"^## Layers$.*?^```layers\n(.*?)^```$", text, re.S | re.M)
    assert block is not None, "docs/architecture.md has no ```layers block under ## Layers"
    return [line.split() for line in block.group(1).splitlines() if line.strip()]


def owner(module: str, names: list[str]) -> str | None:
    """The longest stated name that is `module` or a package holding it."""
    holders = [n for n in names if module == n or module.startswith(n + ".")]
    return max(holders, key=len) if holders else None


def layer_breaches(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Imports that go up a layer, and modules no layer names."""
    level = {name: depth for depth, line in enumerate(layers) for name in line}
    names = list(level)
    found = []
    for module, targets in sorted(graph.items()):
        home = owner(module, names)
        if home is None:
            found.append(f"{module}: in no layer")
            continue
        for target in sorted(targets):
            there = owner(target, names)
            if there is not None and level[there] < level[home]:
                found.append(f"{module} imports {target}, a layer above it")
    return found


def package_graph(graph: dict[str, set[str]], names: list[str]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        home = owner(module, names) or module
        packages.setdefault(home, set()).update(
            there for t in targets if (there := owner(t, names) or t) != home
        )
    return packages


def test_the_packages_keep_the_order_the_architecture_states() -> None:
    layers = stated_layers(ARCHITECTURE.read_text())
    stated = [name for line in layers for name in line]
    assert len(stated) == len(set(stated)), "a package is named on two lines"
    graph = import_graph()
    assert [n for n in stated if not any(owner(m, [n]) for m in graph)] == []  # none stale
    assert layer_breaches(graph, layers) == []


def test_the_memory_app_keeps_the_order_its_doc_states() -> None:
    """Inside memory_ui, docs/memory.md's `layers`: the pages and the API over the writes, the
    writes over the reads, so a read (selectors, ranking, MEMORY.md) never imports a write;
    every module of the app is on a line."""
    layers = stated_layers(MEMORY.read_text())
    stated = [name for line in layers for name in line]
    assert len(stated) == len(set(stated)), "a module is named on two lines"
    assert all(name.startswith("memory_ui.") for name in stated)
    graph = {name: t for name, t in import_graph().items() if name.startswith("memory_ui.")}
    assert [n for n in stated if not any(owner(m, [n]) for m in graph)] == []  # none stale
    assert layer_breaches(graph, layers) == []


def test_no_package_imports_itself_back() -> None:
    names = [name for line in stated_layers(ARCHITECTURE.read_text()) for name in line]
    assert cycles(package_graph(import_graph(), names)) == []


def test_the_layer_check_sees_an_import_up_and_a_module_in_no_layer() -> None:
    layers = [["app.api"], ["app.ingest"], ["app.models"]]
    graph = {
        "app.api.views": {"app.ingest.service"},
        "app.ingest.service": {"app.models", "app.api.views"},
        "app.models": set(),
        "app.stray": set(),
    }
    assert layer_breaches(graph, layers) == [
        "app.ingest.service imports app.api.views, a layer above it",
        "app.stray: in no layer",
    ]


def test_a_loop_between_packages_is_seen_though_no_module_loops() -> None:
    names = ["app.a", "app.b"]
    graph = {"app.a.x": {"app.b.y"}, "app.b.y": set(), "app.b.z": {"app.a.w"}, "app.a.w": set()}
    assert cycles(graph) == []
    assert cycles(package_graph(graph, names)) == [["app.a", "app.b"]]


# The ingest path's own order (docs/architecture.md, "The path of one event"): the orchestrator
# over the writes and the shared sums, over the plan, over the SQL dialect and the schemas;
# the Idempotency-Key's run, which the API wraps around the orchestrator, beside it.
INGEST_LAYERS = [
    ["costboard.ingest.service", "costboard.ingest.otlp", "costboard.ingest.idempotency"],
    ["costboard.ingest.rollups", "costboard.ingest.writes"],
    ["costboard.ingest.plan"],
    [
        "costboard.ingest.sql",
        "costboard.ingest.json_body",
        "costboard.ingest.schemas",
        "costboard.ingest.turn_rules",
        "costboard.ingest.normalize",
        "costboard.ingest.latency",
    ],
]


def test_the_ingest_path_keeps_its_order() -> None:
    graph = {
        name: {t for t in targets if t.startswith("costboard.ingest.")}
        for name, targets in import_graph().items()
        if name.startswith("costboard.ingest.")
    }
    assert "costboard.ingest.writes.sessions" in graph["costboard.ingest.service"]  # control
    assert layer_breaches(graph, INGEST_LAYERS) == []


# Ingest asks the budgets one question per batch (costboard/budgets/batch.py, issue 32): what
# else of budgets/ it may import is the pure engine's types and the answer's type.
INGEST_ASKS_BUDGETS = {
    "costboard.budgets.batch": None,  # batch_budgets and its types
    "costboard.budgets.engine": {"Flag", "Ledger"},
    "costboard.budgets.caps": {"SessionBudget"},
}


def budgets_imported_by_ingest() -> dict[str, set[str]]:
    """Each budgets module the ingest package imports from → the names it imports."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "costboard" / "ingest").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "costboard.budgets"
            ):
                found.setdefault(node.module or "", set()).update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("costboard.budgets"):
                        found.setdefault(alias.name, set()).add("*")
    return found


def test_ingest_asks_the_budgets_through_one_module() -> None:
    found = budgets_imported_by_ingest()
    assert "batch_budgets" in found.get("costboard.budgets.batch", set())  # control
    strays = {}
    for module, names in found.items():
        allowed = INGEST_ASKS_BUDGETS.get(module, set())
        if allowed is not None and not names <= allowed:
            strays[module] = names
    assert strays == {}


def test_events_ingest_asks_the_budgets_once() -> None:
    """One call of batch_budgets in the orchestrator, and no other budgets function called."""
    tree = ast.parse((ROOT / "costboard" / "ingest" / "service.py").read_text())
    calls = [
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    ]
    assert calls.count("batch_budgets") == 1
    assert calls.count("BatchSpend") == 1


PAGES = "costboard.dashboards"
PAGE_MODULE_LINES = 600  # issue 32: a room a reader can take in


def test_the_page_reads_import_no_view_form_or_csv_writer() -> None:
    """Inside dashboards the reads are below what uses them: a selector module imports no
    view, form or CSV writer (the views call them, not the other way round)."""
    graph = import_graph()
    above = [f"{PAGES}.views", f"{PAGES}.forms", f"{PAGES}.csv"]
    reads = {
        name: targets for name, targets in graph.items() if owner(name, [f"{PAGES}.selectors"])
    }
    assert f"{PAGES}.selectors.shared" in reads[f"{PAGES}.selectors.overview"]  # sees them
    offenders = {
        name: sorted(t for t in targets if owner(t, above)) for name, targets in reads.items()
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_the_page_modules_are_page_sized() -> None:
    """Each page's views and reads have a module of their own, none over 600 lines."""
    found = {name: path for name, path in modules().items() if owner(name, [PAGES])}
    assert f"{PAGES}.views.flagged" in found and f"{PAGES}.selectors.steps" in found
    sizes = {name: len(path.read_text().splitlines()) for name, path in found.items()}
    assert {name: n for name, n in sizes.items() if n > PAGE_MODULE_LINES} == {}


# The packages split by domain, each module on a line, top to bottom (each package's docstring
# says why). The face hands every module on; below it a module imports only from lower lines.
INSIDE_LAYERS = {
    "costboard.models": [
        ["costboard.models"],
        ["costboard.models.alerts"],
        [
            "costboard.models.anomalies",
            "costboard.models.billing",
            "costboard.models.budgets",
            "costboard.models.receipts",
            "costboard.models.reports",
            "costboard.models.rollups",
        ],
        ["costboard.models.usage"],
        ["costboard.models.pricing", "costboard.models.projects"],
        ["costboard.models.fields"],
    ],
    "costboard.ingest.otlp": [
        ["costboard.ingest.otlp"],
        ["costboard.ingest.otlp.store"],
        ["costboard.ingest.otlp.turns", "costboard.ingest.otlp.decode"],
        ["costboard.ingest.otlp.mapping", "costboard.ingest.otlp.json_models"],
    ],
    "costboard.admin": [
        ["costboard.admin"],
        ["costboard.admin.projects"],
        [
            "costboard.admin.alerts",
            "costboard.admin.billing",
            "costboard.admin.budgets",
            "costboard.admin.lockout",
            "costboard.admin.pricing",
            "costboard.admin.reports",
            "costboard.admin.usage",
        ],
        ["costboard.admin.forms", "costboard.admin.site"],
    ],
}


@pytest.mark.parametrize("package", sorted(INSIDE_LAYERS))
def test_the_modules_of_a_split_package_import_downwards(package: str) -> None:
    layers = INSIDE_LAYERS[package]
    graph = import_graph()
    inside = {n: t for n, t in graph.items() if n == package or n.startswith(package + ".")}
    stated = {name for line in layers for name in line}
    assert set(inside) == stated  # a new module of the package is given its line here
    # positive control: importing the face loads every module (`from costboard.models import
    # X` works; every admin list is registered)
    reached, todo = set(), [package]
    while todo:
        module = todo.pop()
        reached.add(module)
        todo.extend(set(inside.get(module, ())) - reached)
    assert reached >= stated
    assert layer_breaches(inside, layers) == []
