"""`Idempotency-Key` on POST /api/v1/events (docs/api.md, "Idempotency"): a batch retried under its
key is ingested once and answered as the first time, even when both arrive at once; another body
under the key is 422; only a 200 is kept."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.signals import request_started
from django.db import connection
from django.test import Client

from costboard.api.openapi import openapi_document
from costboard.ingest import idempotency
from costboard.ingest.idempotency import _claim as claim_key
from costboard.models import IdempotentRequest, IngestTally, Session, Step, Turn
from tests.conftest import Agent, make_agent, run_in_threads
from tests.waiting import blocked_on_a_lock, wait_until

pytestmark = pytest.mark.django_db


def step(**fields: Any) -> dict[str, Any]:
    """A step without event_id: only the batch's key can make it idempotent."""
    return {
        "session_id": "s1",
        "step_type": "response",
        "model": "m",
        "input_tokens": 100,
        **fields,
    }


def with_key(agent: Agent, payload: Any, key: str, client: Client | None = None) -> Any:
    return (client or agent.client).post(
        "/api/v1/events",
        json.dumps(payload),
        content_type="application/json",
        headers={"Authorization": f"Bearer {agent.key}", "Idempotency-Key": key},
    )


def input_tokens(agent: Agent, session_id: str = "s1") -> int:
    return Session.objects.get(project=agent.project, external_id=session_id).input_tokens


def test_without_a_key_a_retried_batch_without_event_ids_counts_twice(agent: Agent) -> None:
    """The issue's report, kept as the reason for the header."""
    agent.events(step())
    agent.events(step())
    assert input_tokens(agent) == 200


def test_a_replay_naming_another_turn_makes_no_turn(agent: Agent) -> None:
    """A replay changes nothing: one that names a turn not seen yet (a step's or a turn
    event's event_id sent again under another turn number) leaves no empty turn behind."""
    said = {"type": "turn", "session_id": "s1", "event_id": "t1", "user_message": "hi"}
    agent.events(step(event_id="e1", turn=1), {**said, "turn": 1})
    replay = agent.events(
        step(event_id="e1", turn=2), {**said, "turn": 3}, step(event_id="e2", turn=4)
    )
    assert (replay["accepted"], replay["duplicates"]) == (1, 2)
    assert (replay["sessions"]["s1"]["turns"], replay["sessions"]["s1"]["steps"]) == (2, 2)
    turns = Turn.objects.filter(project=agent.project).order_by("number")
    assert [(t.number, t.step_count, t.input_tokens) for t in turns] == [(1, 1, 100), (4, 1, 100)]
    session = Session.objects.get(project=agent.project, external_id="s1")
    assert (session.turn_count, session.step_count, session.input_tokens) == (2, 2, 200)
    assert agent.budget("s1").json()["turns"] == 2


def test_the_same_key_and_body_get_the_stored_answer_and_count_once(agent: Agent) -> None:
    batch = {"events": [step(), step(output_tokens=7)]}
    first = with_key(agent, batch, "batch-1")
    again = with_key(agent, batch, "batch-1")

    assert first.status_code == again.status_code == 200
    assert "Idempotent-Replayed" not in first
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert first.json()["accepted"] == 2
    assert input_tokens(agent) == 200  # 100 + 100 of the one batch, not 400
    assert Step.objects.count() == 2
    tally = IngestTally.objects.get(project=agent.project)
    assert (tally.accepted, tally.duplicates, tally.refused) == (2, 0, 0)  # the replay: none
    stored = IdempotentRequest.objects.get()
    assert (stored.key, stored.status_code, stored.response) == ("batch-1", 200, first.json())


def test_the_stored_answer_is_the_first_one_even_after_the_session_moved_on(
    agent: Agent,
) -> None:
    first = with_key(agent, step(), "k1")
    agent.events(step(input_tokens=50))
    replay = with_key(agent, step(), "k1")
    assert replay.json() == first.json()
    assert replay.json()["sessions"]["s1"]["tokens_used"] == 100
    assert input_tokens(agent) == 150


@pytest.mark.parametrize("first_minimal", [False, True])
def test_a_replay_says_whether_its_stored_answer_is_minimal_whatever_it_prefers(
    agent: Agent, first_minimal: bool
) -> None:
    # the replay's Preference-Applied followed its own Prefer, not the body it carried: a full
    # answer said return=minimal, a minimal one (with sessions_ok) said nothing
    batch = {"events": [step()]}
    minimal = {"Prefer": "return=minimal"}
    headers = {"Authorization": f"Bearer {agent.key}", "Idempotency-Key": "batch-p"}
    first = agent.client.post(
        "/api/v1/events",
        json.dumps(batch),
        content_type="application/json",
        headers={**headers, **(minimal if first_minimal else {})},
    )
    again = agent.client.post(
        "/api/v1/events",
        json.dumps(batch),
        content_type="application/json",
        headers={**headers, **({} if first_minimal else minimal)},
    )
    assert first.status_code == again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert ("sessions_ok" in again.json()) is first_minimal
    applied = "return=minimal" if first_minimal else None
    assert first.get("Preference-Applied") == again.get("Preference-Applied") == applied


def test_the_same_key_with_another_body_is_422_naming_the_header(agent: Agent) -> None:
    assert with_key(agent, step(), "k1").status_code == 200
    other = with_key(agent, step(input_tokens=999), "k1")

    assert other.status_code == 422
    (error,) = other.json()["errors"]
    assert error["field"] == "Idempotency-Key"
    assert "another body" in error["message"] and "new key" in error["message"]
    assert input_tokens(agent) == 100
    assert IngestTally.objects.get(project=agent.project).refused == 1


def test_a_refused_batch_keeps_nothing_so_the_corrected_one_may_use_the_key(
    agent: Agent,
) -> None:
    refused = with_key(agent, {"events": [step(), step(input_tokens=-1)]}, "k1")
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["field"] == "input_tokens"
    assert not IdempotentRequest.objects.exists()
    assert not Step.objects.exists()

    corrected = with_key(agent, {"events": [step(), step(input_tokens=1)]}, "k1")
    assert corrected.status_code == 200
    assert "Idempotent-Replayed" not in corrected
    assert input_tokens(agent) == 101


@pytest.mark.parametrize(
    "key", ["", " ", "has space", "x" * 256, "caf\u00e9", "tab\there", "nul\x00"]
)
def test_a_malformed_key_is_422_naming_the_header(agent: Agent, key: str) -> None:
    response = with_key(agent, step(), key)
    assert response.status_code == 422, response.content
    (error,) = response.json()["errors"]
    assert error["field"] == "Idempotency-Key"
    assert "1 to 255 printable ASCII" in error["message"]
    assert not Step.objects.exists()


def test_keys_of_255_printable_characters_are_taken(agent: Agent) -> None:
    key = "".join(chr(33 + i % 94) for i in range(255))
    assert with_key(agent, step(), key).status_code == 200
    assert with_key(agent, step(), key)["Idempotent-Replayed"] == "true"


def test_a_key_belongs_to_its_project(agent: Agent) -> None:
    other = make_agent("other")
    assert with_key(agent, step(), "shared-name").status_code == 200
    answer = with_key(other, step(), "shared-name")
    assert answer.status_code == 200 and "Idempotent-Replayed" not in answer
    assert input_tokens(agent) == input_tokens(other) == 100


def waiting_on_a_claim() -> int:
    """Sessions of this PostgreSQL database blocked in _claim's INSERT (on another's row)."""
    return blocked_on_a_lock("%ON CONFLICT (project_id, key) DO NOTHING%")


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_with_one_key_ingest_once_and_answer_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first to claim the key holds its claim uncommitted until the other three requests
    are under way behind it, whatever the machine's speed: on PostgreSQL, blocked on its row."""
    agent = make_agent("busy")
    batch = {"events": [step(turn=1 + i % 5) for i in range(300)]}
    answers: dict[int, Any] = {}
    started: list[str] = []  # the requests under way
    claims: list[bool] = []  # each claim's outcome: True for the one that took the key

    def on_request_started(**kwargs: Any) -> None:
        started.append(kwargs["environ"]["PATH_INFO"])

    def claim(*args: Any) -> int | None:
        claimed = claim_key(*args)
        claims.append(claimed is not None)
        if claimed is not None and connection.vendor == "postgresql":
            wait_until(lambda: waiting_on_a_claim() == 3, what="the other three blocked on it")
        elif claimed is not None:  # SQLite holds writers at BEGIN IMMEDIATE, where none shows
            wait_until(lambda: len(started) == 4, what="the other three requests under way")
        return claimed

    monkeypatch.setattr(idempotency, "_claim", claim)
    request_started.connect(on_request_started)

    def send(thread: int) -> None:
        answers[thread] = with_key(agent, batch, "same-batch", client=Client())

    try:
        assert run_in_threads(4, send) == []
    finally:
        request_started.disconnect(on_request_started)
    assert started == ["/api/v1/events"] * 4
    assert sorted(claims) == [False, False, False, True]  # one took the key, three met it

    assert [answers[t].status_code for t in range(4)] == [200] * 4
    bodies = [answers[t].json() for t in range(4)]
    assert all(body == bodies[0] for body in bodies)
    assert bodies[0]["accepted"] == 300
    replayed = sorted(answers[t].get("Idempotent-Replayed", "no") for t in range(4))
    assert replayed == ["no", "true", "true", "true"]  # one ingested, three replayed
    assert input_tokens(agent) == 300 * 100
    assert Step.objects.filter(project=agent.project).count() == 300
    assert IngestTally.objects.get(project=agent.project).accepted == 300


def test_the_document_describes_the_header_and_the_replay() -> None:
    operation = openapi_document()["paths"]["/api/v1/events"]["post"]
    (header,) = [p for p in operation["parameters"] if p["name"] == "Idempotency-Key"]
    assert (header["in"], header["required"]) == ("header", False)
    assert header["schema"]["maxLength"] == 255
    assert "Idempotent-Replayed" in operation["responses"]["200"]["headers"]
    assert operation["responses"]["429"]["headers"]["Retry-After"]["schema"]["minimum"] == 1
