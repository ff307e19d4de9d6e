from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from costboard.models import ApiKey, BudgetEvent, DailyRollup, Session
from tests.conftest import Agent, add_price

pytestmark = pytest.mark.django_db


def test_pages_need_a_login(client: Client) -> None:
    for path in ("/", "/admin/"):
        response = client.get(path)
        assert response.status_code == 302
        assert "login" in response["Location"]


def test_login_page_renders(client: Client) -> None:
    response = client.get("/accounts/login/")
    assert response.status_code == 200
    assert b'name="username"' in response.content


def test_overview_shows_spend_and_latest_sessions(staff: Client, agent: Agent) -> None:
    add_price("test-sonnet")
    now = timezone.now().isoformat()
    agent.events(
        {
            "session_id": "chat-1",
            "step_type": "x",
            "model": "test-sonnet",
            "input_tokens": 1_000_000,
            "timestamp": now,
        },
        {
            "session_id": "chat-2",
            "step_type": "x",
            "model": "test-sonnet",
            "output_tokens": 100_000,
            "timestamp": now,
        },
        {"session_id": "chat-2", "step_type": "x", "model": "mystery-llm", "input_tokens": 5},
    )
    total = sum(r.cost_usd for r in DailyRollup.objects.all())
    assert total == Decimal("4.5")
    response = staff.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    spent_today = re.search(r'data-spend="Today">([^<]+)<', html)
    assert spent_today is not None
    assert spent_today.group(1) == "$4.50"
    assert "chat-1" in html and "chat-2" in html
    assert "mystery-llm" in html  # unpriced models are listed for staff
    assert "/admin/costboard/modelprice/add/?model=mystery-llm" in html


def test_overview_hides_unpriced_models_from_non_staff(agent: Agent) -> None:
    agent.events({"session_id": "s", "step_type": "x", "model": "mystery-llm"})
    user = get_user_model().objects.create_user("viewer", "", "pw-viewer-123")
    client = Client()
    client.force_login(user)
    assert b"mystery-llm" not in client.get("/").content
    client.force_login(get_user_model().objects.create_superuser("boss", "", "pw-boss-1234"))
    assert b"mystery-llm" in client.get("/").content  # positive control: staff see it


def test_unpriced_models_leave_out_calls_without_tokens(agent: Agent, staff: Client) -> None:
    """A tool span (OTLP: no model, no usage) is an unpriced call of nothing: not listed."""
    from costboard.dashboards.selectors.overview import models_unpriced

    agent.events(
        {"session_id": "s", "step_type": "tool", "model": "none", "duration_ms": 250},
        {"session_id": "s", "step_type": "x", "model": "mystery-llm", "input_tokens": 10},
        {"session_id": "s", "step_type": "x", "model": "cache-only", "cache_read_input_tokens": 5},
    )
    listed = models_unpriced(project_ids=[agent.project.pk])
    assert sorted((m.model, m.calls) for m in listed) == [("cache-only", 1), ("mystery-llm", 1)]
    assert "none" not in [m.model for m in listed]


def test_admin_lists_and_searches_prices(staff: Client) -> None:
    add_price("test-sonnet")
    response = staff.get("/admin/costboard/modelprice/?q=sonnet")
    assert response.status_code == 200
    assert b"test-sonnet" in response.content


def test_admin_shows_a_new_key_once_and_can_revoke_it(staff: Client, agent: Agent) -> None:
    response = staff.post(
        "/admin/costboard/apikey/add/",
        {"project": agent.project.pk, "name": "ci", "role": "ingest"},
        follow=True,
    )
    assert response.status_code == 200
    shown = re.search(r"(cb_[A-Za-z0-9_-]{20,})", response.content.decode())
    assert shown is not None
    key = ApiKey.objects.get(name="ci")
    assert key.key_hash == ApiKey.hash_of(shown.group(1))
    page = staff.get(f"/admin/costboard/apikey/{key.pk}/change/").content.decode()
    assert shown.group(1) not in page
    staff.post(
        "/admin/costboard/apikey/", {"action": "revoke", "_selected_action": [key.pk]}, follow=True
    )
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_admin_raising_a_session_cap_recomputes_its_state(staff: Client, agent: Agent) -> None:
    agent.events(
        {"type": "session", "session_id": "s1", "token_cap": 100},
        {"session_id": "s1", "step_type": "x", "model": "m", "input_tokens": 150},
    )
    session = Session.objects.get(external_id="s1")
    assert session.state == "exhausted"
    response = staff.post(
        f"/admin/costboard/session/{session.pk}/change/",
        {
            "token_cap": 1000,
            "cost_cap_usd": "",
            "budget_events-TOTAL_FORMS": "2",
            "budget_events-INITIAL_FORMS": "2",
            "budget_events-MIN_NUM_FORMS": "0",
            "budget_events-MAX_NUM_FORMS": "1000",
            **{
                f"budget_events-{i}-id": e.pk
                for i, e in enumerate(
                    BudgetEvent.objects.filter(session=session).order_by("at", "id")
                )
            },
            **{f"budget_events-{i}-session": session.pk for i in range(2)},
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    session.refresh_from_db()
    assert (session.token_cap, session.state, session.exhausted_at) == (1000, "ok", None)
    last = BudgetEvent.objects.filter(session=session).order_by("at", "id").last()
    assert last is not None
    assert last.kind == "cap_changed"
    assert last.detail["token_cap"] == [100, 1000]


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/sessions/",
        "/flagged/",
        "/budgets/",
        "/steps/",
        "/users/",
        "/reconciliation/",
        "/reports/",
        "/memory/review/",
        "/memory/",
        "/memory/metrics/",
    ],
)
def test_no_page_shows_its_templates_comments(staff: Client, agent: Agent, path: str) -> None:
    # a {# #} comment is one line only: /sessions/ showed one written over two, braces and all
    agent.events({"session_id": "s", "step_type": "x", "model": "test-sonnet", "turn": 1})
    response = staff.get(path)
    assert response.status_code == 200
    html = response.content.decode()
    assert "{#" not in html and "#}" not in html
    assert "{%" not in html and "{{" not in html
