"""Issue 13's bad inputs, each against every endpoint that takes it (docs/api.md, "Errors"): a 4xx
whose JSON `errors` name the field and the fix, and no row stored. Against the real database: the
500s these were came from PostgreSQL refusing them."""

from __future__ import annotations

import json
from datetime import UTC
from typing import Any

import pytest
from django.test import Client

from costboard.api.openapi import openapi_document
from costboard.models import ApiKey, Session, Step, Turn
from memory_ui.models import Memory
from tests.conftest import Agent

pytestmark = pytest.mark.django_db

NUL, LONE = "\u0000", "\ud800"


def rows() -> tuple[int, int, int, int]:
    return (
        Step.objects.count(),
        Turn.objects.count(),
        Session.objects.count(),
        Memory.objects.count(),
    )


def step(**fields: Any) -> dict[str, Any]:
    return {"session_id": "s1", "step_type": "response", "model": "m", **fields}


def turn(**fields: Any) -> dict[str, Any]:
    return {"type": "turn", "session_id": "s1", "turn": 1, **fields}


def session(**fields: Any) -> dict[str, Any]:
    return {"type": "session", "session_id": "s1", **fields}


def nested(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def refused(response: Any, status: int) -> dict[str, Any]:
    """The first error of a refusal, after checking its status and body shape."""
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    errors = response.json()["errors"]
    assert errors and all(set(e) == {"index", "field", "message"} for e in errors)
    return errors[0]


@pytest.fixture
def client(agent: Agent) -> Client:
    return Client(headers={"Authorization": f"Bearer {agent.key}"}, raise_request_exception=False)


EVENTS: list[tuple[Any, str, str]] = [
    # NUL in any text, top level or nested, key or value
    (step(event_id="e" + NUL), "event_id", "NUL"),
    (step(session_id="s" + NUL), "session_id", "NUL"),
    (step(model="gpt" + NUL), "model", "NUL"),
    (step(step_type="x" + NUL), "step_type", "NUL"),
    (step(provider="p" + NUL), "provider", "NUL"),
    (step(error="boom" + NUL), "error", "NUL"),
    (step(metadata={"k": ["a" + NUL]}), "metadata.k.0", "NUL"),
    (step(usage={"x" + NUL: 1}), "usage", "a key must not contain NUL"),
    (turn(user_message="hi" + NUL), "user_message", "NUL"),
    (turn(assistant_response=NUL), "assistant_response", "NUL"),
    (turn(context={"focus": NUL}), "context.focus", "NUL"),
    (session(user_id="u" + NUL), "user_id", "NUL"),
    (session(metadata={"k": NUL}), "metadata.k", "NUL"),
    (step(timestamp="2026-01-01" + NUL), "timestamp", "NUL"),
    # unpaired surrogates
    (step(model=LONE), "model", "unpaired surrogate"),
    (turn(user_message="a" + LONE + "b"), "user_message", "unpaired surrogate"),
    # integers bounded to their columns
    (step(turn=2**31), "turn", "must be at most 2147483647"),
    (turn(turn=2**31), "turn", "must be at most 2147483647"),
    (step(turn=10**30), "turn", "must be at most 2147483647"),
    (step(output_tokens=10**12 + 1), "output_tokens", "must be at most 1000000000000"),
    (session(token_cap=10**30), "token_cap", "must be at most 1000000000000"),
    (step(duration_ms=10**30), "duration_ms", "2147483647"),
    # huge numbers inside usage, every shape, named where they are
    (step(usage={"prompt_tokens": 10**30}), "usage.prompt_tokens", "10^12"),
    (step(usage={"input_tokens": 10**13, "output_tokens": 1}), "usage.input_tokens", "10^12"),
    (step(usage={"promptTokenCount": 10**13}), "usage.promptTokenCount", "10^12"),
    (
        step(usage={"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 10**40}}),
        "usage.prompt_tokens_details.cached_tokens",
        "10^12",
    ),
    (
        step(usage={"input_tokens": 1, "cache_creation": {"ephemeral_1h_input_tokens": 10**20}}),
        "usage.cache_creation.ephemeral_1h_input_tokens",
        "10^12",
    ),
    (step(usage={"prompt_tokens": 10**300}), "usage.prompt_tokens", "10^12"),
    # nesting past 32 levels
    (step(metadata={"a": json.loads(nested(40))}), "metadata", "32 levels"),
    (turn(context={"a": json.loads(nested(40))}), "context", "32 levels"),
    (step(usage={"a": json.loads(nested(40))}), "usage", "32 levels"),
    # times that overflow when converted
    (step(timestamp="0001-01-01T00:00:00+14:00"), "timestamp", "1970 to 2999"),
    (step(timestamp="9999-12-31T23:59:59-14:00"), "timestamp", "1970 to 2999"),
    # the years are UTC's: the offset moves these across the bound
    (step(timestamp="2999-12-31T23:00:00-14:00"), "timestamp", "1970 to 2999 in UTC"),
    (step(timestamp="2999-12-31T12:00:00-12:00"), "timestamp", "1970 to 2999 in UTC"),
    (step(timestamp="1970-01-01T00:30:00+01:00"), "timestamp", "1970 to 2999 in UTC"),
    (step(timestamp="3000-01-01T00:00:00"), "timestamp", "1970 to 2999 in UTC"),
    (step(timestamp="1969-12-31T23:59:59.999999Z"), "timestamp", "1970 to 2999 in UTC"),
]


@pytest.mark.parametrize(
    ("timestamp", "stored"),
    [
        ("2999-12-31T23:59:59.999999Z", "2999-12-31T23:59:59.999999+00:00"),
        ("3000-01-01T09:00:00+14:00", "2999-12-31T19:00:00+00:00"),  # 3000 locally, 2999 in UTC
        ("1969-12-31T20:00:00-05:00", "1970-01-01T01:00:00+00:00"),  # 1969 locally
        ("1970-01-01T00:00:00", "1970-01-01T00:00:00+00:00"),  # no offset: UTC
    ],
)
def test_a_time_within_the_years_in_utc_is_stored_in_utc(
    client: Client, timestamp: str, stored: str
) -> None:
    response = client.post(
        "/api/v1/events", step(input_tokens=1, timestamp=timestamp), content_type="application/json"
    )
    assert response.status_code == 200, response.content
    [kept] = Step.objects.all()
    assert kept.timestamp.astimezone(UTC).isoformat() == stored


@pytest.mark.slow
@pytest.mark.parametrize(("event", "field", "says"), EVENTS)
def test_a_bad_event_is_422_naming_the_field_and_nothing_is_stored(
    client: Client, event: dict[str, Any], field: str, says: str
) -> None:
    response = client.post(
        "/api/v1/events", {"events": [step(input_tokens=1), event]}, content_type="application/json"
    )
    error = refused(response, 422)
    assert (error["index"], error["field"]) == (1, field)
    assert says in error["message"]
    assert rows() == (0, 0, 0, 0)


BODIES: list[tuple[bytes, int, str]] = [
    (b'{"step_type": "x", "model": "m", "metadata": {"a": NaN}}', 400, "NaN is not JSON"),
    (b'{"step_type": "x", "model": "m", "metadata": {"a": Infinity}}', 400, "Infinity"),
    (b'{"step_type": "x", "model": "m", "usage": {"prompt_tokens": -Infinity}}', 400, "Infinity"),
    (b'{"step_type": "x", "model": "m", "metadata": {"a": 1e400}}', 400, "1e308"),
    (
        b'{"step_type": "x", "model": "m", "metadata": {"a": ' + nested(1000) + b"}}",
        422,
        "32 levels",
    ),
    (b'{"a": ' * 1000 + b"1" + b"}" * 1000, 422, "32 levels"),
    (nested(100_000), 422, "32 levels"),
    (b'{"step_type": "x", "model": "\\ud800"}', 422, "unpaired surrogate"),
    (b"", 400, "malformed JSON"),
    # the parser's complaint alone ("Expecting value: line 1 column 1") did not say what to send
    (b"", 400, 'send one event object, {"events": [...]} or a JSON array of events'),
    (b'{"step_type": "x",', 400, 'send one event object, {"events": [...]}'),
]


@pytest.mark.parametrize(("body", "status", "says"), BODIES)
def test_a_body_json_cannot_hold_is_refused_with_nothing_stored(
    client: Client, body: bytes, status: int, says: str
) -> None:
    error = refused(client.post("/api/v1/events", body, content_type="application/json"), status)
    assert error["field"] in {"body", "model"}
    assert says in error["message"]
    assert rows() == (0, 0, 0, 0)


CANDIDATES: list[tuple[bytes, int, str, str]] = [
    (json.dumps({"content": "Use ruff" + NUL, "type": "user"}).encode(), 422, "content", "NUL"),
    (json.dumps({"content": "Use " + LONE, "type": "user"}).encode(), 422, "content", "surrogate"),
    (b'{"content": "Use \\udc00 ruff", "type": "user"}', 422, "content", "surrogate"),
    (
        json.dumps({"content": "a b", "type": "user", "scope": "user:a\n"}).encode(),
        422,
        "scope",
        "user:",
    ),
    (json.dumps({"content": "a b", "type": NUL}).encode(), 422, "type", "NUL"),
    (json.dumps({"content": "a b", "type": "user", "tags": [NUL]}).encode(), 422, "tags.0", "NUL"),
    (b'{"content": "a b", "type": "user", "importance": NaN}', 400, "body", "NaN"),
    (b'{"content": "a b", "type": "user", "ttl_days": 1e400}', 400, "body", "1e308"),
    (
        b'{"content": "a b", "type": "user", "tags": ' + nested(1000) + b"}",
        422,
        "body",
        "32 levels",
    ),
]


@pytest.mark.parametrize(("body", "status", "field", "says"), CANDIDATES)
def test_a_bad_memory_candidate_is_refused_and_nothing_stored(
    client: Client, body: bytes, status: int, field: str, says: str
) -> None:
    response = client.post("/api/v1/memory/candidates", body, content_type="application/json")
    error = refused(response, status)
    assert error["field"] == field
    assert says in error["message"]
    assert rows() == (0, 0, 0, 0)


@pytest.mark.parametrize(
    ("path", "field", "says"),
    [
        ("/api/v1/memory/search?q=a%00b", "q", "NUL"),
        ("/api/v1/memory/search?q=a&scope=user:a%0A", "scope", "user:"),
        ("/api/v1/memory/search?q=a&k=99999999999999999999", "k", "1 to 50"),
        ("/api/v1/memory/search?q=a&k=%C2%B2", "k", "must be a whole number from 1 to 50"),
        ("/api/v1/memory/search?q=a&k=%D9%A3", "k", "must be a whole number from 1 to 50"),
        pytest.param(
            "/api/v1/memory/search?q=a&k=" + "9" * 5000,
            "k",
            "must be a whole number from 1 to 50",
            id="k-5000-digits",
        ),
        ("/api/v1/memory/MEMORY.md?scope=user:%00", "scope", "NUL"),
        ("/api/v1/sessions/a%00b/context?budget=5", "session_id", "NUL"),
        ("/api/v1/sessions/s1/context?budget=99999999999999999999999", "budget", "at most"),
        ("/api/v1/sessions/a%00b/budget", "session_id", "NUL"),
    ],
)
def test_bad_text_in_a_query_or_path_is_422(
    client: Client, path: str, field: str, says: str
) -> None:
    error = refused(client.get(path), 422)
    assert error["field"] == field
    assert says in error["message"]


def test_memory_feedback_with_an_id_past_bigint_is_422(client: Client) -> None:
    body = {"memory_id": 2**63, "useful": True}
    response = client.post("/api/v1/memory/feedback", body, content_type="application/json")
    assert refused(response, 422)["field"] == "memory_id"


# --- a query parameter no endpoint can use: 422 naming it, before anything reads it -----------

BAD_QUERIES = [
    ("group_by=tag:a%00b", "group_by", "must not contain NUL (%00): remove it"),
    ("group_by=tag:a%1Fb", "group_by", "must not contain the control character U+001F"),
    ("group_by=tag:%C2%9B", "group_by", "must not contain the control character U+009B"),
    ("group_by=tag:%FF", "group_by", "is not valid UTF-8"),
    ("x%00y=1", "x%00y", "must not contain NUL"),
    ("since=2026-01-01&%ED%A0%80=1", "\ufffd\ufffd\ufffd", "is not valid UTF-8"),
]


@pytest.mark.parametrize(("query", "field", "says"), BAD_QUERIES)
def test_a_bad_character_in_spends_query_is_422_naming_the_parameter(
    agent: Agent, query: str, field: str, says: str
) -> None:
    reader = ApiKey.issue(project=agent.project, role="read")[1]
    for accept in ("application/json", "text/csv"):
        response = Client().get(
            f"/api/v1/spend?{query}",
            headers={"Authorization": f"Bearer {reader}", "Accept": accept},
        )
        error = refused(response, 422)
        assert error["field"] == field
        assert says in error["message"]


def test_every_endpoint_refuses_a_nul_in_any_query_parameter(agent: Agent) -> None:
    """Whatever the operation, with a key or without: the parameter is named, nothing runs."""
    concrete = {"{session_id}": "s1", "{budget_id}": "1"}
    for path, methods in openapi_document()["paths"].items():
        for name, value in concrete.items():
            path = path.replace(name, value)
        for method in methods:
            response = Client().generic(
                method.upper(),
                f"{path}?fine=1&not%00fine=1",
                b"{}",
                content_type="application/json",
                headers={"Authorization": f"Bearer {agent.key}"},
            )
            error = refused(response, 422)
            assert (error["field"], method, path) == ("not%00fine", method, path)
    assert rows() == (0, 0, 0, 0)


@pytest.mark.parametrize("query", ["q=a%09b", "q=caf%C3%A9+%E2%82%AC", "q=%F0%9F%98%80"])
def test_tabs_and_any_script_in_a_query_are_fine(client: Client, query: str) -> None:
    assert client.get(f"/api/v1/memory/search?{query}").status_code == 200
