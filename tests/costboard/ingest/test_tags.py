"""Tags (docs/api.md, "Tags"): a flat object of strings on session and step events; a step carries
its session's tags with its own merged over them; OTLP's `costboard.tag.<key>` attributes are tags;
anything else is a 422 naming the field, with nothing of the batch stored."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from costboard.models import Session, Step
from tests.conftest import Agent
from tests.otlp_spans import CHAT, T0, parsed, post_spans, span

pytestmark = pytest.mark.django_db


def step(session_id: str, **fields: Any) -> dict[str, Any]:
    return {"session_id": session_id, "step_type": "x", "model": "test-sonnet", **fields}


def tags_of(event_id: str) -> Any:
    return Step.objects.get(event_id=event_id).tags


def test_a_step_carries_its_sessions_tags_under_its_own(agent: Agent) -> None:
    agent.events(
        {"type": "session", "session_id": "s1", "tags": {"customer": "acme", "env": "prod"}},
        step("s1", event_id="a"),
        step("s1", event_id="b", tags={"feature": "search", "env": "staging"}),
        step("s2", event_id="c"),  # a session without tags
        step("s2", event_id="d", tags={"feature": "chat"}),
    )
    assert tags_of("a") == {"customer": "acme", "env": "prod"}
    assert tags_of("b") == {"customer": "acme", "env": "staging", "feature": "search"}
    assert tags_of("c") is None
    assert tags_of("d") == {"feature": "chat"}
    assert Session.objects.get(external_id="s1").tags == {"customer": "acme", "env": "prod"}
    assert Session.objects.get(external_id="s2").tags == {}

    # a later session event merges key by key; steps already stored keep what they had
    agent.events(
        {"type": "session", "session_id": "s1", "tags": {"env": "canary", "team": "core"}},
        step("s1", event_id="e"),
    )
    assert Session.objects.get(external_id="s1").tags == {
        "customer": "acme",
        "env": "canary",
        "team": "core",
    }
    assert tags_of("e") == {"customer": "acme", "env": "canary", "team": "core"}
    assert tags_of("a") == {"customer": "acme", "env": "prod"}
    # a session event with no tags leaves them
    agent.events({"type": "session", "session_id": "s1", "user_id": "u1"})
    assert Session.objects.get(external_id="s1").tags["team"] == "core"


@pytest.mark.parametrize(
    ("tags", "says"),
    [
        ({"Feature": "search"}, "key 'Feature' must be 1 to 64 of a-z 0-9 _ . -"),
        ({"a" * 65: "x"}, "must be 1 to 64 of a-z 0-9 _ . -"),
        ({"feature": 42}, '"feature" must be a string'),
        ({"feature": {"nested": "x"}}, '"feature" must be a string'),
        ({"feature": "x" * 129}, '"feature" is 129 characters; at most 128'),
        ({f"k{i}": "v" for i in range(21)}, "has 21 keys; at most 20"),
        (["feature", "search"], "must be an object of strings"),
        ("feature=search", "must be an object of strings"),
    ],
)
def test_bad_tags_are_a_422_naming_the_field(agent: Agent, tags: Any, says: str) -> None:
    for event in (
        {"type": "session", "session_id": "s1", "tags": tags},
        step("s1", tags=tags),
    ):
        response = agent.post({"events": [step("ok", event_id="fine"), event]})
        assert response.status_code == 422, response.content
        [error] = response.json()["errors"]
        assert (error["index"], error["field"]) == (1, "tags")
        assert says in error["message"]
    assert not Step.objects.exists() and not Session.objects.exists()  # nothing half-stored


def test_twenty_keys_of_128_characters_are_fine(agent: Agent) -> None:
    tags = {f"key.{i}-x_y": "v" * 128 for i in range(20)}
    agent.events(step("s", event_id="a", tags=tags))
    assert tags_of("a") == tags


def test_otlp_attributes_become_tags(agent: Agent) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "agent", "costboard.tag.env": "prod"})
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    span(tracer, "chat", {**CHAT, "costboard.tag.feature": "search", "costboard.tag.tier": 2})
    span(
        tracer,
        "chat",
        {**CHAT, "gen_ai.conversation.id": "conv-2", "costboard.tag.Bad Key": "x"},
        start=T0 + 10**9,
    )
    provider.shutdown()
    answer = parsed(post_spans(agent, list(memory.get_finished_spans())))
    assert answer.partial_success.rejected_spans == 1
    assert "tags" in answer.partial_success.error_message
    [stored] = Step.objects.all()
    assert stored.tags == {"env": "prod", "feature": "search", "tier": "2"}
