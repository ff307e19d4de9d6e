"""Writes live in services: a scan of costboard/'s source finds no database write outside the
modules docs/architecture.md names "the writers" (WRITERS below).

Every table of the cost app is ours, so any write counts, whatever its model: a manager or
queryset write (`create`, `bulk_create`, `get_or_create`, `update_or_create`, `bulk_update`, a
queryset's `update` or `delete`), a `.save()` or `.delete()` on anything, a user made with
`create_user` / `create_superuser`, and raw SQL that writes (INSERT, UPDATE … SET, DELETE FROM,
TRUNCATE, MERGE, COPY … FROM, CREATE / ALTER / DROP TABLE). Migrations and the writers are not
read; every other module is — the admin, views, the API, commands, tasks and the models — and a
module added anywhere is read until it is listed. The few writes that are their module's own
job stay, each listed in ALLOWED with the reason, and each still there (else drop it).

Django admin's own saves — a ModelAdmin without `save_model` (memberships, webhook endpoints,
environment caps) and `super().save_model` for the fields no rule covers — are not in our
source and not scanned: they store one row as its form validated it, which is the admin's job;
every save that has a rule (caps, prices, period budgets, sessions, keys) overrides it to call
its service. Planted writes show the scan catches each kind, and a planted module is read.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.write_scan import Finding, findings, modules_outside, receiver_chain

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
SCANNED = ("costboard",)
# the writers, each by name: a module added beside them is scanned until it is listed here and
# in docs/architecture.md ("The writers")
WRITERS = frozenset(
    Path(f"costboard/{name}.py")
    for name in (
        "ingest/writes/receipts",
        "ingest/writes/sessions",
        "ingest/writes/turns",
        "ingest/writes/steps",
        "ingest/writes/moves",
        "ingest/rollups",
        "ingest/idempotency",
        "pricing/services",
        "pricing/repricing",
        "pricing/sync",
        "budgets/batch",
        "budgets/services",
        "budgets/period_services",
        "budgets/period_ledgers",
        "budgets/windows",
        "budgets/repriced",
        "budgets/alerts",
        "budgets/anomalies",
        "billing/services",
        "reports/services",
        "projects",
        "lockouts",
        "outbox",
        "retention",
        "partitions",
    )
)
# writes outside the writers, each checked by hand: (file, what the scan calls it: the verb of
# raw SQL, or the call's receiver and method) → why it stays
ALLOWED = {
    ("costboard/models/projects.py", "cls.objects.create"): (
        "ApiKey.issue: a key's row made with its hash in one place, which projects."
        "project_key_create, the admin and the tests call"
    ),
    ("costboard/management/commands/ensure_admin.py", "users.objects.create_superuser"): (
        "the deploy's first staff login (auth User), not a table of ours"
    ),
}
WRITES = frozenset(
    {
        "save",
        "save_base",
        "delete",
        "create",
        "bulk_create",
        "bulk_update",
        "get_or_create",
        "update_or_create",
        "create_user",
        "create_superuser",
        "_do_insert",
        "_do_update",
    }
)
QUERYSET_STEPS = frozenset(
    {"objects", "_default_manager", "filter", "exclude", "all", "select_for_update", "none"}
)
RAW_WRITE = re.compile(
    r"(?is)\b(?:insert\s+into|delete\s+from|merge\s+into|truncate\b|"
    r"(?:create|alter|drop)\s+table|update\s+\S+(?:\s+(?:as\s+)?\w+)?\s+set\b|"
    r"copy\s+\S+(?:\s*\([^)]*\))?\s+from)"
)


def _is_queryset(chain: list[str], querysets: set[str]) -> bool:
    """A receiver that is (or may be) a queryset: a manager's, or a name one was given to."""
    if QUERYSET_STEPS & set(chain) or any("queryset" in part for part in chain):
        return True
    return bool(chain) and chain[0] in querysets | {"qs", "rows"}


def _querysets(tree: ast.AST) -> set[str]:
    """Names a module assigns a queryset to, or annotates as one."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.arg) or node.annotation is None:
            continue
        if "QuerySet" in ast.unparse(node.annotation):
            names.add(node.arg)
    assigns = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)]
    for _ in range(3):  # chosen = qs.filter(…); rest = chosen.exclude(…)
        for node in assigns:
            if _is_queryset(receiver_chain(node.value), names):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _texts(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """Every string literal, an f-string read whole with `{}` for what it interpolates."""
    inside: set[int] = set()
    texts: list[tuple[ast.AST, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = ""
            for value in node.values:
                inside.add(id(value))
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    text += value.value
                else:
                    text += "{}"
            texts.append((node, text))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in inside:
            continue
        if isinstance(node.value, str):
            texts.append((node, node.value))
    return texts


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def writes_in(
    source: str, path: str, allowed: dict[tuple[str, str], str] = ALLOWED
) -> list[Finding]:
    """The database writes in one module's source, the `allowed` ones left out."""
    tree = ast.parse(source, filename=path)
    querysets = _querysets(tree)
    docstrings = _docstrings(tree)
    found: list[Finding] = []

    def add(node: ast.AST, key: str, why: str) -> None:
        if (path, key) in allowed:
            return
        code = (ast.get_source_segment(source, node) or "").strip().split("\n")[0]
        found.append(Finding(path, getattr(node, "lineno", 0), code[:100], why, key))

    for node, text in _texts(tree):
        if id(node) not in docstrings and (raw := RAW_WRITE.search(text)):
            words = raw.group(0).upper().split()
            verb = " ".join(
                words[:2] if words[1:2] in (["INTO"], ["FROM"], ["TABLE"]) else words[:1]
            )
            add(node, verb, f"raw SQL: {verb}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        method = node.func.attr
        chain = receiver_chain(node.func.value)
        receiver = ".".join(chain) or "an expression"
        if method in WRITES:
            add(node, f"{receiver}.{method}", f"{method} on {receiver}")
        elif method == "update" and _is_queryset(chain, querysets):
            add(node, f"{receiver}.{method}", f"update on a queryset: {receiver}")
    return sorted(found)


def scanned_files(root: Path, packages: tuple[str, ...] = SCANNED) -> list[Path]:
    return modules_outside(root, packages, WRITERS)


def scan(root: Path, packages: tuple[str, ...] = SCANNED) -> list[Finding]:
    return findings(scanned_files(root, packages), root, writes_in)


# --- the scan -------------------------------------------------------------------------------


def test_no_module_but_the_writers_writes() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in scanned_files(ROOT)}
    # the scan reads the modules that used to write, and the ones that would by habit
    assert {
        "costboard/api/metrics.py",
        "costboard/api/idempotency.py",
        "costboard/api/events.py",
        "costboard/pricing/families.py",
        "costboard/warmup.py",
        "costboard/admin/projects.py",
        "costboard/admin/usage.py",
        "costboard/dashboards/views/actions.py",
        "costboard/management/commands/create_api_key.py",
        "costboard/models/projects.py",
        "costboard/tasks.py",
        "costboard/ingest/plan.py",
        "costboard/ingest/writes/__init__.py",
    } <= files
    assert all((ROOT / writer).is_file() for writer in WRITERS)  # the list is not stale
    assert not {w.as_posix() for w in WRITERS} & files
    for path, key in ALLOWED:  # each exception is still there, or drop it from the list
        unfiltered = writes_in((ROOT / path).read_text(), path, allowed={})
        assert key in {finding.key for finding in unfiltered}, (path, key)
    findings = scan(ROOT)
    assert findings == [], "\n".join(map(str, findings))


def test_every_writer_writes() -> None:
    """A module that no longer writes leaves the list (and the scan reads it again)."""
    for writer in sorted(WRITERS):
        path = writer.as_posix()
        assert writes_in((ROOT / writer).read_text(), path, allowed={}), path


def test_the_writers_are_the_ones_the_architecture_names() -> None:
    text = ARCHITECTURE.read_text()
    section = text.split("## The writers", 1)[1].split("\n## ", 1)[0]
    listed = section[section.index("\n- ") :].split("\n\n", 1)[0]  # the list, not the prose
    named = {Path(p) for p in re.findall(r"`(costboard/[\w/]+\.py)`", listed)}
    assert named == set(WRITERS), sorted(map(str, named ^ set(WRITERS)))


PLANTED = [
    ("Session.objects.create(project=p, external_id='s')", "create on Session.objects"),
    ("Step.objects.bulk_create(rows)", "bulk_create on Step.objects"),
    ("Session.objects.filter(pk=1).update(state='ok')", "update on a queryset"),
    ("Session.objects.select_for_update().get(pk=1).delete()", "delete on Session"),
    ("IngestTally.objects.get_or_create(project=p, day=d)", "get_or_create on IngestTally"),
    ("ModelPrice.objects.update_or_create(model='m', defaults={})", "update_or_create on M"),
    ("project.sessions.create(external_id='s')", "create on project.sessions"),
    ("session.state = 'ok'\nsession.save(update_fields=['state'])", "save on session"),
    ("for row in found:\n    row.delete()", "delete on row"),
    ("def f(queryset: QuerySet[Session]) -> None:\n    queryset.update(state='ok')", "update on"),
    ("chosen = Session.objects.filter(state='ok')\nchosen.update(state='warned')", "update on"),
    ("def f(sessions: QuerySet) -> None:\n    sessions.delete()", "delete on sessions"),
    ("User.objects.create_user('ann')", "create_user on User.objects"),
    ("cursor.execute('UPDATE costboard_session SET state = %s', ['ok'])", "raw SQL: UPDATE"),
    ("cursor.execute(f'UPDATE {table} AS s SET families = %s')", "raw SQL: UPDATE"),
    ('cursor.execute(f"INSERT INTO {table} (a) VALUES (%s)")', "raw SQL: INSERT INTO"),
    ('cursor.execute("DELETE FROM costboard_step WHERE id = %s")', "raw SQL: DELETE FROM"),
    ('cursor.execute(f"TRUNCATE {table}")', "raw SQL: TRUNCATE"),
    ('cursor.execute(f"ALTER TABLE {table} DETACH PARTITION {month}")', "raw SQL: ALTER TABLE"),
    ('cursor.execute("CREATE TABLE costboard_step_2026_01 (LIKE costboard_step)")', "raw SQL"),
]


@pytest.mark.parametrize(("source", "why"), PLANTED, ids=[s for s, _ in PLANTED])
def test_a_planted_write_is_caught(source: str, why: str) -> None:
    (finding,) = writes_in(source, "costboard/planted.py")
    assert finding.why.startswith(why), finding


INNOCENT = [
    "Session.objects.filter(project=p).count()",
    "Session.objects.select_for_update().filter(pk=1).first()",
    "cursor.execute(f'SELECT id FROM {table} WHERE id = ANY(%s) FOR UPDATE OF {table}')",
    "cursor.execute('SELECT 1 FROM costboard_session FOR UPDATE SKIP LOCKED')",
    "counts.update(terms)",
    "row.update({name: 0 for name in SUMS})",
    "used.add(key)",
    "budget_services.session_caps_set(session_id=1, at=now)",
    "sessions_delete(session_ids=[1])",
    "cursor.execute('ANALYZE costboard_step')",
    "'''Updates the totals set by ingest.'''",
    "message = 'deleted from the list'",
]


@pytest.mark.parametrize("source", INNOCENT)
def test_reads_and_plain_objects_are_not_flagged(source: str) -> None:
    assert writes_in(source, "costboard/innocent.py") == []


def test_an_allowed_write_elsewhere_is_caught() -> None:
    """An exception holds for its module only: the same call in another module is a write."""
    issue = "cls.objects.create(project=project, prefix=prefix)"
    assert writes_in(issue, "costboard/models/projects.py") == []
    (finding,) = writes_in(issue, "costboard/api/events.py")
    assert finding.why == "create on cls.objects"


def test_the_scan_reads_every_module_of_the_package_it_is_given(tmp_path: Path) -> None:
    """A positive control on the files: a planted module in a nested folder is read and its
    write found; the listed writers and migrations are the only ones skipped, and a module
    beside a writer is read."""
    for folder in ("costboard/deep", "costboard/migrations", "costboard/ingest/writes"):
        (tmp_path / folder).mkdir(parents=True)
    write = "def f(m):\n    m.save()\n"
    (tmp_path / "costboard/deep/sneaky.py").write_text(write)
    (tmp_path / "costboard/migrations/0099_data.py").write_text(write)
    for writer in WRITERS:
        (tmp_path / writer).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / writer).write_text(write)
    (tmp_path / "costboard/ingest/writes/unlisted.py").write_text(write)
    (tmp_path / "costboard/views.py").write_text("Session.objects.filter(pk=1).delete()\n")
    found = scan(tmp_path)
    assert [(f.path, f.line) for f in found] == [
        ("costboard/deep/sneaky.py", 2),
        ("costboard/ingest/writes/unlisted.py", 2),
        ("costboard/views.py", 1),
    ]
