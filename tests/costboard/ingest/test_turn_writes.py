"""A batch writes each turn once: the turns it finds are updated, the new ones inserted after
the steps with their final values (ids reserved first, for the steps to carry). Whether a turn
is made and filled in one batch or grows event by event across many, it ends the same."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from costboard.models import Session, Step, Turn
from tests.conftest import Agent, make_agent

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)

# Every column a turn has, but its id and its project's.
TURN_COLUMNS = [
    f.attname
    for f in Turn._meta.concrete_fields
    if f.attname not in ("id", "project_id", "session_id")
]


def events(session: str) -> list[dict[str, Any]]:
    """Two turns of one session: messages, context, a failed step, a retry loop, cache tokens,
    steps out of time order, a tool call; and a loose step."""

    def at(seconds: int) -> str:
        return (T0 + timedelta(seconds=seconds)).isoformat()

    def step(n: int, turn: int | None, seconds: int, **fields: Any) -> dict[str, Any]:
        event = {
            "event_id": f"{session}-{n}",
            "session_id": session,
            "step_type": "response",
            "model": "test-sonnet",
            "input_tokens": 100 + n,
            "output_tokens": 10 * n,
            "timestamp": at(seconds),
            **fields,
        }
        if turn is not None:
            event["turn"] = turn
        return event

    return [
        {
            "type": "turn",
            "session_id": session,
            "turn": 1,
            "user_message": "hi",
            "context": {"page": "home"},
            "timestamp": at(0),
        },
        step(1, 1, 5, cache_read_input_tokens=2000, cache_creation_input_tokens=300),
        step(2, 1, 3, success=False, error="timeout"),  # earlier than the one before
        step(3, 1, 8, step_type="search", model="none"),
        {
            "type": "turn",
            "session_id": session,
            "turn": 1,
            "assistant_response": "hello",
            "timestamp": at(9),
        },
        step(4, 2, 20),
        step(5, 2, 21, input_tokens=104),  # step 4 again, and again: a retry loop
        step(6, 2, 22, input_tokens=104),
        step(7, None, 30),
    ]


def turns_of(agent: Agent, session: str) -> list[dict[str, Any]]:
    rows = Turn.objects.filter(
        session__project=agent.project, session__external_id=session
    ).order_by("number")
    return list(rows.values(*TURN_COLUMNS))


@pytest.mark.django_db
def test_a_turn_made_in_one_batch_ends_as_one_grown_event_by_event(priced: Any) -> None:
    agent = make_agent("turns")
    whole, split = events("whole"), events("split")
    agent.events(*whole)
    for event in split:
        agent.events(event)

    assert turns_of(agent, "whole") == turns_of(agent, "split")
    [one, two] = turns_of(agent, "whole")
    assert (one["user_message"], one["assistant_response"]) == ("hi", "hello")
    assert one["context"] == {"page": "home"}
    assert (one["step_count"], one["error_count"]) == (3, 1)
    assert one["started_at"] == T0 and one["last_active_at"] == T0 + timedelta(seconds=9)
    assert one["context_tokens"] == 101 + 2000 + 300  # the largest prompt: step 1's
    assert (two["step_count"], two["repeat_peak"]) == (3, 3)
    # and each step points at its turn
    for session in ("whole", "split"):
        steps = Step.objects.filter(session__external_id=session, session__project=agent.project)
        assert sorted(
            (s.event_id, s.turn.number if s.turn else None) for s in steps.select_related("turn")
        ) == sorted(
            (f"{session}-{n}", turn)
            for n, turn in [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2), (6, 2), (7, None)]
        )
    for session in ("whole", "split"):
        assert Session.objects.get(project=agent.project, external_id=session).turn_count == 2


@pytest.mark.django_db
def test_new_and_existing_turns_in_one_batch(priced: Any) -> None:
    """A batch that goes on with a turn and opens the next: one updated, one inserted."""
    agent = make_agent("mixed")
    first, *rest = events("mixed")[1:4]  # turn 1's steps
    agent.events(first)
    agent.events(*rest, *events("mixed")[5:7])  # more of turn 1, and turn 2 made
    [one, two] = turns_of(agent, "mixed")
    assert (one["step_count"], two["step_count"]) == (3, 2)
    assert Turn.objects.filter(project=agent.project).count() == 2
    assert Session.objects.get(project=agent.project, external_id="mixed").turn_count == 2
