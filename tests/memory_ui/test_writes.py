"""Every memory write is a service, and every change a MemoryEvent.

1. A scan of the source of memory_ui/ and devtools/ (their migrations and the write modules,
   WRITERS, apart) finds no write of Memory, MemoryEvent, RetrievalLog or MemoryFeedback: no
   manager or queryset write rooted at those models, no write through their related managers,
   no row of theirs built by hand, no raw SQL writing their tables, and no `.save()` /
   `.delete()` / queryset `.update()` on anything but the few non-memory rows listed below.
   Planted writes show the scan catches each kind.
2. A whole life — detected, proposed again, edited, approved, rejected, searched and rated,
   merged, compressed, evicted, expired by a person and by its TTL — and the demo's seeding
   leave every memory equal to what its history says: folding its events' `after` in order
   gives its status, content and every other field they recorded.
"""

from __future__ import annotations

import ast
import re
from datetime import timedelta
from decimal import Decimal
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from costboard.outbox import outbox_dispatch
from memory_ui import lifecycle
from memory_ui.cleaners import MemoryFields, MemoryImport
from memory_ui.models import Memory
from memory_ui.writes import decisions, proposals
from memory_ui.writes.imports import memories_import
from tests.conftest import Agent
from tests.write_scan import Finding, findings, modules_outside, receiver_chain

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("memory_ui", "devtools")
# the write services, each by name: a module added to memory_ui/writes/ is scanned until it is
# listed here
WRITERS = frozenset(
    Path(f"memory_ui/writes/{name}.py")
    for name in ("history", "proposals", "decisions", "retrievals", "imports")
)
MODELS = frozenset({"Memory", "MemoryEvent", "RetrievalLog", "MemoryFeedback"})
# related managers that reach those tables: project.memories, memory.events, memory.feedback,
# memory.merged_from, memory.targets (and retrieval.feedback)
RELATED = frozenset({"memories", "events", "feedback", "merged_from", "targets"})
WRITES = frozenset(
    {
        "save",
        "save_base",
        "create",
        "update",
        "delete",
        "bulk_create",
        "bulk_update",
        "get_or_create",
        "update_or_create",
        "set",
        "add",
        "remove",
        "clear",
        "_do_insert",
        "_do_update",
    }
)
QUERYSET_STEPS = frozenset(
    {"objects", "_default_manager", "filter", "exclude", "all", "select_for_update", "none"}
)
RAW_WRITE = re.compile(
    r"(?i)\b(?:insert\s+into|update|delete\s+from|truncate(?:\s+table)?|copy)\s+\"?"
    r"memory_ui_(?:memory|memoryevent|retrievallog|memoryfeedback)\b"
)
# `.save()` and `.delete()` outside services that write other tables, each checked by hand:
# (file, receiver) → what it is
NOT_MEMORY = {
    ("devtools/page_bench.py", "user.save"): "the bench's staff login (auth User)",
    ("devtools/screenshot.py", "user.save"): "docs_screenshot's staff login (auth User)",
    ("devtools/ingest_bench.py", "project.delete"): "a bench's own projects (projects_removed)",
    # the bench's own project: its memories and their history go with it, all of them
    ("devtools/memory_bench.py", "project.delete"): "the memory bench's own project",
}


def _non_memory_model(chain: list[str]) -> bool:
    """Rooted at another model (Project.objects…): not a memory table."""
    return bool(chain) and chain[0][:1].isupper() and chain[0] not in MODELS


def _querysets(tree: ast.AST) -> set[str]:
    """Names a module assigns a queryset to (of a memory model, or of one it can't tell)."""
    names: set[str] = set()
    assigns = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)]
    for _ in range(3):  # chosen = qs.filter(…); rest = chosen.exclude(…)
        for node in assigns:
            chain = receiver_chain(node.value)
            if _non_memory_model(chain):
                continue
            if QUERYSET_STEPS & set(chain) or (chain and chain[0] in names | {"qs", "queryset"}):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _queryset(chain: list[str], querysets: set[str]) -> bool:
    """A receiver that is (or may be) a queryset of a memory model."""
    if _non_memory_model(chain):
        return False
    if QUERYSET_STEPS & set(chain) or any("queryset" in part for part in chain):
        return True
    return bool(chain) and chain[0] in querysets | {"qs"}


def writes_in(source: str, path: str) -> list[Finding]:
    """The writes of the memory tables in one module's source."""
    tree = ast.parse(source, filename=path)
    querysets = _querysets(tree)
    found: list[Finding] = []

    def add(node: ast.AST, why: str) -> None:
        code = ast.get_source_segment(source, node) or ""
        found.append(Finding(path, getattr(node, "lineno", 0), code.split("\n")[0][:100], why))

    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and RAW_WRITE.search(node.value)
        ):
            add(node, "raw SQL writing a memory table")
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name) and node.func.id in MODELS:
            add(node, f"a {node.func.id} row built by hand")
            continue
        if not isinstance(node.func, ast.Attribute) or node.func.attr not in WRITES:
            continue
        method = node.func.attr
        chain = receiver_chain(node.func.value)
        receiver = ".".join(chain)
        if chain and chain[0] in MODELS:
            add(node, f"{method} on {chain[0]}")
        elif RELATED & set(chain[1:]):
            add(node, f"{method} through a related manager of the memory tables")
        elif method in ("save", "save_base", "delete", "_do_insert", "_do_update"):
            if (path, f"{receiver}.{method}") not in NOT_MEMORY:
                add(node, f"{method} on {receiver or 'an expression'}: a memory row?")
        elif method in ("update", "bulk_create", "bulk_update") and _queryset(chain, querysets):
            add(node, f"{method} on a queryset of unknown model: a memory one?")
    return sorted(found)


def scanned_files(root: Path, packages: tuple[str, ...] = SCANNED) -> list[Path]:
    return modules_outside(root, packages, WRITERS)


def scan(root: Path, packages: tuple[str, ...] = SCANNED) -> list[Finding]:
    return findings(scanned_files(root, packages), root, writes_in)


# --- the scan -------------------------------------------------------------------------------


def test_no_module_but_services_writes_the_memory_tables() -> None:
    files = {p.relative_to(ROOT).as_posix() for p in scanned_files(ROOT)}
    # the scan reads the modules that used to write (and would again, by habit)
    assert {
        "memory_ui/views.py",
        "memory_ui/ranking.py",
        "memory_ui/lifecycle.py",
        "memory_ui/admin.py",
        "memory_ui/api.py",
        "devtools/demo.py",
        "devtools/memory_bench.py",
    } <= files
    assert all((ROOT / writer).is_file() for writer in WRITERS)  # the list is not stale
    assert not {w.as_posix() for w in WRITERS} & files
    assert "memory_ui/writes/__init__.py" in files
    for path, code in NOT_MEMORY:  # the exceptions are still there, or drop them from the list
        assert f"{code}(" in (ROOT / path).read_text(), (path, code)
    findings = scan(ROOT)
    assert findings == [], "\n".join(map(str, findings))


PLANTED = [
    ("Memory.objects.create(project=p, content='x', type='user')", "create on Memory"),
    ("MemoryEvent.objects.bulk_create(rows)", "bulk_create on MemoryEvent"),
    ("Memory.objects.filter(pk=1).update(status='approved')", "update on Memory"),
    ("Memory.objects.select_for_update().get(pk=1).delete()", "delete on Memory"),
    ("RetrievalLog.objects.create(project=p, query='q', k=5, results=0)", "create on Retr"),
    ("MemoryFeedback.objects.get_or_create(memory=m, useful=True)", "get_or_create on MemoryF"),
    ("Memory.targets.through.objects.create(from_memory_id=1, to_memory_id=2)", "create on M"),
    ("row = Memory(project=p, content='x')", "a Memory row built by hand"),
    ("memory.status = 'expired'\nmemory.save(update_fields=['status'])", "save on memory"),
    ("proposal.targets.set([1, 2])", "set through a related manager"),
    ("memory.events.create(action='approved')", "create through a related manager"),
    ("project.memories.update(status='expired')", "update through a related manager"),
    ("queryset.update(status='approved')", "update on a queryset of unknown model"),
    ("chosen = qs.filter(status='pending')\nchosen.update(status='rejected')", "update on a q"),
    ("cursor.execute('UPDATE memory_ui_memory SET status = %s', ['expired'])", "raw SQL"),
    ('cursor.execute("DELETE FROM memory_ui_memoryevent")', "raw SQL"),
    ("for m in rows:\n    m.delete()", "delete on m"),
]


@pytest.mark.parametrize(("source", "why"), PLANTED, ids=[s for s, _ in PLANTED])
def test_a_planted_write_is_caught(source: str, why: str) -> None:
    (finding,) = writes_in(source, "memory_ui/planted.py")
    assert finding.why.startswith(why), finding


INNOCENT = [
    "Memory.objects.filter(project=p).count()",
    "Memory.objects.select_for_update().filter(pk=1).first()",
    "list(memory.targets.order_by('pk'))",
    "taken.update((a, b))",
    "counts.update(terms(text))",
    "Project.objects.filter(pk=1).update(name='x')",
    "decisions.memory_approve(memory, by=user)",
    "Memory.Type('user')",
    "cursor.execute('ANALYZE memory_ui_memory')",
    "self.events.append((at, event))",
]


@pytest.mark.parametrize("source", INNOCENT)
def test_reads_and_other_tables_are_not_flagged(source: str) -> None:
    assert writes_in(source, "memory_ui/innocent.py") == []


def test_the_scan_reads_every_module_of_the_packages_it_is_given(tmp_path: Path) -> None:
    """A positive control on the files: a planted module in a nested folder is read and its
    write found; the listed write modules and migrations are the only ones skipped, and a
    module beside them in memory_ui/writes/ is read."""
    for folder in ("memory_ui/deep", "memory_ui/migrations", "memory_ui/writes", "devtools"):
        (tmp_path / folder).mkdir(parents=True)
    write = "def f(m):\n    m.save()\n"
    (tmp_path / "memory_ui/deep/sneaky.py").write_text(write)
    (tmp_path / "memory_ui/migrations/0009_data.py").write_text(write)
    for writer in WRITERS:
        (tmp_path / writer).write_text(write)
    (tmp_path / "memory_ui/writes/unlisted.py").write_text(write)
    (tmp_path / "devtools/seed.py").write_text("Memory.objects.bulk_create([])\n")
    found = scan(tmp_path)
    assert [(f.path, f.line) for f in found] == [
        ("devtools/seed.py", 1),
        ("memory_ui/deep/sneaky.py", 2),
        ("memory_ui/writes/unlisted.py", 2),
    ]


# --- the history says what the row is --------------------------------------------------------


def replayed(memory: Memory) -> dict[str, Any]:
    """What a memory's events recorded, folded in order: each event's `after` over the ones
    before it."""
    state: dict[str, Any] = {}
    for event in memory.events.order_by("at", "id"):
        state.update(event.after or {})
    return state


def as_recorded(memory: Memory, key: str) -> Any:
    """The row's value of `key` in the form an event records it."""
    if key == "importance":
        return memory.importance
    if key == "targets":
        return sorted(memory.targets.values_list("pk", flat=True))
    if key == "merged_into":
        return memory.merged_into_id
    return getattr(memory, key)


def assert_history_matches(memories: Any) -> int:
    checked = 0
    for memory in memories:
        first = memory.events.order_by("at", "id").first()
        assert first is not None and first.action == "proposed", memory
        state = replayed(memory)
        assert {"status", "content"} <= set(state), (memory.pk, state)
        for key, value in state.items():
            expected = Decimal(value) if key == "importance" else value
            assert as_recorded(memory, key) == expected, (memory.pk, key, value)
        checked += 1
    return checked


HTMX = {"HX-Request": "true"}


def _search_and_rate(agent: Agent, q: str, memory_id: int) -> None:
    auth = {"Authorization": f"Bearer {agent.key}"}
    found = agent.client.get("/api/v1/memory/search", {"q": q}, headers=auth)
    assert found.status_code == 200, found.content
    body = found.json()
    assert memory_id in [r["id"] for r in body["results"]]
    rated = agent.client.post(
        "/api/v1/memory/feedback",
        {"memory_id": memory_id, "useful": True, "retrieval_id": body["retrieval_id"]},
        content_type="application/json",
        headers=auth,
    )
    assert rated.status_code == 201, rated.content


@pytest.mark.slow
@pytest.mark.django_db
def test_a_whole_life_leaves_every_memory_as_its_history_says(agent: Agent) -> None:
    staff = get_user_model().objects.create_superuser("root", "", "pw-root-123")
    web = Client()
    web.force_login(staff)
    project = agent.project

    # detected in a turn (ingest hands the turns to detection after commit), then said again:
    # one candidate, proposed twice
    agent.events(
        {"type": "session", "session_id": "s1", "user_id": "ann"},
        {"type": "turn", "session_id": "s1", "turn": 1,
         "user_message": "From now on always run ruff before pushing to the billing repo."},
        {"type": "turn", "session_id": "s1", "turn": 2,
         "user_message": "Remember: always run ruff before pushing to the billing repo."},
    )  # fmt: skip
    outbox_dispatch()
    detected = Memory.objects.get(project=project)
    assert detected.times_proposed == 2 and detected.status == "pending"

    # edited and approved in one step (the queue's "Save and approve")
    response = web.post(
        f"/memory/{detected.pk}/edit/",
        {"content": "Run ruff before every push to billing", "type": "feedback",
         "scope": "project", "importance": "0.8", "tags": "lint", "ttl_days": ""},
        headers=HTMX,
    )  # fmt: skip
    assert response.status_code == 200
    detected.refresh_from_db()
    assert (detected.status, detected.content) == (
        "approved",
        "Run ruff before every push to billing",
    )
    _search_and_rate(agent, "ruff push", detected.pk)

    # candidates from the API; some approved and rejected in bulk, one edited without approving
    def candidate(content: str, **fields: Any) -> int:
        response = agent.client.post(
            "/api/v1/memory/candidates",
            {"content": content, "type": fields.pop("type", "project"), **fields},
            content_type="application/json",
            headers={"Authorization": f"Bearer {agent.key}"},
        )
        assert response.status_code in (200, 201), response.content
        return int(response.json()["id"])

    dupes = [candidate(f"The staging database listens on port 5433{s}") for s in ("", " now")]
    assert dupes[0] == dupes[1]  # a near-duplicate is proposed again, not added
    group = [
        candidate("Deploys to staging happen on Tuesdays"),
        candidate("Deploys to staging need a green build"),
        candidate("Deploys to staging are announced in the ops channel"),
    ]
    pair = [candidate("Invoices are sent on the first of every month", type="reference")]
    short = candidate("Release freeze starts in December", ttl_days=3)
    kept = candidate("The on-call rota lives in the ops wiki", type="reference")
    dropped = candidate("Use tabs for indentation in the frontend")
    web.post(f"/memory/{kept}/edit/", {"content": "The on-call rota is in the ops wiki",
             "type": "reference", "scope": "project", "importance": "0.4", "tags": "",
             "ttl_days": "", "save_only": "1"}, headers=HTMX)  # fmt: skip
    decided = web.post(
        "/memory/review/bulk/",
        {"action": "approve", "ids": [dupes[0], *group, *pair, short, kept]},
        headers=HTMX,
    )
    assert "Approved 7 candidates." in decided.content.decode()
    web.post("/memory/review/bulk/", {"action": "reject", "ids": [dropped]}, headers=HTMX)
    # an approved duplicate of the reference, written as an import (no duplicate check)
    twin_text = "Invoices are sent on the first of each month"
    (twin,) = memories_import(
        project=project, memories=[MemoryImport.of(type="reference", content=twin_text)]
    )

    # the lifecycle proposes: compress the three deploy notes, merge the invoice twins
    result = lifecycle.lifecycle_run()
    assert (result.compressions, result.merges) == (1, 1), result
    proposals = list(Memory.objects.filter(status="pending").exclude(proposal="new"))
    web.post(
        "/memory/review/bulk/",
        {"action": "approve", "ids": [p.pk for p in proposals]},
        headers=HTMX,
    )
    gone = Memory.objects.filter(pk__in=[*group, *pair, twin.pk])
    assert set(gone.values_list("status", flat=True)) == {"merged"}

    # expired by a person, and by its TTL
    web.post(f"/memory/{kept}/expire/", headers=HTMX)
    later = timezone.now() + timedelta(days=4)
    assert decisions.memories_expire_due(now=later) == 1
    assert Memory.objects.get(pk=short).status == "expired"

    # MEMORY.md over its cap: an eviction proposal, brought up to date, then approved
    memories_import(
        project=project,
        memories=[
            MemoryImport.of(
                type="project",
                content=f"Fact {i:03} " + "x" * 120,
                importance=Decimal("0.9"),
            )
            for i in range(200)
        ],
    )
    lifecycle.project_proposals(project)
    one_more = "One more fact " + "y" * 120
    memories_import(
        project=project,
        memories=[MemoryImport.of(type="project", content=one_more, importance=Decimal("0.95"))],
    )
    lifecycle.project_proposals(project)
    (eviction,) = Memory.objects.filter(status="pending", proposal="evict")
    assert eviction.times_proposed == 2
    decisions.memory_approve(eviction, by=staff)
    assert Memory.objects.filter(status="expired").exists()

    statuses = set(Memory.objects.values_list("status", flat=True))
    assert statuses == {"pending", "approved", "rejected", "expired", "merged"}
    # what still waits: the lifecycle's proposals over the look-alike facts
    waiting = Memory.objects.filter(status="pending")
    assert set(waiting.values_list("proposal", flat=True)) <= {"merge", "compress"}
    assert assert_history_matches(Memory.objects.all()) == Memory.objects.count()


@pytest.mark.slow
@pytest.mark.django_db
def test_the_demo_memories_are_as_their_history_says() -> None:
    call_command("seed_demo", sessions=24, stdout=StringIO())
    memories = Memory.objects.all()
    assert memories.filter(status="approved").exists() and memories.filter(status="pending")
    assert assert_history_matches(memories) == memories.count() >= 48
    approved = memories.filter(status="approved").exclude(proposed_by="")
    assert {e.actor_name for m in approved for e in m.events.filter(action="approved")} == {
        "demo reviewer"
    }


@pytest.mark.django_db
def test_a_history_that_disagrees_with_its_row_is_caught(agent: Agent) -> None:
    """A negative control for the check above: a status written around the services."""
    memory = proposals.candidate_propose(
        project=agent.project, fields=MemoryFields.of(type="user", content="Likes tea")
    )
    assert memory is not None
    assert assert_history_matches([memory]) == 1
    Memory.objects.filter(pk=memory.pk).update(status="approved")  # what a view once could do
    memory.refresh_from_db()
    with pytest.raises(AssertionError):
        assert_history_matches([memory])
