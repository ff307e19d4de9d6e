from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from costboard.models import ApiKey, Project, Session, Step
from costboard.projects import key_for
from tests.conftest import Agent, make_agent

pytestmark = pytest.mark.django_db

EVENT = {"session_id": "s1", "step_type": "x", "model": "m", "input_tokens": 1}


def test_no_key_is_401_naming_the_header(client: Client) -> None:
    response = client.post("/api/v1/events", EVENT, content_type="application/json")
    assert response.status_code == 401
    error = response.json()["errors"][0]
    assert error["field"] == "Authorization"
    assert "Bearer" in error["message"]
    assert Step.objects.count() == 0


def test_a_wrong_key_is_401(agent: Agent) -> None:
    response = agent.client.post(
        "/api/v1/events",
        EVENT,
        content_type="application/json",
        headers={"Authorization": "Bearer cb_not-a-key"},
    )
    assert response.status_code == 401
    assert "create_api_key" in response.json()["errors"][0]["message"]


def test_a_revoked_key_is_401(agent: Agent) -> None:
    assert agent.post(EVENT).status_code == 200
    ApiKey.objects.filter(project=agent.project).update(revoked_at=timezone.now())
    assert agent.post(EVENT).status_code == 401
    assert agent.budget("s1").status_code == 401


def test_the_key_decides_the_project(agent: Agent) -> None:
    other = make_agent("other")
    agent.events(EVENT)
    other.events({**EVENT, "input_tokens": 5})
    assert Session.objects.get(project=agent.project, external_id="s1").input_tokens == 1
    assert Session.objects.get(project=other.project, external_id="s1").input_tokens == 5
    assert other.budget("s1").json()["tokens_used"] == 5


def test_another_projects_session_is_not_found(agent: Agent) -> None:
    agent.events({**EVENT, "session_id": "private"})
    other = make_agent("other")
    assert other.budget("private").status_code == 404


def test_only_a_hash_of_the_key_is_stored(agent: Agent) -> None:
    key = ApiKey.objects.get(project=agent.project)
    assert agent.key not in (key.key_hash, key.prefix)
    assert key.key_hash == ApiKey.hash_of(agent.key)
    assert agent.key.startswith(key.prefix)


def test_get_on_the_ingest_endpoint_is_405(agent: Agent) -> None:
    response = agent.client.get("/api/v1/events", headers={"Authorization": f"Bearer {agent.key}"})
    assert response.status_code == 405


@pytest.mark.django_db
def test_a_key_and_its_project_are_read_as_the_orm_reads_them() -> None:
    """key_for writes its query once rather than through the ORM each request: every field
    of the key and of its project comes back as the ORM's own read gives it (times, caps in
    Decimal, booleans: SQLite stores them as text and integers)."""
    project = Project.objects.create(
        name="Caps",
        slug="caps",
        token_cap=123_456,
        cost_cap_usd=Decimal("12.3457"),
        warn_at_pct=Decimal("0.65"),
        runaway_stops=False,
        alert_emails="a@example.com",
    )
    key, raw = ApiKey.issue(project=project, name="bot", role=ApiKey.Role.READ)
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now() - timedelta(hours=1))

    orm = ApiKey.objects.select_related("project").get(pk=key.pk)
    found = key_for(raw)

    assert found is not None
    for model, ours, theirs in ((ApiKey, found, orm), (Project, found.project, orm.project)):
        for field in model._meta.concrete_fields:
            mine, expected = getattr(ours, field.attname), getattr(theirs, field.attname)
            assert (mine, type(mine)) == (expected, type(expected)), field.attname
    assert found.project.cost_cap_usd == Decimal("12.3457")
    assert key_for(raw + "x") is None
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())
    assert key_for(raw) is None
