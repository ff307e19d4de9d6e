"""The boundary's limits (docs/api.md, "Limits"): input PostgreSQL or Python would fail on is
refused with a 4xx naming the field, never a 500, and nothing is stored."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from pydantic import ValidationError

from costboard.api.boundary import MAX_QUERY_STRING
from costboard.models import Session, Step
from memory_ui.models import Memory
from tests.conftest import Agent, add_price

pytestmark = pytest.mark.django_db


def step(**fields: Any) -> dict[str, Any]:
    return {"session_id": "s1", "step_type": "response", "model": "m", **fields}


def refused(response: Any, status: int = 422) -> dict[str, Any]:
    assert response.status_code == status, response.content
    (error,) = response.json()["errors"]
    return error


@pytest.mark.parametrize(
    ("event", "field", "says"),
    [
        (step(model="gpt\u0000"), "model", "NUL"),
        (step(metadata={"note": "a\u0000b"}), "metadata.note", "NUL"),
        (step(metadata={"k\u0000": 1}), "metadata", "a key"),
        (step(error="\ud800 alone"), "error", "unpaired surrogate"),
        (step(turn=2**31), "turn", "must be at most 2147483647"),
        (step(input_tokens=10**12 + 1), "input_tokens", "must be at most 1000000000000"),
        (step(usage={"prompt_tokens": 10**13}), "usage.prompt_tokens", "10^12"),
        (step(duration_ms=2**31), "duration_ms", "2147483647"),
        (step(metadata={"a": json.loads("[" * 32 + "]" * 32)}), "metadata", "32 levels"),
        ({"type": "turn", "session_id": "s1", "turn": 1, "context": {"a": [[[[{}]]]]}}, None, ""),
        (step(timestamp=1763805600), "timestamp", "ISO 8601"),
        (step(timestamp="0001-01-01T00:00:00+14:00"), "timestamp", "1970 to 2999"),
    ],
)
def test_events_past_a_limit_are_422_naming_the_field(
    agent: Agent, event: dict[str, Any], field: str | None, says: str
) -> None:
    response = agent.post({"events": [step(input_tokens=1), event]})
    if field is None:  # within the limits: stored
        assert response.status_code == 200, response.content
        return
    error = refused(response)
    assert (error["index"], error["field"]) == (1, field)
    assert says in error["message"]
    assert Step.objects.count() == 0


def test_metadata_32_deep_is_stored(agent: Agent) -> None:
    deepest = json.loads("[" * 31 + "]" * 31)  # the metadata object itself is level 1
    assert agent.post(step(metadata={"a": deepest})).status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b'{"step_type": "x", "model": "m", "duration_ms": NaN}', 400, "NaN is not JSON"),
        (b'{"step_type": "x", "model": "m", "duration_ms": 1e999999}', 400, "1e308"),
        # past the largest double but under 1e309: metadata would have stored Infinity
        (b'{"step_type": "x", "model": "m", "metadata": {"n": 1.9e308}}', 400, "1e308"),
        (
            b'{"step_type": "x", "model": "m", "metadata": {"n": 2' + b"0" * 308 + b".5}}",
            400,
            "1e308",
        ),
        ('{"step_type": "x", "model": "\udcff"}'.encode("utf-8", "surrogatepass"), 400, "utf-8"),
        (b"[" * 100_000 + b"]" * 100_000, 422, "32 levels"),
    ],
)
def test_bodies_json_cannot_hold_are_refused(
    agent: Agent, body: bytes, status: int, says: str
) -> None:
    error = refused(agent.post(None, raw=body), status)
    assert error["field"] == "body"
    assert says in error["message"]


def test_a_whole_number_written_with_a_fraction_is_that_integer(agent: Agent) -> None:
    response = agent.post(None, raw=b'{"step_type": "x", "model": "m", "input_tokens": 12.0}')
    assert response.status_code == 200, response.content
    assert Step.objects.get().input_tokens == 12
    fraction = agent.post(None, raw=b'{"step_type": "x", "model": "m", "input_tokens": 12.5}')
    assert refused(fraction)["field"] == "input_tokens"


def test_path_text_with_nul_is_422_not_a_database_error(agent: Agent) -> None:
    response = agent.client.get(
        "/api/v1/sessions/a%00b/context?budget=5", headers={"Authorization": f"Bearer {agent.key}"}
    )
    assert refused(response)["field"] == "session_id"


def test_an_overlong_query_string_is_414(agent: Agent) -> None:
    response = agent.client.get(
        "/api/v1/memory/search?q=" + "x" * MAX_QUERY_STRING,
        headers={"Authorization": f"Bearer {agent.key}"},
    )
    error = refused(response, 414)
    assert error["field"] == "query"
    assert str(MAX_QUERY_STRING) in error["message"]


def test_a_wrong_method_is_405_json_with_allow(agent: Agent) -> None:
    response = agent.client.get(
        "/api/v1/memory/candidates", headers={"Authorization": f"Bearer {agent.key}"}
    )
    assert refused(response, 405)["field"] == "method"
    assert response["Allow"] == "POST"


@pytest.mark.parametrize(
    ("candidate", "field"),
    [
        ({"content": "Use\u0000 ruff", "type": "user"}, "content"),
        ({"content": "Use ruff", "type": "user", "tags": ["a\ud800"]}, "tags.0"),
        ({"content": "Use ruff", "type": "user", "session_id": "s\u0000"}, "session_id"),
        ({"content": "Use ruff", "type": "user", "extra": json.loads("[" * 40 + "]" * 40)}, "body"),
    ],
)
def test_memory_text_past_a_limit_is_422(
    agent: Agent, candidate: dict[str, Any], field: str
) -> None:
    response = agent.client.post(
        "/api/v1/memory/candidates",
        json.dumps(candidate),
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent.key}"},
    )
    assert refused(response)["field"] == field
    assert not Memory.objects.exists()


def test_a_span_with_nul_is_rejected_and_the_others_stored(agent: Agent) -> None:
    def span(span_id: str, session: str) -> dict[str, Any]:
        return {
            "traceId": "5b8efff798038103d269b633813fc60c",
            "spanId": span_id,
            "name": "chat",
            "startTimeUnixNano": "1763805600000000000",
            "attributes": [{"key": "session.id", "value": {"stringValue": session}}],
        }

    body = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {"spans": [span("eee19b7ec3c1b174", "ok"), span("eee19b7ec3c1b175", "n\u0000")]}
                ]
            }
        ]
    }
    response = agent.client.post(
        "/v1/traces",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent.key}"},
    )
    assert response.status_code == 200, response.content
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert "NUL" in partial["errorMessage"]
    assert list(Session.objects.values_list("external_id", flat=True)) == ["ok"]


def test_an_answer_that_breaks_its_model_is_a_server_error_not_a_422(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent.events(step(input_tokens=1))
    monkeypatch.setattr(
        "costboard.api.events.session_budget", lambda session, project, **_: {"state": "lost"}
    )
    with pytest.raises(ValidationError):  # Django's test client re-raises what became a 500
        agent.budget("s1")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite keeps any sum")
def test_a_batch_past_the_stored_sums_is_422_and_stores_nothing(agent: Agent) -> None:
    # $400,000 a million output tokens (the rate table takes it) at 10^12 tokens a step (the
    # most a step takes): $4·10^11 a step, so three in one session pass numeric(24, 12)
    add_price("dear-model", output_mtok=Decimal(400_000))
    step = {"step_type": "response", "model": "dear-model", "session_id": "s1",
            "output_tokens": 10**12}  # fmt: skip
    assert agent.events(step, step)["accepted"] == 2
    kept = Session.objects.get().cost_usd
    answer = agent.post({"events": [step, step]})
    error = refused(answer, 422)
    assert error["field"] == "events"
    assert "past what Costboard keeps" in error["message"]
    assert Step.objects.count() == 2 and Session.objects.get().cost_usd == kept
