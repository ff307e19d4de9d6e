"""No test asserts elapsed wall-clock time: an `assert` comparing the machine's clock
(time.monotonic(), time.perf_counter(), time.time()), or a variable computed from it, with a
number measures the machine, and fails on a loaded one. A test turns a clock by hand
(time-machine, or the `clock`/`now` seam of the code under test), or asserts order and counts;
waiting for something goes through tests/waiting.py's wait_until, outside any assert."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
CLOCKS = {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "time_ns"}
COLLECTORS = {"append", "extend", "add", "insert"}  # `x.append(clock() - t0)` taints x


class _Clocks:
    """How a module spells the clock: `time.monotonic()`, `t.time()` after `import time as t`,
    `clock()` after `from time import perf_counter as clock`."""

    def __init__(self, tree: ast.Module) -> None:
        self.modules: set[str] = set()
        self.functions: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                self.modules.update(a.asname or a.name for a in node.names if a.name == "time")
            elif isinstance(node, ast.ImportFrom) and node.module == "time":
                self.functions.update(a.asname or a.name for a in node.names if a.name in CLOCKS)

    def is_read(self, node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            return func.value.id in self.modules and func.attr in CLOCKS
        return isinstance(func, ast.Name) and func.id in self.functions


def _numbers(tree: ast.Module) -> set[str]:
    """Module-level names bound to a number (`LIMIT = 0.75`): a comparison with one is with a
    number."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_number(node.value, set()):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.value is not None
            and _is_number(node.value, set())
        ):
            names.add(node.target.id)
    return names


def _is_number(node: ast.AST, numbers: set[str]) -> bool:
    """A literal number, a module constant bound to one, or arithmetic on those (`3 / 4`)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.Name):
        return node.id in numbers
    if isinstance(node, ast.UnaryOp):
        return _is_number(node.operand, numbers)
    if isinstance(node, ast.BinOp):
        return _is_number(node.left, numbers) and _is_number(node.right, numbers)
    return False


def _walk(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a scope: a function with all it nests; the module without its functions
    (each is a scope of its own)."""
    if not isinstance(scope, ast.Module):
        return list(ast.walk(scope))
    nodes: list[ast.AST] = []
    stack: list[ast.AST] = [scope]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(
            child
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
        )
    return nodes


def _involves(node: ast.AST, clocks: _Clocks, tainted: set[str]) -> bool:
    return any(
        clocks.is_read(sub) or (isinstance(sub, ast.Name) and sub.id in tainted)
        for sub in ast.walk(node)
    )


def _tainted(scope: ast.AST, clocks: _Clocks) -> set[str]:
    """The names in `scope` that hold a clock reading or something computed from one (a
    difference, a list of latencies), to a fixed point."""
    tainted: set[str] = set()
    while True:
        before = len(tainted)
        for node in _walk(scope):
            targets: Sequence[ast.AST] = []
            value: ast.AST | None = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr):
                targets, value = [node.target], node.value
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in COLLECTORS
                and node.args
            ):
                targets, value = [node.func.value], node.args[-1]
            if value is None or not _involves(value, clocks, tainted):
                continue
            for target in targets:
                tainted.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        if len(tainted) == before:
            return tainted


def _scopes(tree: ast.Module) -> list[ast.AST]:
    """The module, and each outermost function (a method too) with what it nests."""
    holders = [n for n in _walk(tree) if isinstance(n, ast.ClassDef | ast.Module)]
    outermost = [
        child
        for node in holders
        for child in ast.iter_child_nodes(node)
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    return [tree, *outermost]


def clock_asserts(source: str) -> list[int]:
    """Lines of the asserts in `source` that compare the clock with a number."""
    tree = ast.parse(source)
    clocks = _Clocks(tree)
    numbers = _numbers(tree)
    found = set()
    for scope in _scopes(tree):
        tainted = _tainted(scope, clocks)
        for node in _walk(scope):
            if not isinstance(node, ast.Assert):
                continue
            for compare in ast.walk(node.test):
                if not isinstance(compare, ast.Compare):
                    continue
                sides = [compare.left, *compare.comparators]
                if any(_involves(s, clocks, tainted) for s in sides) and any(
                    _is_number(s, numbers) for s in sides
                ):
                    found.add(node.lineno)
    return sorted(found)


def test_the_guard_flags_asserts_that_time_the_machine() -> None:
    planted = textwrap.dedent(
        """
        import time
        from time import perf_counter as clock

        LIMIT = 0.75

        def test_fast(work, stamp):
            started = time.monotonic()
            work()
            assert time.monotonic() - started < 0.5
            elapsed = clock() - started
            assert elapsed <= 3 / 4
            assert abs(int(stamp) - time.time()) < 60
            latencies = []
            latencies.append(time.monotonic() - started)
            assert max(latencies) < LIMIT, latencies
            assert 0.2 <= (gap := time.time() - started) and gap < 2
        """
    )
    assert clock_asserts(planted) == [10, 12, 13, 16, 17]


def test_the_guard_leaves_order_counts_and_hand_turned_clocks_alone() -> None:
    planted = textwrap.dedent(
        """
        import time

        def test_ordered(clock, send, seen):
            before = time.time()
            stamp = send()
            after = time.time()
            assert before <= stamp <= after  # order, not speed
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # a liveness loop, no assert
                pass
            start = clock.now
            assert clock.now - start <= 3  # the test's own clock
            assert clock.slept == [1, 4]
            assert len(seen) == 3

        def test_elsewhere(started):
            assert started < 5  # another function's `started` is not this one's
        """
    )
    assert clock_asserts(planted) == []


@pytest.mark.slow
def test_the_guard_reads_the_whole_suite() -> None:
    sources = sorted(TESTS.rglob("*.py"))
    assert len(sources) > 50
    assert TESTS / "costboard" / "api" / "test_ratelimit.py" in sources


def test_no_test_asserts_elapsed_wall_clock_time() -> None:
    offenders = {
        str(path.relative_to(TESTS.parent)): lines
        for path in sorted(TESTS.rglob("*.py"))
        if (lines := clock_asserts(path.read_text()))
    }
    assert offenders == {}, "turn a clock by hand, or assert order and counts (tests/waiting.py)"
