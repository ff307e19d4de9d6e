"""Ingest sends each column of a batch as one array (costboard/ingest/sql.py, Dialect.rows):
numbers and plain text as array literals, a column of NULLs as an empty array unnest pads,
the rest in binary. Whatever way a column goes, what is stored is exactly what was sent."""

from __future__ import annotations

from typing import Any

import pytest

from costboard.models import Session, Step, Turn
from tests.conftest import Agent

# Text an array literal must not take as it is: quotes, backslashes, the literal's own
# punctuation, white space inside, NULL spelled out, the empty string, and text beyond ASCII.
AWKWARD = [
    'said "stop"',
    "C:\\tmp\\x",
    "a,b",
    "{braces}",
    "inner  spaces\ttab",
    "NULL",
    "",
    "naïve — 日本語 🙂",
]


def steps_with(values: list[str], prefix: str) -> list[dict[str, Any]]:
    """One failed step per value, each in a session and turn of its own, the value in every
    free-text column the batch carries."""
    return [
        {
            "event_id": f"{prefix}-{n}",
            "session_id": f"{prefix}-s{n}",
            "turn": 1,
            "step_type": "tool_call",
            "model": "none",
            "success": False,
            "error": value,
            "metadata": {"note": value},
            "tags": {"team": value or "none"},
        }
        for n, value in enumerate(values)
    ]


def stored_errors(agent: Agent, prefix: str) -> list[str]:
    steps = Step.objects.filter(project=agent.project, event_id__startswith=f"{prefix}-")
    by_id = {step.event_id: step for step in steps}
    return [by_id[f"{prefix}-{n}"].error for n in range(len(by_id))]


@pytest.mark.django_db
@pytest.mark.parametrize("values", [AWKWARD, ["plain", "text", "only"]], ids=["awkward", "plain"])
def test_text_columns_come_back_exactly(agent: Agent, values: list[str]) -> None:
    answer = agent.events(*steps_with(values, "t"))

    assert answer["accepted"] == len(values)
    assert stored_errors(agent, "t") == values
    for n, value in enumerate(values):
        step = Step.objects.get(project=agent.project, event_id=f"t-{n}")
        assert step.metadata == {"note": value}
        assert step.tags == {"team": value or "none"}
        assert step.success is False
        assert step.step_type == "tool_call"


@pytest.mark.django_db
def test_a_column_of_nulls_beside_set_ones(agent: Agent) -> None:
    """Session events setting a user on some sessions only, and turn text on some turns only:
    the unset ones keep what they had (NULL in that row of the array), the set ones take it."""
    agent.events(*steps_with(["x", "y", "z"], "n"))
    agent.events(
        {"type": "session", "session_id": "n-s1", "user_id": 'u "1"'},
        {"type": "turn", "session_id": "n-s2", "turn": 1, "user_message": "hi\\there"},
        *steps_with(["x2", "y2", "z2"], "m"),
    )
    users = dict(
        Session.objects.filter(project=agent.project, external_id__startswith="n-").values_list(
            "external_id", "user_id"
        )
    )
    assert users == {"n-s0": "", "n-s1": 'u "1"', "n-s2": ""}
    messages = dict(
        Turn.objects.filter(session__external_id__startswith="n-").values_list(
            "session__external_id", "user_message"
        )
    )
    assert messages == {"n-s0": "", "n-s1": "", "n-s2": "hi\\there"}
    # every session of the second batch got its one step, its columns all set or all unset
    for key in ("m-s0", "m-s1", "m-s2", "n-s0", "n-s1", "n-s2"):
        assert Session.objects.get(project=agent.project, external_id=key).step_count == 1
