"""What the two writes scans share (tests/costboard/test_writes.py over costboard,
tests/memory_ui/test_writes.py over memory_ui and devtools): a finding, a receiver read as
names, and the modules to read. Each scan keeps its own idea of what a write is."""

from __future__ import annotations

import ast
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    code: str
    why: str
    key: str = ""  # what an allow-list calls it

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.code}  ({self.why})"


def receiver_chain(node: ast.AST) -> list[str]:
    """The names a receiver is made of, root first: Session.objects.filter(x) →
    [Session, objects, filter]."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            parts.append(node.id)
            return parts[::-1]
        else:
            return parts[::-1]


def modules_outside(root: Path, packages: tuple[str, ...], writers: Collection[Path]) -> list[Path]:
    """Every module of `packages` but their migrations and the `writers` (paths from root)."""
    files = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if "migrations" in relative.parts or relative in writers:
                continue
            files.append(path)
    return files


def findings(
    files: list[Path], root: Path, writes_in: Callable[[str, str], list[Finding]]
) -> list[Finding]:
    found: list[Finding] = []
    for path in files:
        found += writes_in(path.read_text(), path.relative_to(root).as_posix())
    return sorted(found)
