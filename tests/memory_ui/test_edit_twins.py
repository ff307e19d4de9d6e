"""Two reviewers editing two memories of a scope into one sentence at once: the second edit
waits for the first (the project's row, as proposals take it) and is refused naming it, so
MEMORY.md never has the line twice (docs/memory.md, "Review and permissions")."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from costboard.models import Project
from memory_ui.cleaners import MemoryFields, MemoryInputError
from memory_ui.memory_file import memory_md
from memory_ui.models import Memory
from memory_ui.writes import decisions, proposals
from tests.conftest import make_agent, run_in_threads
from tests.waiting import blocked_on_a_lock, wait_until

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="row locks are PostgreSQL's; CI runs them there"
)
# the project's locking read (pg_stat_activity keeps a query's first 1 kB: its column list)
PROJECT_LOCK = 'SELECT "costboard_project"."id"%'


def approved(project: Project, content: str) -> Memory:
    fields = MemoryFields.of(content=content, type="project")
    memory = proposals.candidate_propose(project=project, fields=fields)
    assert memory is not None
    return decisions.memory_approve(memory, by=None)


@pytest.mark.django_db(transaction=True)
def test_two_edits_into_one_sentence_at_once_save_one_and_refuse_the_other() -> None:
    agent = make_agent("twins")
    first, second = approved(agent.project, "Use tabs"), approved(agent.project, "Use spaces")
    into = MemoryFields.of(content="Indent with four spaces", type="project")
    refused: list[str] = []
    first_held = threading.Event()

    def edit(index: int) -> None:
        if index == 0:  # the first reviewer: holds its edit open until the second waits on it
            try:
                with transaction.atomic():
                    decisions.memory_edit(first, fields=into, by=None)
                    first_held.set()
                    wait_until(
                        lambda: blocked_on_a_lock(PROJECT_LOCK) == 1,
                        what="the second edit behind the first",
                    )
            finally:
                first_held.set()
            return
        first_held.wait(timeout=30)
        try:
            decisions.memory_edit(second, fields=into, by=None)
        except MemoryInputError as exc:
            refused.append(exc.message)

    errors = run_in_threads(2, edit)
    assert errors == []
    assert refused == [
        f"memory #{first.pk} of scope project already says this (“Indent with four spaces”): "
        "reject or expire one of them, or merge them, rather than make them the same"
    ]
    assert sorted(memory_md(agent.project).text.splitlines()) == [
        "[project] Indent with four spaces",
        "[project] Use spaces",
    ]
