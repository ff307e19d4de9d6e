"""The docs a newcomer reads hold together: every relative link in README.md, CHANGELOG.md and
docs/ resolves (a `#fragment` to a heading of its file), the README stays short, and the code
cites only documents in the repository, by sections that exist. Each check has a positive
control, so it can fail."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300
CODE_DIRS = ("costboard", "memory_ui", "clients", "devtools", "templates", "tests")
SKIPPED_DIRS = {"__pycache__", "build", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
# Built from parts, so this file does not cite it itself.
OUTSIDE_DOCUMENT = "CONTRACT" + " §"

FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`+[^`]*`+")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
# a pointer into the docs from a comment or docstring: (docs/api.md, "Errors") or
# docs/api.md ("Errors"), also when a line break (and a comment's #) falls between the two
POINTER = re.compile(r"((?:docs/)?[\w.-]+\.md)(?:,\s+(?:#\s+)?|\s+\()\"([^\"]+)\"")


def documents() -> list[Path]:
    """README.md, CHANGELOG.md, docs/*.md and the client distribution's README."""
    found = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "clients/python/README.md"]
    return found + sorted((ROOT / "docs").glob("*.md"))


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks: a `# comment` in a snippet is not a heading, and
    a link in a snippet is code."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: its text (links as their text), lower-cased, without
    punctuation, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def headings(text: str) -> list[str]:
    return [m.group(2) for line in prose_lines(text) if (m := HEADING.match(line))]


def anchors(text: str) -> set[str]:
    """Every heading's anchor, repeats numbered as GitHub numbers them (-1, -2…)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(text):
        base = anchor(heading)
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def broken_links(document: Path, text: str) -> list[str]:
    """Each relative link of `text` (as if it were `document`) that does not resolve: a file
    or folder in the repository, and for a `#fragment` a heading of that Markdown file."""
    broken = []
    for line in prose_lines(text):
        for match in LINK.finditer(INLINE_CODE.sub("", line)):
            target = match.group(1)
            if SCHEME.match(target):
                continue  # https:, mailto: — not this test's to fetch
            path_part, _, fragment = target.partition("#")
            path = (document.parent / unquote(path_part)).resolve() if path_part else document
            if not path.is_relative_to(ROOT) or not path.exists():
                broken.append(f"{target}: no such file in the repository")
                continue
            if fragment and path.suffix == ".md" and fragment not in anchors(path.read_text()):
                broken.append(f"{target}: no heading with the anchor #{fragment}")
    return broken


def code_files() -> list[Path]:
    files = []
    for folder in CODE_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and not SKIPPED_DIRS & set(path.relative_to(ROOT).parts):
                files.append(path)
    return files


def text_of(path: Path) -> str | None:
    try:
        return path.read_text()
    except UnicodeDecodeError:
        return None  # an image, a compiled file: no citations in it


def citing(files: list[Path], root: Path = ROOT) -> list[str]:
    """The files (relative to `root`) whose text cites the outside document."""
    return [
        str(path.relative_to(root)) for path in files if OUTSIDE_DOCUMENT in (text_of(path) or "")
    ]


def dangling_pointers(text: str) -> list[str]:
    """Each `(file.md, "Section")` pointer in `text` whose file or section does not exist."""
    dangling = []
    for name, section in POINTER.findall(text):
        target = ROOT / name
        if not target.exists():
            dangling.append(f'{name}, "{section}": no such file')
        elif section not in headings(target.read_text()):
            dangling.append(f'{name}, "{section}": no such section')
    return dangling


@pytest.mark.parametrize("document", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_in_the_docs_resolves(document: Path) -> None:
    assert broken_links(document, document.read_text()) == []


def test_the_link_checker_flags_a_missing_file_and_a_missing_heading() -> None:
    planted = (
        "See [the API](docs/api.md#errors), [nowhere](docs/nowhere.md), "
        "[a lost section](docs/api.md#no-such-section) and [the web](https://example.com).\n"
        "```\n[in a snippet](docs/nowhere-either.md)\n```\n"
    )
    assert broken_links(ROOT / "README.md", planted) == [
        "docs/nowhere.md: no such file in the repository",
        "docs/api.md#no-such-section: no heading with the anchor #no-such-section",
    ]


def test_anchors_are_githubs() -> None:
    text = "# Costboard\n## `POST /api/v1/events`\n## Keys and roles\n## Keys and roles\n"
    text += "```\n# not a heading\n```\n"
    assert anchors(text) == {"costboard", "post-apiv1events", "keys-and-roles", "keys-and-roles-1"}


def too_long(text: str) -> str | None:
    """Why a README of this text is too long, or None."""
    lines = len(text.splitlines())
    if lines > README_MAX_LINES:
        return f"README.md has {lines} lines, at most {README_MAX_LINES}: move detail into docs/"
    return None


def test_the_readme_is_at_most_300_lines() -> None:
    assert too_long((ROOT / "README.md").read_text()) is None


def test_the_length_check_refuses_a_301_line_readme() -> None:
    assert too_long("line\n" * README_MAX_LINES) is None
    assert too_long("line\n" * (README_MAX_LINES + 1)) == (
        "README.md has 301 lines, at most 300: move detail into docs/"
    )


def test_the_readme_shows_the_two_commands_and_the_overview() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make run" in readme and "make test" in readme
    assert "![The overview](docs/overview.png)" in readme
    assert (ROOT / "docs/overview.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_no_code_cites_a_document_outside_the_repository() -> None:
    assert citing(code_files()) == []


def test_the_citation_check_finds_a_planted_citation(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(f'"""Budgets ({OUTSIDE_DOCUMENT}3)."""\n')
    clean = tmp_path / "clean.py"
    clean.write_text('"""Budgets (docs/budgets.md, "Caps")."""\n')
    assert citing([planted, clean], root=tmp_path) == ["planted.py"]


def test_every_pointer_into_the_docs_names_a_section_that_exists() -> None:
    dangling = []
    for path in code_files():
        text = text_of(path)
        if text is not None and path != Path(__file__).resolve():
            dangling += [f"{path.relative_to(ROOT)}: {d}" for d in dangling_pointers(text)]
    assert dangling == []


def test_the_pointer_check_flags_a_missing_section_and_file() -> None:
    text = (
        '# (docs/api.md, "Errors"), (docs/api.md, "Mistakes"), (docs/gone.md, "Errors"),\n'
        '# (README.md, "Configuration"), docs/api.md ("Metrics"), docs/api.md ("Metric")\n'
        '# (docs/operations.md,\n# "Scaling in")\n'
    )
    assert dangling_pointers(text) == [
        'docs/api.md, "Mistakes": no such section',
        'docs/gone.md, "Errors": no such file',
        'docs/api.md, "Metric": no such section',
        'docs/operations.md, "Scaling in": no such section',
    ]
