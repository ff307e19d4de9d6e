from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.http import HttpRequest
from django.test import Client
from django.utils import timezone

from costboard.models import ApiKey, Project, Session
from tests.conftest import Agent, make_agent

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_create_api_key_makes_the_project_and_prints_the_key_last() -> None:
    output = run("create_api_key", "support-bot")
    key = output.strip().splitlines()[-1]
    project = Project.objects.get(slug="support-bot")
    assert ApiKey.objects.get(project=project).key_hash == ApiKey.hash_of(key)
    response = Client().post(
        "/api/v1/events",
        {"step_type": "x", "model": "m"},
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 200


def test_create_api_key_for_an_existing_project_adds_a_key() -> None:
    run("create_api_key", "support-bot")
    run("create_api_key", "support-bot")
    assert Project.objects.count() == 1
    assert ApiKey.objects.count() == 2


def test_create_api_key_refuses_a_non_slug() -> None:
    with pytest.raises(CommandError, match="support-bot"):
        run("create_api_key", "Support Bot")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["b" * 101], "the project slug is 101 characters long: use at most 100"),
        (["support-bot", "--name", "n" * 101], "--name is 101 characters long: use at most 100"),
    ],
)
def test_create_api_key_refuses_a_slug_or_name_too_long_storing_nothing(
    argv: list[str], says: str
) -> None:
    with pytest.raises(CommandError) as refused:
        run("create_api_key", *argv)
    assert str(refused.value) == says
    assert Project.objects.count() == 0
    assert ApiKey.objects.count() == 0


def test_costboard_status_counts_sessions(agent: Agent) -> None:
    agent.events(
        {"type": "session", "session_id": "near", "token_cap": 100},
        {"type": "session", "session_id": "done", "token_cap": 100},
        {"type": "session", "session_id": "old", "ended": True},
        {"session_id": "near", "step_type": "x", "model": "m", "input_tokens": 85},
        {"session_id": "done", "step_type": "x", "model": "m", "input_tokens": 100},
        {"session_id": "calm", "step_type": "x", "model": "m", "input_tokens": 1},
    )
    Session.objects.filter(external_id="calm").update(
        last_active_at=timezone.now() - timedelta(days=3)
    )
    make_agent("quiet")
    lines = run("costboard_status").splitlines()
    assert lines[0] == "sessions: 2 active, 1 near-cap, 1 exhausted"
    assert lines[1].startswith("  acme: 2 active, 1 near-cap, 1 exhausted, 0 runaway")
    assert lines[2].startswith("  quiet: 0 active, 0 near-cap, 0 exhausted")


def test_ensure_admin_prints_the_password_once() -> None:
    first = run("ensure_admin")
    assert "password:" in first
    password = first.split("password:")[1].split()[0]
    # request: the login lockout (django-axes) checks who is asking before the password
    assert Client().login(request=HttpRequest(), username="admin", password=password)
    second = run("ensure_admin")
    assert "password:" not in second
