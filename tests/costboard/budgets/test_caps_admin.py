"""Caps edited in the admin: a session's own, a project's, the project's `system` session's.
Each change recomputes the affected sessions' states and records a cap_changed event."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.messages.storage.fallback import FallbackStorage
from django.forms.models import model_to_dict
from django.test import RequestFactory

from costboard.models import BudgetEvent, Project, Session
from costboard.outbox import outbox_dispatch
from tests.conftest import Agent


def admin_save(model_obj: Any, **changes: Any) -> None:
    """Save `changes` through the model's ModelAdmin as the change form does."""
    model_admin = admin.site._registry[type(model_obj)]
    request = RequestFactory().post("/admin/")
    request.user = get_user_model().objects.create_superuser("root", password="x")
    request.session = {}  # type: ignore[assignment]
    request._messages = FallbackStorage(request)  # type: ignore[attr-defined]
    form_class = model_admin.get_form(request, model_obj, change=True)
    data = {k: v for k, v in model_to_dict(model_obj).items() if v is not None}
    form = form_class(data={**data, **changes}, instance=model_obj)
    assert form.is_valid(), form.errors
    obj = form.save(commit=False)
    model_admin.save_model(request, obj, form, change=True)


def kinds(session: Session) -> list[str]:
    return list(BudgetEvent.objects.filter(session=session).values_list("kind", flat=True))


def test_a_session_cap_raised_in_the_admin_recomputes_its_state(agent: Agent, priced: Any) -> None:
    agent.events({"type": "session", "session_id": "s", "token_cap": 1000})
    agent.events(
        {"session_id": "s", "step_type": "x", "model": "test-sonnet", "input_tokens": 1000}
    )
    session = Session.objects.get(external_id="s")
    assert session.state == "exhausted"
    admin_save(session, token_cap=5000)
    session.refresh_from_db()
    assert (session.state, session.exhausted_at, session.warned_at) == ("ok", None, None)
    assert kinds(session) == ["soft_warned", "exhausted", "cap_changed"]
    change = BudgetEvent.objects.get(session=session, kind="cap_changed")
    assert change.detail["token_cap"] == [1000, 5000]
    assert change.detail["state"] == ["exhausted", "ok"]
    assert change.tokens_used == 1000


def test_system_caps_edited_on_the_project_recheck_the_system_session(
    agent: Agent, priced: Any
) -> None:
    agent.events({"step_type": "embed", "model": "test-sonnet", "input_tokens": 90_000})
    system = Session.objects.get(external_id="system")
    assert system.state == "warning"  # 90,000 of the default 100,000
    chat = agent.events(
        {"session_id": "chat", "step_type": "x", "model": "test-sonnet", "input_tokens": 10}
    )
    assert chat["sessions"]["chat"]["token_cap"] == 100_000
    project = Project.objects.get(pk=agent.project.pk)
    admin_save(project, system_token_cap=1_000_000)
    outbox_dispatch()
    system.refresh_from_db()
    assert system.state == "ok"
    change = BudgetEvent.objects.get(session=system, kind="cap_changed")
    assert change.detail["token_cap"] == [100_000, 1_000_000]
    # the project's conversations keep their caps and record nothing
    assert kinds(Session.objects.get(external_id="chat")) == []
    assert agent.budget("chat").json()["token_cap"] == 100_000


def test_a_project_cap_lowered_reads_exhausted_before_its_sessions_are_decided_again(
    agent: Agent, priced: Any
) -> None:
    """Between the admin's save and the outbox's recheck, a session's `<budget>` already
    holds the new cap: it never reads `ok` with its tokens past the cap it shows."""
    agent.events(
        {"session_id": "s", "step_type": "x", "model": "test-sonnet", "input_tokens": 500},
        {"step_type": "x", "model": "test-sonnet", "input_tokens": 350},  # the system session
    )
    admin_save(Project.objects.get(pk=agent.project.pk), token_cap=400)
    budget = agent.budget("s").json()
    assert (budget["tokens_used"], budget["token_cap"]) == (500, 400)
    assert (budget["state"], budget["stopped_by"]) == ("exhausted", "session")
    system = agent.budget("system").json()
    assert (system["tokens_used"], system["token_cap"], system["state"]) == (350, 400, "warning")
    outbox_dispatch()  # the recheck records the crossings, and the reads say the same
    budget = agent.budget("s").json()
    assert (budget["state"], budget["stopped_by"]) == ("exhausted", "session")
    assert budget["exhausted_at"] is not None
