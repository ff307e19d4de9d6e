"""A query parameter of the API given twice is a 422 naming it: `QueryDict.dict()` kept the
last value, so `?group_by=model&group_by=user` answered grouped by user as if `model` had
never been asked for. None of the API's parameters is a list (group_by's values go
comma-separated in one); a parameter an endpoint does not read is left to its own rule."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from costboard.models import ApiKey
from tests.conftest import Agent

pytestmark = pytest.mark.django_db


@pytest.fixture
def key(agent: Agent) -> str:
    agent.events(
        {"type": "session", "session_id": "s1", "user_id": "ann"},
        {"type": "turn", "session_id": "s1", "turn": 1, "user_message": "hello"},
        {"session_id": "s1", "turn": 1, "step_type": "x", "model": "m", "input_tokens": 5},
    )
    return ApiKey.issue(project=agent.project, role="admin")[1]


def get(key: str, path: str, query: str) -> Any:
    return Client().get(f"{path}?{query}", headers={"Authorization": f"Bearer {key}"})


@pytest.mark.parametrize(
    ("path", "query", "name"),
    [
        ("/api/v1/spend", "group_by=model&group_by=user", "group_by"),
        ("/api/v1/spend", "group_by=day&since=2026-01-01&since=2026-02-01", "since"),
        ("/api/v1/spend", "until=2026-01-01&until=2026-01-01", "until"),  # even the same value
        ("/api/v1/reconciliation", "group_by=day&group_by=model", "group_by"),
        ("/api/v1/sessions/s1/context", "budget=100&budget=5000", "budget"),
        ("/api/v1/memory/MEMORY.md", "scope=project&scope=user:ann", "scope"),
        ("/api/v1/memory/search", "q=one&q=two&k=3", "q"),
    ],
)
def test_a_repeated_parameter_is_refused_naming_it(
    key: str, path: str, query: str, name: str
) -> None:
    answer = get(key, path, query)
    assert answer.status_code == 422, answer.content
    [error] = answer.json()["errors"]
    assert (error["index"], error["field"]) == (None, name)
    assert f"give `{name}` once" in error["message"]
    assert error["message"].startswith("given 2 times (")
    # given once (its first value), it is answered
    once = dict(part.split("=", 1) for part in reversed(query.split("&")))
    answer = get(key, path, "&".join(f"{k}={v}" for k, v in once.items()))
    assert answer.status_code == 200, answer.content


def test_the_message_names_the_values_and_how_to_ask_for_several_groups(key: str) -> None:
    answer = get(key, "/api/v1/spend", "group_by=model&group_by=user&group_by=day")
    [error] = answer.json()["errors"]
    assert error == {
        "index": None,
        "field": "group_by",
        "message": "given 3 times ('model', 'user', 'day'): give `group_by` once, its values "
        "comma-separated in it",
    }
    answer = get(key, "/api/v1/spend", "group_by=day,model")
    assert answer.status_code == 200, answer.content
    assert answer.json()["group_by"] == ["day", "model"]


def test_each_repeated_parameter_is_named_and_one_not_read_keeps_its_own_rule(key: str) -> None:
    answer = get(key, "/api/v1/spend", "since=2026-01-01&since=2026-01-02&until=x&until=y")
    assert answer.status_code == 422
    assert [e["field"] for e in answer.json()["errors"]] == ["since", "until"]
    # context ignores what it does not read, repeated or not; spend refuses it as unknown
    assert get(key, "/api/v1/sessions/s1/context", "budget=100&_=1&_=2").status_code == 200
    unknown = get(key, "/api/v1/spend", "colour=red&colour=blue")
    assert unknown.status_code == 422
    assert [e["field"] for e in unknown.json()["errors"]] == ["colour"]
