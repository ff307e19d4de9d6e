"""Random input never makes a 5xx (docs/api.md, "Errors"): hypothesis posts any unicode (lone
surrogates and NUL included), integers far past every column, NaN and Infinity, and nesting from
flat to a thousand levels into the events body, OTLP JSON, the memory API and its search, against
the real database. Every refusal is JSON with `errors`, and a refused request stores nothing.

Bounded (and derandomized, like the rest of the suite's hypothesis tests) so the file runs in
well under half a minute on two cores."""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import urlencode

import pytest
from django.db import transaction
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costboard.models import Session, Step, Turn
from memory_ui.models import Memory
from tests.conftest import Agent

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# any code point: NUL, controls, lone surrogates (json.dumps escapes them as \udxxx)
text = st.text(st.characters(codec=None, categories=None), max_size=40) | st.sampled_from(
    ["", "\x00", "\ud800", "a\udfffb", "s1", "user:a", "project", "\n", "9" * 400]
)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 10**12, 10**12 + 1, 2**63, 10**300]),
    st.floats(allow_nan=True, allow_infinity=True),  # NaN, Infinity: not JSON, sent anyway
)
scalars = st.none() | st.booleans() | numbers | text
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
depths = st.integers(min_value=0, max_value=1200)

USAGE_KEYS = [
    "prompt_tokens",
    "completion_tokens",
    "prompt_tokens_details",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "cache_creation",
    "promptTokenCount",
    "candidatesTokenCount",
]
usage = st.dictionaries(
    st.sampled_from(USAGE_KEYS),
    numbers
    | st.dictionaries(st.sampled_from(["cached_tokens", "ephemeral_1h_input_tokens"]), numbers),
    max_size=4,
)
objects = st.dictionaries(text, values, max_size=4)
times = st.sampled_from(
    ["2026-11-22T10:15:00Z", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "2026"]
)


def mostly(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The field's own kind of value three times in four (so an event gets past validation
    to the database), anything at all otherwise."""
    return st.one_of(strategy, strategy, strategy, values)


COMMON = {"event_id": mostly(text), "timestamp": mostly(times | text)}
# each kind's fields: an event of one kind with another's field is refused before the database
FIELDS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "session": {
        **COMMON,
        "session_id": mostly(text),
        "user_id": mostly(text),
        "parent_session_id": mostly(text),
        "token_cap": mostly(numbers),
        "cost_cap_usd": mostly(numbers | text),
        "ended": mostly(st.booleans()),
        "metadata": mostly(objects),
    },
    "turn": {
        **COMMON,
        "session_id": mostly(text),
        "turn": mostly(numbers),
        "user_message": mostly(text),
        "assistant_response": mostly(text),
        "context": mostly(objects),
    },
    "step": {
        **COMMON,
        "session_id": mostly(text),
        "turn": mostly(numbers),
        "step_type": mostly(text),
        "model": mostly(text),
        "provider": mostly(text),
        "input_tokens": mostly(numbers),
        "output_tokens": mostly(numbers),
        "cache_read_input_tokens": mostly(numbers),
        "reasoning_tokens": mostly(numbers),
        "duration_ms": mostly(numbers),
        "success": mostly(st.booleans()),
        "error": mostly(text),
        "usage": mostly(usage),
        "metadata": mostly(objects),
    },
}
BASE: dict[str, dict[str, Any]] = {
    "session": {"session_id": "s1"},
    "turn": {"session_id": "s1", "turn": 1},
    "step": {"session_id": "s1", "step_type": "x", "model": "m"},
}


@st.composite
def events(draw: Any) -> dict[str, Any]:
    """A valid event of a kind with up to three of its fields drawn: each bad value alone
    reaches as far as it can, the database included."""
    kind = draw(st.sampled_from(sorted(FIELDS)))
    event: dict[str, Any] = {"type": kind, **BASE[kind]}
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS[kind])), max_size=3, unique=True)):
        event[name] = draw(FIELDS[kind][name])
    return event


def dumps(value: Any) -> str:
    """JSON as a lax client writes it: NaN and Infinity as bare words (allow_nan)."""
    return json.dumps(value, allow_nan=True)


def nest(depth: int, inner: str) -> str:
    return "[" * depth + inner + "]" * depth


def rows() -> tuple[int, int, int, int]:
    return (
        Step.objects.count(),
        Turn.objects.count(),
        Session.objects.count(),
        Memory.objects.count(),
    )


def send(client: Client, method: str, path: str, body: str = "") -> Any:
    """One request in a savepoint: were a query to fail in the database, the test's
    transaction would stay usable and the failure be this example's alone."""
    before = rows()
    with transaction.atomic():
        if method == "GET":
            response = client.get(path)
        else:
            response = client.post(path, body.encode("utf-8"), content_type="application/json")
    assert response.status_code < 500, (response.status_code, response.content[:500])
    if response.status_code >= 400:
        assert response["Content-Type"].startswith("application/json"), response.content[:200]
        errors = response.json()["errors"]
        assert errors and all(error["message"] for error in errors)
        assert rows() == before, "a refused request stored rows"
    return response


@pytest.fixture
def client(agent: Agent) -> Client:
    return Client(headers={"Authorization": f"Bearer {agent.key}"})


@FUZZ
@given(batch=st.lists(events(), min_size=1, max_size=3), depth=depths, wrap=st.booleans())
def test_events_never_5xx(
    client: Client, batch: list[dict[str, Any]], depth: int, wrap: bool
) -> None:
    body = dumps({"events": batch})
    if wrap:  # the same batch, one event's metadata nested `depth` deep
        body = dumps({"events": batch[1:]})[:-2] + (", " if batch[1:] else "")
        body += '{"step_type": "x", "model": "m", "metadata": {"a": ' + nest(depth, "1") + "}}]}"
    send(client, "POST", "/api/v1/events", body)


@FUZZ
@given(
    attributes=st.lists(st.tuples(text, values), max_size=4),
    session=values,
    name=values,
    ids=st.tuples(text, text),
    depth=depths,
)
def test_otlp_json_never_5xx(
    client: Client,
    attributes: list[tuple[str, Any]],
    session: Any,
    name: Any,
    ids: tuple[str, str],
    depth: int,
) -> None:
    def any_value(value: Any) -> dict[str, Any]:
        if isinstance(value, bool):
            return {"boolValue": value}
        if isinstance(value, int):
            return {"intValue": str(value)}
        if isinstance(value, float):
            return {"doubleValue": value if math.isfinite(value) else str(value)}
        if isinstance(value, str):
            return {"stringValue": value}
        return {"arrayValue": {"values": []}}

    keys = ["gen_ai.usage.input_tokens", "gen_ai.request.model", "session.id"]
    span = {
        "traceId": ids[0] if ids[0] else "5b8efff798038103d269b633813fc60c",
        "spanId": ids[1] if ids[1] else "eee19b7ec3c1b174",
        "name": name,
        "startTimeUnixNano": "1763805600000000000",
        "attributes": [
            {"key": key, "value": any_value(value)}
            for key, value in [*attributes, *zip(keys, [10**13, "m", session], strict=True)]
        ],
    }
    body = dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})
    send(client, "POST", "/v1/traces", body if depth < 50 else nest(depth, body))


@FUZZ
@given(
    candidate=st.fixed_dictionaries(
        {"content": values, "type": st.sampled_from(["user", "feedback"]) | text},
        optional={
            "scope": values,
            "session_id": values,
            "importance": values,
            "tags": values,
            "ttl_days": values,
        },
    ),
    depth=depths,
)
def test_memory_candidates_never_5xx(client: Client, candidate: dict[str, Any], depth: int) -> None:
    body = dumps(candidate)
    if depth > 20:
        body = body[:-1] + ', "x": ' + nest(depth, "0") + "}"
    send(client, "POST", "/api/v1/memory/candidates", body)


@FUZZ
@given(q=text, scope=text, k=text | numbers.map(str), feedback=values)
def test_memory_search_and_feedback_never_5xx(
    client: Client, q: str, scope: str, k: str, feedback: Any
) -> None:
    query = urlencode({"q": q, "scope": scope, "k": k}, encoding="utf-8", errors="surrogatepass")
    send(client, "GET", f"/api/v1/memory/search?{query}")
    send(
        client,
        "GET",
        f"/api/v1/memory/MEMORY.md?{urlencode({'scope': scope}, errors='surrogatepass')}",
    )
    body = {"memory_id": feedback, "useful": True, "retrieval_id": feedback}
    send(client, "POST", "/api/v1/memory/feedback", dumps(body))
