"""The memory pages: the review queue (/memory/review/) with its htmx decisions, edit form,
select-all and filters; the memory browser (/memory/) with search, expire, MEMORY.md's
preview; a memory's history; the metrics; who may act; bounded query counts."""

from __future__ import annotations

import random
import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser, Group, Permission, User
from django.test import Client
from django.utils import timezone

from costboard.models import Membership, Session, Turn
from memory_ui import memory_file, selectors
from memory_ui.cleaners import MemoryFields
from memory_ui.memory_file import memory_md
from memory_ui.models import Memory, MemoryEvent, MemoryFeedback, RetrievalLog
from memory_ui.text import fingerprint
from memory_ui.writes import decisions, proposals
from tests.conftest import Agent, make_agent

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}


# --- helpers --------------------------------------------------------------------------------


MEMORY_FIELDS = ("type", "scope", "importance", "tags", "ttl_days")


def propose(agent: Agent, content: str, **given: Any) -> Memory:
    fields = {name: given.pop(name) for name in MEMORY_FIELDS if name in given}
    fields.setdefault("type", "project")
    memory = proposals.candidate_propose(
        project=agent.project, fields=MemoryFields.of(content=content, **fields), **given
    )
    assert memory is not None
    return memory


def approved(agent: Agent, content: str, **fields: Any) -> Memory:
    """A new memory, proposed and approved through the services (with their history)."""
    memory = propose(agent, content, **fields)
    assert memory.status == "pending" and memory.times_proposed == 1, f"not new: {content}"
    return decisions.memory_approve(memory, by=None, now=fields.get("now"))


def stored(agent: Agent, content: str, status: str = "approved", **fields: Any) -> Memory:
    """A memory written as it is, without the services' duplicate check."""
    fields.setdefault("type", "project")
    if status == "approved":
        fields.setdefault("decided_at", timezone.now())
    return Memory.objects.create(
        project=agent.project,
        content=content,
        status=status,
        fingerprint=fingerprint(content),
        **fields,
    )


def words(seed: int | str, n: int = 3) -> str:
    """Made-up words, different for each seed: sentences no duplicate check confuses."""
    rng = random.Random(str(seed))
    return " ".join(
        "".join(rng.choice("bcdfghjklmnprstvz") + rng.choice("aeiou") for _ in range(3))
        for _ in range(n)
    )


def reviewers() -> Group:
    """The Reviewers group (a migration makes it; a transactional test's flush may not have
    left it)."""
    group, _ = Group.objects.get_or_create(name="Reviewers")
    group.permissions.add(
        Permission.objects.get(content_type__app_label="memory_ui", codename="review_memory")
    )
    return group


def person(*agents: Agent, reviewer: bool = False) -> tuple[AbstractUser, Client]:
    user = get_user_model().objects.create_user(
        f"person{get_user_model().objects.count()}", "", "pw"
    )
    for agent in agents:
        Membership.objects.create(user=user, project=agent.project)
    if reviewer:
        user.groups.add(reviewers())
    client = Client()
    client.force_login(user)
    return user, client


def root() -> User:
    return get_user_model().objects.get(username="root")


def queued(html: str) -> list[int]:
    """The candidates a page lists, in order."""
    return [
        int(pk)
        for pk in re.findall(r'<article class="candidate card[^"]*" id="candidate-(\d+)"', html)
    ]


def candidate(html: str, pk: int) -> str:
    found = re.search(
        rf'<article class="candidate card[^"]*" id="candidate-{pk}".*?</article>', html, re.S
    )
    assert found is not None, f"no candidate {pk}"
    return found.group(0)


def listed(html: str) -> list[int]:
    """The memories a browser page lists."""
    return [int(pk) for pk in re.findall(r'<li class="memory-item[^"]*" id="memory-(\d+)"', html)]


def item(html: str, pk: int) -> str:
    found = re.search(rf'<li class="memory-item[^"]*" id="memory-{pk}".*?</li>', html, re.S)
    assert found is not None, f"no memory {pk}"
    return found.group(0)


def events(memory: Memory) -> list[tuple[str, str]]:
    return [(e.action, e.actor_name) for e in memory.events.order_by("at", "id")]


def post(client: Client, url: str, data: dict[str, Any] | None = None) -> Any:
    return client.post(url, data or {}, headers=HTMX)


def edit_fields(memory: Memory, **changes: str) -> dict[str, str]:
    fields = {
        "content": memory.content,
        "type": memory.type,
        "scope": memory.scope,
        "importance": str(memory.importance),
        "tags": ", ".join(memory.tags),
        "ttl_days": "" if memory.ttl_days is None else str(memory.ttl_days),
    }
    fields.update(changes)
    return fields


def turn_of(agent: Agent, session_id: str, number: int, message: str) -> Turn:
    agent.events(
        {"type": "turn", "session_id": session_id, "turn": number, "user_message": message}
    )
    return Turn.objects.get(session__external_id=session_id, number=number)


# --- login ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/memory/review/", "/memory/", "/memory/metrics/", "/memory/1/", "/memory/1/edit/"]
)
def test_every_page_needs_a_login(client: Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize(
    "path",
    [
        "/memory/1/approve/",
        "/memory/1/reject/",
        "/memory/1/edit/",
        "/memory/1/expire/",
        "/memory/review/bulk/",
    ],
)
def test_every_action_needs_a_login(client: Client, path: str) -> None:
    response = client.post(path)
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


# --- the queue ------------------------------------------------------------------------------


def test_the_queue_lists_pending_candidates_newest_first_with_their_details(
    staff: Client, agent: Agent
) -> None:
    now = timezone.now()
    turn = turn_of(agent, "chat-1", 2, "Remember that we deploy staging every Friday at noon.")
    session = turn.session
    old = propose(
        agent,
        "Staging deploys happen every Friday at noon",
        type="project",
        session=session,
        turn=turn,
        importance="0.7",
        now=now - timedelta(hours=2),
    )
    propose(agent, "Staging deploys happen every Friday at noon.", now=now - timedelta(hours=1))
    user_pref = propose(
        agent,
        "Prefers answers in French",
        type="user",
        scope="user:u-7",
        evidence="I prefer answers in French, write to [email] please",
        redactions=["email"],
        source=Memory.Source.USER_STATED,
        proposed_by="detector",
        now=now,
    )
    existing = stored(agent, "Staging deploys run on Fridays around noon")
    decided = propose(agent, "Use tabs, not spaces", type="feedback")
    decisions.memory_reject(decided, by=None)

    html = staff.get("/memory/review/").content.decode()
    assert queued(html) == [user_pref.pk, old.pk]  # newest first; decided ones are gone
    assert existing.pk not in queued(html)

    row = candidate(html, old.pk)
    assert 'data-type="project"' in row and 'data-scope="project"' in row
    assert "importance 0.75" in row  # 0.7, raised for being proposed again
    assert 'data-times="2"' in row and "proposed 2 times" in row
    assert 'data-proposal="new"' in row
    # the sentence is its turn's message, the candidate's words marked
    assert "<mark>Friday</mark>" in row and "<mark>staging</mark>" in row
    assert f'href="/sessions/{session.pk}/#turn-2" data-session-link>session chat-1, turn 2' in row
    # the similar approved memory beside it, with its similarity, loaded as the card shows
    assert f'hx-get="/memory/{old.pk}/similar/" hx-trigger="revealed"' in row
    similar = selectors.similar_memories(
        agent.project, "project", old.content, exclude=old.pk, statuses=("approved",)
    )
    assert [m.pk for m, _ in similar] == [existing.pk]
    aside = staff.get(f"/memory/{old.pk}/similar/", headers=HTMX).content.decode()
    assert f'data-similar-to="{existing.pk}"' in aside
    assert f"{similar[0][1] * 100:.0f}%" in aside
    for label in ("Approve", "Edit", "Reject"):
        assert f">{label}</button>" in row

    pref = candidate(html, user_pref.pk)
    assert 'data-scope="user:u-7"' in pref and 'data-type="user"' in pref
    assert "I prefer <mark>answers</mark> in <mark>French</mark>, write to [email] please" in pref
    assert "redacted before storing: email" in pref
    assert "stated by the user · by detector" in pref
    assert "proposed once" in pref
    aside = staff.get(f"/memory/{user_pref.pk}/similar/").content.decode()
    assert "data-similar-none" in aside  # nothing similar in its scope

    assert re.search(r'data-count="all">2<', html)
    assert re.search(r'data-count="project">1<', html)
    assert re.search(r'data-count="user">1<', html)
    assert re.search(r'data-count="feedback">0<', html)
    assert "Select all" in html and "Approve selected" in html and "Reject selected" in html


def test_a_lifecycle_proposal_shows_its_kind_and_targets(staff: Client, agent: Agent) -> None:
    one = stored(agent, "The API runs on port 8000")
    two = stored(agent, "The API server listens on port 8000")
    merge = Memory.objects.create(
        project=agent.project,
        type="project",
        content="The API listens on port 8000",
        proposal=Memory.Proposal.MERGE,
    )
    merge.targets.add(one, two)
    row = candidate(staff.get("/memory/review/").content.decode(), merge.pk)
    assert 'data-proposal="merge"' in row
    assert "merges, when approved:" in row
    assert f'data-target="{one.pk}"' in row and f'data-target="{two.pk}"' in row
    assert "[project] The API server listens on port 8000" in row


def test_a_candidates_similar_aside_is_the_services_own(staff: Client, agent: Agent) -> None:
    for text in (
        "Deploys happen on Fridays",
        "Deploys happen on Friday afternoons",
        "Friday deploys need two reviewers",
        "The database is PostgreSQL 16",
        "We use PostgreSQL for the database",
    ):
        stored(agent, text)
    stored(agent, "Deploys happen on Fridays at noon", scope="user:x")  # another scope
    stored(agent, "Deploys happen every Friday", status="rejected")  # not approved
    other = make_agent("other")
    stored(other, "Deploys happen every Friday")  # another project
    pending = [
        stored(agent, "Deploys happen every Friday", status="pending"),
        stored(agent, "Our database is PostgreSQL", status="pending"),
        stored(agent, "Deploys happen on Fridays, says x", status="pending", scope="user:x"),
        stored(agent, "Nothing like anything else here", status="pending"),
    ]
    shown = {}
    for memory in pending:
        response = staff.get(f"/memory/{memory.pk}/similar/", headers=HTMX)
        assert response.status_code == 200
        html = response.content.decode()
        expected = selectors.similar_memories(
            agent.project, memory.scope, memory.content, exclude=memory.pk, statuses=("approved",)
        )
        shown[memory.pk] = [int(pk) for pk in re.findall(r'data-similar-to="(\d+)"', html)]
        assert shown[memory.pk] == [m.pk for m, _ in expected]
        for _, score in expected:
            assert f"{score * 100:.0f}%" in html
    assert len(shown[pending[0].pk]) == 3 and shown[pending[3].pk] == []
    assert "data-similar-none" in staff.get(f"/memory/{pending[3].pk}/similar/").content.decode()
    # another project's memory: not found for someone outside it
    _, outsider = person(other)
    assert outsider.get(f"/memory/{pending[0].pk}/similar/").status_code == 404


@pytest.mark.slow
def test_filters_by_type_and_scope_and_links_keep_them(staff: Client, agent: Agent) -> None:
    a = propose(agent, "Likes short answers", type="user", scope="user:ann")
    b = propose(agent, "The repo uses ruff", type="project")
    c = propose(agent, "Dislikes emoji", type="feedback", scope="user:ann")
    html = staff.get("/memory/review/?project=acme&type=user").content.decode()
    assert queued(html) == [a.pk]
    assert '<option value="user" selected>' in html
    # counts are per type whatever the type filter
    assert re.search(r'data-count="all">3<', html)
    # links keep the project and the filters
    assert 'href="?project=acme&amp;type=feedback"' in html
    assert f'hx-post="/memory/{a.pk}/approve/?project=acme&amp;type=user"' in html
    assert 'href="/memory/review/?project=acme"' in html  # nav and tabs

    scoped = staff.get("/memory/review/?scope=user:ann").content.decode()
    assert queued(scoped) == [c.pk, a.pk]
    assert re.search(r'data-count="all">2<', scoped)
    assert '<option value="user:ann" selected>' in scoped
    assert queued(staff.get("/memory/review/?scope=project").content.decode()) == [b.pk]
    # a filter the page does not know is ignored, not an error
    assert len(queued(staff.get("/memory/review/?type=nope&scope=%20x").content.decode())) == 3

    fragment = staff.get("/memory/review/?type=feedback", headers=HTMX).content.decode()
    assert fragment.lstrip().startswith('<div id="queue"')
    assert "<html" not in fragment
    assert queued(fragment) == [c.pk]


def test_the_queue_pages_by_fifty(staff: Client, agent: Agent) -> None:
    now = timezone.now()
    Memory.objects.bulk_create(
        Memory(
            project=agent.project,
            type="project",
            content=f"fact number {i}",
            created_at=now - timedelta(minutes=i),
        )
        for i in range(55)
    )
    first = staff.get("/memory/review/").content.decode()
    second = staff.get("/memory/review/?page=2").content.decode()
    assert len(queued(first)) == 50 and len(queued(second)) == 5
    assert not set(queued(first)) & set(queued(second))
    assert "page 2 of 2" in second


# --- decisions ------------------------------------------------------------------------------


def test_approve_with_htmx_swaps_the_row_and_writes_the_history(
    staff: Client, agent: Agent
) -> None:
    memory = propose(agent, "Releases are tagged vX.Y.Z")
    other = propose(agent, "CI runs on every push", type="reference")
    response = post(staff, f"/memory/{memory.pk}/approve/?project=acme")
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith(
        f'<article class="candidate-done decided-approved" id="candidate-{memory.pk}"'
    )
    assert "approved ✓" in body and "<html" not in body
    # the counts come along, swapped out of band
    assert 'aria-label="Pending by type" hx-swap-oob="true"' in body
    assert re.search(r'data-count="all">1<', body)
    memory.refresh_from_db()
    assert memory.status == "approved" and memory.decided_by == root()
    assert events(memory) == [("proposed", ""), ("approved", "root")]
    assert queued(staff.get("/memory/review/").content.decode()) == [other.pk]

    # deciding twice says so, and changes nothing
    again = post(staff, f"/memory/{memory.pk}/reject/").content.decode()
    assert "approved ✓" in again and "(already approved)" in again
    assert events(memory)[-1] == ("approved", "root")


def test_reject_with_htmx(staff: Client, agent: Agent) -> None:
    memory = propose(agent, "The office cat is named Pixel", type="user")
    body = post(staff, f"/memory/{memory.pk}/reject/").content.decode()
    assert 'data-decided="rejected"' in body and "rejected" in body
    memory.refresh_from_db()
    assert memory.status == "rejected" and memory.decided_by == root()
    assert events(memory)[-1] == ("rejected", "root")
    # the sentence stays out
    assert (
        proposals.candidate_propose(
            project=agent.project,
            fields=MemoryFields.of(type="user", content="the office cat is named pixel"),
        )
        is None
    )


def test_a_plain_form_post_redirects_back_with_the_filters(staff: Client, agent: Agent) -> None:
    memory = propose(agent, "Tests run with pytest")
    response = staff.post(f"/memory/{memory.pk}/approve/?project=acme&type=project")
    assert response.status_code == 303
    assert response["Location"] == "/memory/review/?project=acme&type=project"
    memory.refresh_from_db()
    assert memory.status == "approved"


def test_the_edit_form_opens_inline(staff: Client, agent: Agent) -> None:
    memory = propose(agent, "Deploys need a green build", tags=["ci", "deploy"], ttl_days=30)
    body = staff.get(f"/memory/{memory.pk}/edit/?project=acme", headers=HTMX).content.decode()
    assert body.lstrip().startswith(
        f'<article class="candidate card editing" id="candidate-{memory.pk}"'
    )
    textarea = f'<textarea name="content" id="edit-content-{memory.pk}" rows="2" data-counter'
    assert f'{textarea} data-max="150"' in body
    assert ">Deploys need a green build</textarea>" in body
    assert f'data-counter-of="edit-content-{memory.pk}" aria-live="polite">26/150</output>' in body
    assert '<option value="project" selected>' in body
    assert 'name="tags" value="ci, deploy"' in body and 'name="ttl_days" value="30"' in body
    assert 'name="importance" value="0.5"' in body
    assert "Save and approve" in body and "Saving approves the candidate" in body
    assert f'hx-post="/memory/{memory.pk}/edit/?project=acme"' in body
    # without htmx: a page of its own
    page = staff.get(f"/memory/{memory.pk}/edit/").content.decode()
    assert "<html" in page and "Save and approve" in page


def test_saving_an_edit_approves_it_with_the_history_of_both(staff: Client, agent: Agent) -> None:
    memory = propose(agent, "deploys need a green build")
    response = post(
        staff,
        f"/memory/{memory.pk}/edit/",
        edit_fields(
            memory,
            content="  Deploys need   a green CI build ",
            type="feedback",
            scope="user:ann",
            importance="0.9",
            tags="ci, deploy, ",
            ttl_days="14",
        ),
    )
    assert response.status_code == 200
    assert 'data-decided="approved"' in response.content.decode()
    memory.refresh_from_db()
    assert (memory.content, memory.type, memory.scope) == (
        "Deploys need a green CI build",
        "feedback",
        "user:ann",
    )
    assert memory.importance == Decimal("0.9") and memory.tags == ["ci", "deploy"]
    assert memory.ttl_days == 14 and memory.status == "approved"
    assert memory.expires_at is not None
    assert events(memory) == [("proposed", ""), ("edited", "root"), ("approved", "root")]
    edit = memory.events.get(action="edited")
    assert edit.before == {
        "content": "deploys need a green build",
        "importance": "0.500",
        "scope": "project",
        "tags": [],
        "ttl_days": None,
        "type": "project",
    }
    assert edit.after == {
        "content": "Deploys need a green CI build",
        "importance": "0.900",
        "scope": "user:ann",
        "tags": ["ci", "deploy"],
        "ttl_days": 14,
        "type": "feedback",
    }


def test_saving_and_approving_what_was_decided_meanwhile_changes_nothing(
    staff: Client, agent: Agent, monkeypatch: Any
) -> None:
    """The page read a pending candidate; another reviewer rejected it before the save: the
    edit and the approval are one service call, so neither happens."""
    memory = propose(agent, "deploys need a green build")
    read = selectors.memory_in_projects

    def read_then_someone_rejects(**kwargs: Any) -> Memory | None:
        found = read(**kwargs)
        if found is not None and found.status == "pending":
            decisions.memory_reject(Memory.objects.get(pk=found.pk), by=None)
        return found

    monkeypatch.setattr(selectors, "memory_in_projects", read_then_someone_rejects)
    response = post(
        staff, f"/memory/{memory.pk}/edit/", edit_fields(memory, content="Deploys need CI")
    )
    assert response.status_code == 422
    assert "This memory is rejected now: it was decided meanwhile." in response.content.decode()
    memory.refresh_from_db()
    assert (memory.status, memory.content) == ("rejected", "deploys need a green build")
    assert [a for a, _ in events(memory)] == ["proposed", "rejected"]


def test_saving_an_edit_of_what_another_reviewer_rejected_changes_nothing(
    staff: Client, agent: Agent
) -> None:
    """The edit form was opened on a pending candidate; another reviewer rejected it before
    the save was sent. The save is refused: the rejected sentence keeps its text, so it is
    still kept out when it is proposed again."""
    memory = propose(agent, "always deploy on Fridays")
    form = edit_fields(memory, content="Deploy on Fridays only before noon")
    decisions.memory_reject(memory, by=None)
    for extra in ({}, {"save_only": "1"}):
        response = post(staff, f"/memory/{memory.pk}/edit/", {**form, **extra})
        assert response.status_code == 422
        assert "This memory is rejected now: it was decided meanwhile." in (
            response.content.decode()
        )
    memory.refresh_from_db()
    assert (memory.status, memory.content) == ("rejected", "always deploy on Fridays")
    assert [a for a, _ in events(memory)] == ["proposed", "rejected"]
    again = proposals.candidate_propose(
        project=agent.project,
        fields=MemoryFields.of(type="project", content="always deploy on Fridays"),
    )
    assert again is None


def test_save_without_approving_keeps_it_pending(staff: Client, agent: Agent) -> None:
    memory = propose(agent, "Docs live in /docs")
    response = post(
        staff,
        f"/memory/{memory.pk}/edit/",
        {**edit_fields(memory, content="Docs live in the docs folder"), "save_only": "1"},
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith(f'<article class="candidate card" id="candidate-{memory.pk}"')
    assert "Docs live in the docs folder" in body
    assert "saved ✓" in body and ">Approve</button>" in body
    memory.refresh_from_db()
    assert memory.status == "pending" and memory.content == "Docs live in the docs folder"
    assert [a for a, _ in events(memory)] == ["proposed", "edited"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("content", "x" * 151, "Content: is 151 characters; at most 150: say it shorter."),
        ("content", "   ", "Content: is required: one sentence of what to remember."),
        ("type", "opinion", "Type: must be one of user, feedback, project, reference."),
        (
            "scope",
            "team:a",
            "Scope: must be &quot;project&quot; or &quot;user:&lt;user_id&gt;&quot; (a user_id "
            "of 1 to 128 characters, no control character).",
        ),
        ("importance", "1.5", "Importance: must be a number from 0 to 1, e.g. 0.7."),
        ("importance", "high", "Importance: must be a number from 0 to 1, e.g. 0.7."),
        # Decimal() reads other scripts' digits: "٠.٧" would be 0.7
        ("importance", "٠.٧", "Importance: must be a number from 0 to 1, e.g. 0.7."),
        ("importance", "０.５", "Importance: must be a number from 0 to 1, e.g. 0.7."),
        ("ttl_days", "0", "TTL days: must be a whole number of days from 1 to 36500."),
        ("ttl_days", "3.5", "TTL days: must be a whole number of days from 1 to 36500."),
        ("ttl_days", "²", "TTL days: must be a whole number of days from 1 to 36500."),
        ("ttl_days", "٣", "TTL days: must be a whole number of days from 1 to 36500."),
        pytest.param(
            "ttl_days",
            "9" * 5000,
            "TTL days: must be a whole number of days from 1 to 36500.",
            id="ttl_days-5000-digits",
        ),
        ("tags", ",".join(f"t{i}" for i in range(21)), "Tags: at most 20 tags."),
    ],
)
def test_a_refused_edit_comes_back_with_the_error_on_its_field(
    staff: Client, agent: Agent, field: str, value: str, message: str
) -> None:
    memory = propose(agent, "Lint with ruff before pushing")
    response = post(staff, f"/memory/{memory.pk}/edit/", edit_fields(memory, **{field: value}))
    assert response.status_code == 422
    body = response.content.decode()
    assert body.lstrip().startswith(
        f'<article class="candidate card editing" id="candidate-{memory.pk}"'
    )
    assert f'<p class="error" role="alert" data-error="{field}">{message}</p>' in body
    assert body.count('role="alert"') == 1
    # what was typed stays in the form, the cursor on the refused field
    if field == "content" and value.strip():
        assert f">{value}</textarea>" in body
        assert "151/150</output>" in body and 'class="counter over"' in body
    assert re.search(rf'name="{field}"[^>]*aria-invalid="true"[^>]*autofocus', body), body
    memory.refresh_from_db()
    assert memory.content == "Lint with ruff before pushing" and memory.status == "pending"
    assert [a for a, _ in events(memory)] == ["proposed"]


def test_a_nul_in_the_form_is_refused_once(staff: Client, agent: Agent) -> None:
    """Django's field refuses a NUL before the content's rule (memory_ui.cleaners) would: the
    field shows one error, not both."""
    memory = propose(agent, "Lint with ruff before pushing")
    response = post(
        staff, f"/memory/{memory.pk}/edit/", edit_fields(memory, content="Lint\x00 with ruff")
    )
    assert response.status_code == 422
    body = response.content.decode()
    assert re.findall(r'data-error="(\w+)"', body) == ["content"]
    assert "Null characters are not allowed." in body and "NUL" not in body
    memory.refresh_from_db()
    assert memory.content == "Lint with ruff before pushing"
    assert [a for a, _ in events(memory)] == ["proposed"]


def test_every_refused_field_is_named_at_once(staff: Client, agent: Agent) -> None:
    memory = propose(agent, "Lint with ruff before pushing")
    response = post(
        staff,
        f"/memory/{memory.pk}/edit/",
        edit_fields(memory, content="y" * 200, type="", importance="-1", ttl_days="never"),
    )
    assert response.status_code == 422
    errors = re.findall(r'data-error="(\w+)"', response.content.decode())
    assert errors == ["content", "type", "importance", "ttl_days"]


def test_cancel_brings_the_row_back(staff: Client, agent: Agent) -> None:
    memory = propose(agent, "Docs live in /docs")
    body = staff.get(f"/memory/{memory.pk}/row/", headers=HTMX).content.decode()
    assert body.lstrip().startswith(f'<article class="candidate card" id="candidate-{memory.pk}"')
    assert ">Approve</button>" in body


def test_select_all_approves_or_rejects_the_checked_ones(staff: Client, agent: Agent) -> None:
    other = make_agent("other")
    a, b, c, d = (propose(agent, f"Fact {words(name)}") for name in "abcd")
    foreign = propose(other, "Someone else's fact")
    response = post(
        staff,
        "/memory/review/bulk/?project=acme",
        {"action": "approve", "ids": [a.pk, b.pk, foreign.pk]},
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="queue"')
    assert queued(body) == [d.pk, c.pk]
    assert "Approved 2 candidates. 1 skipped: already decided or not in this project." in body
    assert {m.status for m in Memory.objects.filter(pk__in=[a.pk, b.pk])} == {"approved"}
    assert Memory.objects.get(pk=foreign.pk).status == "pending"
    assert events(Memory.objects.get(pk=a.pk))[-1] == ("approved", "root")

    body = post(
        staff, "/memory/review/bulk/", {"action": "reject", "ids": [c.pk, d.pk, a.pk]}
    ).content.decode()
    assert "Rejected 2 candidates. 1 skipped" in body
    assert Memory.objects.get(pk=c.pk).status == "rejected"
    assert events(Memory.objects.get(pk=d.pk))[-1] == ("rejected", "root")
    assert queued(body) == [foreign.pk]

    nothing = post(staff, "/memory/review/bulk/", {"action": "approve"}).content.decode()
    assert "Select candidates first" in nothing
    assert (
        post(staff, "/memory/review/bulk/", {"action": "delete", "ids": [foreign.pk]}).status_code
        == 400
    )


@pytest.mark.parametrize(
    "stray",
    [
        pytest.param(str(2**63), id="past bigint"),  # SQLite cannot bind it
        pytest.param("9" * 5000, id="5000 digits"),  # int() will not read it
        pytest.param("²", id="a digit int() refuses"),
    ],
)
def test_select_all_leaves_out_what_no_row_can_have_as_its_id(
    staff: Client, agent: Agent, stray: str
) -> None:
    a, b = (propose(agent, f"Fact {words(name)}") for name in "ab")
    response = post(staff, "/memory/review/bulk/", {"action": "approve", "ids": [stray, a.pk]})
    assert response.status_code == 200
    body = response.content.decode()
    assert "Approved 1 candidate." in body and "skipped" not in body
    assert queued(body) == [b.pk]
    assert Memory.objects.get(pk=a.pk).status == "approved"


# --- permissions ----------------------------------------------------------------------------


def test_a_reviewer_may_decide(agent: Agent) -> None:
    user, client = person(agent, reviewer=True)
    a, b, c = (propose(agent, f"Fact {words(n)}") for n in "abc")
    page = client.get("/memory/review/").content.decode()
    assert ">Approve</button>" in page and "Approve selected" in page
    assert post(client, f"/memory/{a.pk}/approve/").status_code == 200
    assert (
        post(client, f"/memory/{b.pk}/edit/", edit_fields(b, content="Fact B, edited")).status_code
        == 200
    )
    assert (
        post(client, "/memory/review/bulk/", {"action": "reject", "ids": [c.pk]}).status_code == 200
    )
    assert [
        e.actor for e in MemoryEvent.objects.filter(action__in=["approved", "edited", "rejected"])
    ] == [user, user, user, user]
    assert Memory.objects.get(pk=b.pk).decided_by == user


def test_a_plain_member_may_look_but_not_act(agent: Agent) -> None:
    _, client = person(agent)
    memory = propose(agent, "Something to look at")
    kept = approved(agent, "Something approved")
    page = client.get("/memory/review/").content.decode()
    assert queued(page) == [memory.pk]
    assert ">Approve</button>" not in page and "Select all" not in page
    assert "need staff or the Reviewers group" in page
    browser = client.get("/memory/").content.decode()
    assert kept.pk in listed(browser) and ">Expire</button>" not in browser
    writes: list[tuple[str, dict[str, Any]]] = [
        (f"/memory/{memory.pk}/approve/", {}),
        (f"/memory/{memory.pk}/reject/", {}),
        (f"/memory/{memory.pk}/edit/", edit_fields(memory, content="changed")),
        (f"/memory/{kept.pk}/expire/", {}),
        ("/memory/review/bulk/", {"action": "approve", "ids": [memory.pk]}),
    ]
    for url, data in writes:
        assert post(client, url, data).status_code == 403, url
    assert client.get(f"/memory/{memory.pk}/edit/", headers=HTMX).status_code == 403
    memory.refresh_from_db()
    kept.refresh_from_db()
    assert (memory.status, memory.content, kept.status) == (
        "pending",
        "Something to look at",
        "approved",
    )


def test_nobody_sees_or_touches_another_projects_memories(agent: Agent) -> None:
    other = make_agent("other")
    mine = propose(agent, "Our own candidate")
    theirs = propose(other, "Their candidate")
    their_kept = approved(other, "Their approved memory")
    _, client = person(agent, reviewer=True)
    assert queued(client.get("/memory/review/").content.decode()) == [mine.pk]
    assert their_kept.pk not in listed(client.get("/memory/").content.decode())
    assert "Their" not in client.get("/memory/?q=their").content.decode().split('id="browser"')[1]
    assert client.get("/memory/review/?project=other").status_code == 404
    assert client.get(f"/memory/{theirs.pk}/").status_code == 404
    assert post(client, f"/memory/{theirs.pk}/approve/").status_code == 404
    assert post(client, f"/memory/{their_kept.pk}/expire/").status_code == 404
    assert (
        post(client, "/memory/review/bulk/", {"action": "approve", "ids": [theirs.pk]}).status_code
        == 200
    )
    assert Memory.objects.get(pk=theirs.pk).status == "pending"
    metrics = client.get("/memory/metrics/").content.decode()
    assert 'data-metric="pending" data-numerator="1"' in metrics


def test_the_nav_links_to_the_queue_with_the_pending_count(staff: Client, agent: Agent) -> None:
    propose(agent, "One")
    propose(agent, "Two is another fact")
    other = make_agent("other")
    propose(other, "Three in another project")
    html = staff.get("/?project=acme").content.decode()
    assert re.search(
        r'<a href="/memory/review/\?project=acme" data-nav="memory" >Memory '
        r'<span id="nav-pending" class="count" data-pending title="pending candidates">2'
        r"</span></a>",
        html,
    )
    assert 'data-pending title="pending candidates">3<' in staff.get("/").content.decode()
    review = staff.get("/memory/review/").content.decode()
    assert 'data-nav="memory" aria-current="page"' in review


# --- the browser ----------------------------------------------------------------------------


def test_the_browser_groups_approved_memories_by_scope_and_type(
    staff: Client, agent: Agent
) -> None:
    a = approved(agent, "The API is versioned under /api/v1", importance="0.9")
    b = approved(agent, "Prices are kept as Decimal", importance="0.6")
    c = approved(agent, "See the runbook at docs/runbook.md", type="reference")
    d = approved(agent, "Ann likes terse replies", type="user", scope="user:ann")
    propose(agent, "Still pending, not shown")
    gone = approved(agent, "An expired memory about fax machines")
    decisions.memory_expire(gone, by=None)
    html = staff.get("/memory/?project=acme").content.decode()
    sections = re.findall(r'<section class="card scope-section" data-scope="([^"]+)"', html)
    assert sections == ["project", "user:ann"]
    project = html[html.index('data-scope="project"') : html.index('data-scope="user:ann"')]
    groups = re.findall(r'data-group="(\w+)"', project)
    assert groups == ["project", "reference"]
    assert listed(project) == [a.pk, b.pk, c.pk]  # most important first in each type
    assert listed(html[html.index('data-scope="user:ann"') :]) == [d.pk]
    assert gone.pk not in listed(html)
    assert ">Edit</button>" in item(html, a.pk) and ">Expire</button>" in item(html, a.pk)


def test_the_browser_leaves_out_a_memory_past_its_ttl_before_the_sweep(
    staff: Client, agent: Agent
) -> None:
    """A memory whose TTL ran out is out of MEMORY.md and search at once (the sweep marks it
    expired up to 15 minutes later): the browser's groups, counts and searches agree."""
    kept = approved(agent, "Fax machines are kept in room 4")
    due = approved(agent, "Fax machines are serviced on Mondays", ttl_days=1)
    Memory.objects.filter(pk=due.pk).update(expires_at=timezone.now())  # the boundary
    html = staff.get("/memory/?project=acme").content.decode()
    assert listed(html) == [kept.pk]
    assert memory_md(agent.project).text == f"[project] {kept.content}\n"
    assert listed(staff.get("/memory/?q=fax+machines").content.decode()) == [kept.pk]
    assert listed(staff.get("/memory/?project=acme&q=fax+machines").content.decode()) == [kept.pk]
    only = staff.get("/memory/?project=acme&type=project&scope=project").content.decode()
    assert listed(only) == [kept.pk]
    # nor is it "similar approved" beside a candidate
    pending = stored(agent, "Fax machines are kept and serviced on Mondays", status="pending")
    aside = staff.get(f"/memory/{pending.pk}/similar/", headers=HTMX).content.decode()
    assert [int(pk) for pk in re.findall(r'data-similar-to="(\d+)"', aside)] == [kept.pk]


def test_an_approved_eviction_is_not_listed_or_counted_as_a_memory(
    staff: Client, agent: Agent
) -> None:
    """An eviction proposal, once approved, is a decision kept for its history, not a
    sentence an agent reads: the browser, its counts, the similar aside and the metrics
    leave it out as MEMORY.md does."""
    kept = approved(agent, "Fax machines are kept in room 4")
    cut = approved(agent, "Fax machines are serviced on Mondays")
    evict = proposals.proposal_create(
        project=agent.project,
        kind=Memory.Proposal.EVICT,
        fields=MemoryFields.of(
            content="Fax machines: 1 entry MEMORY.md cannot hold", type="project"
        ),
        target_ids=[cut.pk],
        note="MEMORY.md is over its cap",
        proposed_by="lifecycle",
    )
    decisions.memory_approve(evict, by=None)
    assert memory_md(agent.project).text == f"[project] {kept.content}\n"
    html = staff.get("/memory/?project=acme").content.decode()
    assert listed(html) == [kept.pk]
    assert 'data-approved="1"' in html
    group = staff.get("/memory/?project=acme&scope=project&type=project").content.decode()
    assert listed(group) == [kept.pk]
    assert listed(staff.get("/memory/?q=fax+machines").content.decode()) == [kept.pk]
    pending = stored(
        agent, "Fax machines are kept in the entry that MEMORY.md cannot hold", status="pending"
    )
    aside = staff.get(f"/memory/{pending.pk}/similar/", headers=HTMX).content.decode()
    assert [int(pk) for pk in re.findall(r'data-similar-to="(\d+)"', aside)] == [kept.pk]
    metrics = staff.get("/memory/metrics/?project=acme").content.decode()
    # 1 expired (the evicted one) / (1 approved now + 1 expired)
    assert metric(metrics, "cleanup") == ("1", "2", "50.0%")


def test_a_group_shows_ten_then_more(staff: Client, agent: Agent) -> None:
    now = timezone.now()
    Memory.objects.bulk_create(
        Memory(
            project=agent.project,
            type="project",
            content=f"fact {i}",
            status="approved",
            importance=Decimal(i) / 100,
            decided_at=now,
        )
        for i in range(12)
    )
    html = staff.get("/memory/?project=acme").content.decode()
    assert len(listed(html)) == 10
    more = 'href="/memory/?project=acme&amp;scope=project&amp;type=project" data-more>'
    assert f"{more}2 more project memories" in html
    everything = staff.get("/memory/?project=acme&scope=project&type=project").content.decode()
    assert len(listed(everything)) == 12
    assert "data-more" not in everything


def test_search_ranks_within_a_project_and_matches_words_across_projects(
    staff: Client, agent: Agent
) -> None:
    deploy = approved(agent, "Deploys to staging happen on Fridays", importance="0.9")
    approved(agent, "The database is PostgreSQL")
    ann = approved(agent, "Ann wants deploy notes in French", type="user", scope="user:ann")
    other = make_agent("other")
    theirs = approved(other, "Deploys in the other project are manual")

    ranked = staff.get("/memory/?project=acme&q=deploys+staging").content.decode()
    assert 'data-results="ranked"' in ranked
    assert listed(ranked) == [deploy.pk]
    assert "data-score" in item(ranked, deploy.pk)
    in_scope = staff.get("/memory/?project=acme&scope=user:ann&q=deploy+notes").content.decode()
    assert listed(in_scope) == [ann.pk]

    words = staff.get("/memory/?q=deploys").content.decode()
    assert 'data-results="words"' in words
    assert sorted(listed(words)) == sorted([deploy.pk, theirs.pk])
    fragment = staff.get("/memory/?project=acme&q=postgresql", headers=HTMX).content.decode()
    assert fragment.lstrip().startswith('<div id="browser"') and "<html" not in fragment
    assert len(listed(fragment)) == 1


def test_expire_and_edit_in_the_browser(staff: Client, agent: Agent) -> None:
    memory = approved(agent, "Use Python 3.11")
    other = approved(agent, "Format with ruff format")
    body = post(staff, f"/memory/{memory.pk}/expire/?project=acme").content.decode()
    assert body.lstrip().startswith(f'<li class="memory-item gone" id="memory-{memory.pk}"')
    assert 'data-status="expired"' in body
    assert "expired ✓" in body and ">Expire</button>" not in body
    memory.refresh_from_db()
    assert memory.status == "expired"
    assert events(memory)[-1] == ("expired", "root")
    assert memory.pk not in listed(staff.get("/memory/").content.decode())

    form = staff.get(f"/memory/{other.pk}/edit/", headers=HTMX).content.decode()
    assert form.lstrip().startswith(f'<li class="memory-item" id="memory-{other.pk}"')
    assert ">Save</button>" in form and "Save and approve" not in form
    saved = post(
        staff,
        f"/memory/{other.pk}/edit/",
        edit_fields(other, content="Format with ruff", importance="0.8"),
    )
    assert saved.status_code == 200
    assert "saved ✓" in saved.content.decode() and "Format with ruff<" in saved.content.decode()
    other.refresh_from_db()
    assert (other.content, other.importance, other.status) == (
        "Format with ruff",
        Decimal("0.8"),
        "approved",
    )
    assert [a for a, _ in events(other)] == ["proposed", "approved", "edited"]
    refused = post(staff, f"/memory/{other.pk}/edit/", edit_fields(other, importance="2"))
    assert refused.status_code == 422
    assert (
        refused.content.decode()
        .lstrip()
        .startswith(f'<li class="memory-item" id="memory-{other.pk}"')
    )
    assert 'data-error="importance"' in refused.content.decode()


def test_an_edit_into_another_live_memorys_sentence_is_refused_naming_it(
    staff: Client, agent: Agent
) -> None:
    """Saved, the two made the same line twice in MEMORY.md.
    (docs/memory.md, "Review and permissions")"""
    ruff = approved(agent, "Format with ruff")
    python = approved(agent, "Use Python 3.11")
    before = memory_md(agent.project).text
    refused = post(
        staff, f"/memory/{python.pk}/edit/", edit_fields(python, content="format with Ruff!")
    )
    assert refused.status_code == 422
    body = refused.content.decode()
    assert body.lstrip().startswith(f'<li class="memory-item" id="memory-{python.pk}"')
    message = (
        f"Content: memory #{ruff.pk} of scope project already says this (“Format with ruff”): "
        "reject or expire one of them, or merge them, rather than make them the same."
    )
    assert f'<p class="error" role="alert" data-error="content">{message}</p>' in body
    python.refresh_from_db()
    assert python.content == "Use Python 3.11"
    assert [a for a, _ in events(python)] == ["proposed", "approved"]
    assert memory_md(agent.project).text == before
    assert sorted(before.splitlines()) == [
        "[project] Format with ruff",
        "[project] Use Python 3.11",
    ]


def test_moving_a_memory_to_a_scope_that_says_the_same_is_refused(
    staff: Client, agent: Agent
) -> None:
    anns = approved(agent, "Use tabs", scope="user:ann")
    pending = propose(agent, "Deploy on Mondays", scope="user:ann")
    ours = approved(agent, "Use tabs")
    refused = post(staff, f"/memory/{ours.pk}/edit/", edit_fields(ours, scope="user:ann"))
    assert refused.status_code == 422
    message = (
        f"Scope: memory #{anns.pk} of scope user:ann already says this (“Use tabs”): "
        "reject or expire one of them, or merge them, rather than make them the same."
    )
    assert f'data-error="scope">{message}</p>' in refused.content.decode()
    # a candidate pending in that scope counts too: approving both made the line twice
    candidate = propose(agent, "Lint before pushing")
    refused = post(
        staff,
        f"/memory/{candidate.pk}/edit/",
        edit_fields(candidate, content="Deploy on mondays", scope="user:ann"),
    )
    assert refused.status_code == 422
    assert f"memory #{pending.pk} of scope user:ann already says this" in refused.content.decode()
    ours.refresh_from_db()
    candidate.refresh_from_db()
    assert (ours.scope, ours.status) == ("project", "approved")
    assert (candidate.content, candidate.scope, candidate.status) == (
        "Lint before pushing",
        "project",
        "pending",
    )


def test_an_edit_beside_a_rejected_or_expired_sentence_or_of_other_fields_is_saved(
    staff: Client, agent: Agent
) -> None:
    stored(agent, "Use tabs", status="expired")
    stored(agent, "Use spaces", status="rejected")
    memory = approved(agent, "Indent somehow")
    for content in ("Use spaces", "Use tabs"):
        saved = post(staff, f"/memory/{memory.pk}/edit/", edit_fields(memory, content=content))
        assert saved.status_code == 200
    memory.refresh_from_db()
    assert memory.content == "Use tabs"
    # two that were the same before this check: other fields still edited
    twin = stored(agent, "Use tabs")
    assert (
        post(staff, f"/memory/{twin.pk}/edit/", edit_fields(twin, importance="0.9")).status_code
        == 200
    )
    twin.refresh_from_db()
    assert twin.importance == Decimal("0.9")


def test_the_history_shows_who_did_what_with_before_and_after(staff: Client, agent: Agent) -> None:
    memory = propose(agent, "Deploys on fridays", proposed_by="detector", importance="0.4")
    propose(agent, "deploys on Fridays!")  # the same, once more
    memory.refresh_from_db()  # importance 0.55: the default 0.5, raised for the repetition
    post(
        staff,
        f"/memory/{memory.pk}/edit/",
        {**edit_fields(memory, content="Deploys happen on Fridays"), "save_only": "1"},
    )
    post(staff, f"/memory/{memory.pk}/approve/")
    memory.refresh_from_db()
    post(staff, f"/memory/{memory.pk}/edit/", edit_fields(memory, importance="0.8", tags="deploy"))
    post(staff, f"/memory/{memory.pk}/expire/")
    merged = approved(agent, "Tests run in CI", scope="user:x")
    merge = Memory.objects.create(
        project=agent.project,
        type="project",
        content="CI runs the tests",
        scope="user:x",
        proposal="merge",
    )
    merge.targets.add(merged)
    decisions.memory_approve(merge, by=root())

    html = staff.get(f"/memory/{memory.pk}/?project=acme").content.decode()
    rows = re.findall(r'<tr data-event="(\w+)">', html)
    assert rows == ["proposed", "reproposed", "edited", "approved", "edited", "expired"]
    assert "first by detector" in html
    assert re.search(r"approved by root, ", html)
    first_edit = html[html.index('<tr data-event="edited">') :]
    content = '<tr data-field="content"><th>content</th><td class="before">'
    assert f"{content}<del data-before>Deploys on fridays</del></td>" in first_edit
    assert "<ins data-after>Deploys happen on Fridays</ins>" in first_edit
    second = first_edit[first_edit.index('<tr data-event="edited">', 10) :]
    assert "<del data-before>0.550</del>" in second and "<ins data-after>0.800</ins>" in second
    assert "<del data-before>—</del>" in second and "<ins data-after>deploy</ins>" in second
    assert re.findall(r"<td data-actor>(\w+)</td>", html) == [
        "detector",
        "system",
        "root",
        "root",
        "root",
        "root",
    ]

    target = staff.get(f"/memory/{merged.pk}/").content.decode()
    assert re.findall(r'<tr data-event="(\w+)">', target) == ["proposed", "approved", "merged"]
    assert f'into <a href="/memory/{merge.pk}/">memory {merge.pk}</a>' in target
    assert "data-merged-from" in staff.get(f"/memory/{merge.pk}/").content.decode()


# --- MEMORY.md ------------------------------------------------------------------------------


def test_the_memory_md_preview_shows_its_meters_and_what_the_caps_cut(
    staff: Client, agent: Agent, monkeypatch: Any
) -> None:
    kept = [approved(agent, f"Fact {words(i)}", importance=f"0.{9 - i}") for i in range(3)]
    approved(agent, "Ann likes terse replies", type="user", scope="user:ann")
    html = staff.get("/memory/?project=acme").content.decode()
    md = memory_md(agent.project, "project")
    assert (md.lines, md.cut_count) == (3, 0)
    section = html[html.index('data-scope="project"') : html.index('data-scope="user:ann"')]
    assert 'data-md-lines="3"' in section and f'data-md-bytes="{md.bytes}"' in section
    assert '<strong>3</strong> <span class="muted">of 200</span>' in section
    assert f'<strong>{md.bytes}</strong> <span class="muted">of 25,000</span>' in section
    assert 'class="meter fill-1"' in section  # 3 of 200 lines
    lines = "".join(f"[project] {m.content}\n" for m in kept)
    assert f'<pre class="memory-md" data-md>{lines}</pre>' in section
    assert "Every live memory of this scope fits (3)" in section
    user = html[html.index('data-scope="user:ann"') :]
    assert '<pre class="memory-md" data-md>[user] Ann likes terse replies\n</pre>' in user

    monkeypatch.setattr(memory_file, "MEMORY_MD_LINES", 2)
    capped = staff.get("/memory/?project=acme").content.decode()
    assert 'data-md-lines="2"' in capped
    assert 'class="meter fill-100 full"' in capped
    assert 'data-md-cut="1"' in capped
    assert "The caps leave out 1 of 3 live memories" in capped
    cut = capped[capped.index("data-md-cut") : capped.index("</ul>", capped.index("data-md-cut"))]
    assert f'href="/memory/{kept[2].pk}/?project=acme">[project] {kept[2].content}</a>' in cut
    preview = capped[capped.index("data-md>") : capped.index("</pre>")]
    assert kept[1].content in preview and kept[2].content not in preview


def test_the_bytes_meter_counts_toward_its_cap(
    staff: Client, agent: Agent, monkeypatch: Any
) -> None:
    for letter, importance in (("a", "0.9"), ("b", "0.5"), ("c", "0.3")):
        stored(agent, letter * 100, importance=Decimal(importance))
    monkeypatch.setattr(memory_file, "MEMORY_MD_BYTES", 220)
    html = staff.get("/memory/?project=acme").content.decode()
    # "[project] " + 100 characters + a newline: 111 bytes; a second line would make 222
    assert 'data-md-bytes="111"' in html and 'data-md-lines="1"' in html
    assert '<strong>111</strong> <span class="muted">of 220</span>' in html
    assert 'class="meter fill-50"' in html
    assert "The caps leave out 2 of 3 live memories" in html


# --- metrics --------------------------------------------------------------------------------


def metric(html: str, name: str) -> tuple[str, str, str]:
    found = re.search(
        rf'data-metric="{name}" data-numerator="([^"]*)"(?: data-denominator="([^"]*)")?>'
        r'.*?<div class="big"[^>]*>([^<]*)</div>',
        html,
        re.S,
    )
    assert found is not None, name
    return found.group(1), found.group(2) or "", found.group(3).strip()


def test_the_metrics_are_exact_on_known_data(staff: Client, agent: Agent) -> None:
    now = timezone.now()
    empty = staff.get("/memory/metrics/").content.decode()
    for name in ("approval", "hit", "false_retrieval", "cleanup", "results_per_search"):
        assert metric(empty, name)[2] == "—", name
    assert "— nothing waiting" in empty

    oldest = propose(agent, f"Pending {words(1)}", now=now - timedelta(days=3, hours=1))
    propose(agent, f"Pending {words(2)}", now=now - timedelta(days=1))
    kept = [approved(agent, f"Approved {words(i)}") for i in range(4)]  # 4 approvals
    for i in range(2):
        decisions.memory_reject(propose(agent, f"Rejected {words(-i)}"), by=None)  # 2 rejections
    stale = propose(agent, "Approved long ago", now=now - timedelta(days=60))
    decisions.memory_approve(stale, by=None, now=now - timedelta(days=59))  # outside the window
    decisions.memory_expire(kept[0], by=None)  # 1 expired in the window
    for useful in (True, True, True, False):
        MemoryFeedback.objects.create(project=agent.project, memory=kept[1], useful=useful)
    MemoryFeedback.objects.create(
        project=agent.project, memory=kept[1], useful=False, created_at=now - timedelta(days=40)
    )
    for results in (3, 0, 5):
        RetrievalLog.objects.create(project=agent.project, query="q", k=5, results=results)
    other = make_agent("other")
    decisions.memory_reject(propose(other, "Another project's"), by=None)

    html = staff.get("/memory/metrics/?project=acme").content.decode()
    assert metric(html, "pending")[0] == "2"
    assert "oldest waiting 3\xa0days" in html
    assert metric(html, "approval") == ("4", "6", "66.7%")
    assert "4 approved / 6 decided" in html
    assert metric(html, "hit") == ("3", "4", "75.0%")
    assert metric(html, "false_retrieval") == ("1", "4", "25.0%")
    # 1 expired / (4 approved now: 3 kept + the stale one, + the 1 expired)
    assert metric(html, "cleanup") == ("1", "5", "20.0%")
    assert metric(html, "results_per_search") == ("8", "3", "2.67")
    assert oldest.pk  # the oldest's age is what "oldest waiting" shows

    every = staff.get("/memory/metrics/").content.decode()
    assert metric(every, "approval") == ("4", "7", "57.1%")


# --- bounded --------------------------------------------------------------------------------


def fill(agent: Agent, n: int, prefix: str) -> None:
    """n pending candidates with sessions, turns and evidence, in a few scopes and types; n
    approved memories; a merge proposal with targets; feedback and searches."""
    for i in range(n):
        scope = "project" if i % 6 == 0 else f"user:{prefix}{i % 6}"
        turn = turn_of(agent, f"{prefix}-s{i}", 1, f"Please remember {words(f'{prefix}{i}')}")
        propose(
            agent,
            f"Pending {words(f'{prefix}{i}')}",
            session=turn.session,
            turn=turn,
            type=Memory.Type.values[i % 4],
            scope=scope,
        )
        kept = approved(agent, f"Kept {words(f'{prefix}-{i}')}", scope=scope)
        MemoryFeedback.objects.create(project=agent.project, memory=kept, useful=i % 2 == 0)
        RetrievalLog.objects.create(project=agent.project, query="thing", k=5, results=i % 5)
    merge = stored(agent, f"Merged {words(prefix)}", status="pending", proposal="merge")
    merge.targets.add(*Memory.objects.filter(status="approved")[:3])


@pytest.mark.slow
def test_the_pages_run_a_bounded_number_of_queries(
    staff: Client, agent: Agent, django_assert_max_num_queries: Any
) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    fill(agent, 6, "a")
    _, viewer = person(agent, reviewer=True)
    memory = Memory.objects.filter(status="approved").first()
    assert memory is not None
    pages = [
        (staff, "/memory/review/", {}),
        (staff, "/memory/review/?project=acme&type=user", HTMX),
        (viewer, "/memory/review/", {}),
        (staff, "/memory/", {}),
        (viewer, "/memory/?project=acme", {}),
        (staff, "/memory/?project=acme&q=thing", {}),
        (staff, "/memory/?q=thing", {}),
        (staff, "/memory/?project=acme&scope=project&type=project", {}),
        (staff, "/memory/metrics/", {}),
        (viewer, "/memory/metrics/?project=acme", {}),
        (staff, f"/memory/{memory.pk}/", {}),
        (staff, f"/memory/{memory.pk}/similar/", HTMX),
    ]
    counts = {}
    for client, path, headers in pages:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(path, headers=headers).status_code == 200, path
        counts[(id(client), path)] = len(queries)
    fill(agent, 60, "b")
    assert Memory.objects.filter(status="pending").count() >= 66
    for client, path, headers in pages:
        with django_assert_max_num_queries(counts[(id(client), path)], info=path):
            assert client.get(path, headers=headers).status_code == 200, path
    assert max(counts.values()) <= 24, counts


def test_select_all_on_a_page_runs_a_bounded_number_of_queries_per_candidate(
    staff: Client, agent: Agent, django_assert_max_num_queries: Any
) -> None:
    ids = [propose(agent, f"Bulk {words(i)}").pk for i in range(10)]
    with django_assert_max_num_queries(14 + 6 * len(ids)):
        response = post(staff, "/memory/review/bulk/", {"action": "approve", "ids": ids})
    assert "Approved 10 candidates." in response.content.decode()
    assert Session.objects.count() == 0  # none were needed


KEY = "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdEFGH"


@pytest.mark.parametrize("save", ["approve", "save_only"])
def test_an_edit_with_a_secret_is_stored_redacted_and_the_reviewer_is_told(
    staff: Client, agent: Agent, save: str
) -> None:
    """A reviewer pasting a key or a customer's card into an edit: stored redacted, as a
    proposal is, and said so on the row (docs/memory.md, "Redaction")."""
    memory = propose(agent, "Deploys use the staging key")
    data = edit_fields(
        memory, content=f"Deploys use the key {KEY}", tags="deploy, card 4111 1111 1111 1111"
    )
    if save == "save_only":
        data["save_only"] = "1"
    response = post(staff, f"/memory/{memory.pk}/edit/", data)
    assert response.status_code == 200
    body = response.content.decode()
    assert KEY not in body and "4111" not in body
    assert (
        '<p class="notice" role="status" data-redacted-now>Redacted before saving: api_key, '
        "card_number. A secret does not belong in a memory: every agent reads it.</p>"
    ) in body
    memory.refresh_from_db()
    assert (memory.content, memory.tags) == (
        "Deploys use the key [redacted:api_key]",
        ["deploy", "card [redacted:card_number]"],
    )
    assert memory.redactions == ["api_key", "card_number"]
    assert memory.status == ("approved" if save == "approve" else "pending")
    stored = str(list(memory.events.values_list("before", "after", "note")))
    assert KEY not in stored and "4111" not in stored
    if save == "approve":
        assert memory_md(agent.project).text == "[project] Deploys use the key [redacted:api_key]\n"


def test_an_edit_in_the_browser_is_redacted_and_said_without_htmx_too(
    staff: Client, agent: Agent
) -> None:
    memory = approved(agent, "Support answers within a day")
    data = edit_fields(memory, content="Support answers at ann@example.com")
    response = post(staff, f"/memory/{memory.pk}/edit/", data)
    body = response.content.decode()
    assert response.status_code == 200 and "ann@example.com" not in body
    assert "Redacted before saving: email." in body
    assert "Support answers at [redacted:email]" in body
    # a plain form: the next page says it
    data = edit_fields(memory, content="Support answers at +44 20 7946 0958")
    response = staff.post(f"/memory/{memory.pk}/edit/", data, follow=True)
    body = response.content.decode()
    assert "Redacted before saving: phone." in body and "7946" not in body
    memory.refresh_from_db()
    assert memory.content == "Support answers at [redacted:phone]"
    assert memory.redactions == ["email", "phone"]


def test_an_approved_memory_proposed_again_differently_shows_in_the_queue(
    staff: Client, agent: Agent
) -> None:
    memory = approved(agent, "Deploys go through the release train", tags=["ci"])
    propose(agent, "Deploys go through the release train", type="feedback", tags=["rel"])
    memory.refresh_from_db()
    assert (memory.type, memory.tags) == ("project", ["ci"])
    update = Memory.objects.get(proposal="update")
    row = candidate(staff.get("/memory/review/").content.decode(), update.pk)
    assert 'data-proposal="update"' in row
    assert '<span class="chip" data-tag>ci</span><span class="chip" data-tag>rel</span>' in row
    assert (
        "proposed again as feedback with tags ci, rel; takes that type and those tags, when "
        "approved:"
    ) in row
    assert f'data-target="{memory.pk}"' in row and "approved · tags: ci</span>" in row
    response = post(staff, f"/memory/{update.pk}/approve/")
    assert 'data-decided="approved"' in response.content.decode()
    memory.refresh_from_db()
    assert (memory.type, memory.tags) == ("feedback", ["ci", "rel"])
    assert memory_md(agent.project).text == "[feedback] Deploys go through the release train\n"


def test_two_reviewers_on_one_candidate_the_second_is_told_who_decided_first(
    agent: Agent,
) -> None:
    memory = propose(agent, "Releases are tagged vX.Y.Z")
    first, first_client = person(agent, reviewer=True)
    _, second_client = person(agent, reviewer=True)
    assert (
        'data-decided="approved"'
        in post(first_client, f"/memory/{memory.pk}/approve/").content.decode()
    )
    lost = post(second_client, f"/memory/{memory.pk}/reject/").content.decode()
    assert (
        f'<p class="notice" role="alert" data-lost>Your reject was not applied: '
        f"{first.username} approved it first.</p>"
    ) in lost
    memory.refresh_from_db()
    assert (memory.status, memory.decided_by) == ("approved", first)
    assert [a for a, _ in events(memory)] == ["proposed", "approved"]
