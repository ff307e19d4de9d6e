"""Memories in the Django admin: listed and viewed, never added, changed or deleted by a form
(that would bypass the history); approved or rejected by the queue's services as actions."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from memory_ui.cleaners import MemoryFields
from memory_ui.models import Memory
from memory_ui.writes import decisions, proposals
from tests.conftest import Agent

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/memory_ui/memory/"


def propose(agent: Agent, content: str) -> Memory:
    memory = proposals.candidate_propose(
        project=agent.project, fields=MemoryFields.of(type="project", content=content)
    )
    assert memory is not None
    return memory


def test_memories_are_listed_and_viewed_but_not_edited_by_a_form(
    staff: Client, agent: Agent
) -> None:
    memory = propose(agent, "Deploys happen on Tuesdays")
    listing = staff.get(CHANGELIST)
    assert listing.status_code == 200
    body = listing.content.decode()
    assert "Deploys happen on Tuesdays" in body
    assert "Approve selected pending memories" in body
    assert "delete_selected" not in body
    assert staff.get(f"{CHANGELIST}add/").status_code == 403
    assert staff.get(f"{CHANGELIST}{memory.pk}/delete/").status_code == 403
    view = staff.get(f"{CHANGELIST}{memory.pk}/change/")
    assert view.status_code == 200 and 'name="_save"' not in view.content.decode()
    refused = staff.post(
        f"{CHANGELIST}{memory.pk}/change/", {"content": "Changed around the history"}
    )
    assert refused.status_code == 403
    memory.refresh_from_db()
    assert memory.content == "Deploys happen on Tuesdays"


def test_the_actions_decide_through_the_services(staff: Client, agent: Agent) -> None:
    a, b, c = (propose(agent, text) for text in ("Invoices go out monthly", "Logs are in UTC",
                                                 "Keep pull requests small"))  # fmt: skip
    decisions.memory_reject(c, by=None)
    response = staff.post(
        CHANGELIST,
        {"action": "approve_selected", "_selected_action": [a.pk, b.pk, c.pk]},
        follow=True,
    )
    body = response.content.decode()
    assert "2 approved." in body and "1 skipped: not pending" in body
    statuses = dict(Memory.objects.values_list("pk", "status"))
    assert statuses == {a.pk: "approved", b.pk: "approved", c.pk: "rejected"}
    event = a.events.get(action="approved")
    assert (event.actor_name, event.after) == ("root", {"status": "approved"})


def test_staff_with_only_the_view_right_decide_as_on_the_queue(agent: Agent) -> None:
    """As on /memory/review/, being staff is the right to decide."""
    user: Any = get_user_model().objects.create_user("clerk", password="pw-clerk-123")
    user.is_staff = True
    user.save()
    user.user_permissions.add(Permission.objects.get(codename="view_memory"))
    client = Client()
    client.force_login(user)
    memory = propose(agent, "Invoices go out monthly")
    assert "Reject selected pending memories" in client.get(CHANGELIST).content.decode()
    client.post(CHANGELIST, {"action": "reject_selected", "_selected_action": [memory.pk]})
    memory.refresh_from_db()
    assert memory.status == "rejected" and memory.decided_by == user
