"""The sessions a stop-budget holds: `budget_sessions` (a filter over sessions, for lists) says
what `budget_covers` (the rule the API and ingest ask) says of each session, for every scope;
`held_by` names the first budget by id, as the API answers."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from costboard.budgets.holds import (
    budget_sessions,
    held,
    held_by,
    session_held_by,
    session_scope,
    stops_in_force,
)
from costboard.budgets.periods import budget_covers
from costboard.models import PeriodBudget, Session
from tests.conftest import Agent, make_agent

pytestmark = pytest.mark.django_db

SESSIONS = {
    "plain": ("", {}),
    "ann": ("ann", {}),
    "ann-search": ("ann", {"feature": "search"}),
    "bob-search": ("bob", {"feature": "search", "team": "x"}),
    "chat": ("", {"feature": "chat"}),
    "odd-key": ("", {"a__b": "c=d"}),
    "number-like": ("", {"feature": "1"}),
    "digit-key": ("", {"2024": "q1", "0": "z"}),  # a key of digits: a key, not an array index
}
BUDGETS = [
    ("project", ""),
    ("user", "ann"),
    ("user", "nobody"),
    ("tag", "feature=search"),
    ("tag", "feature=1"),
    ("tag", "a__b=c=d"),
    ("tag", "team=y"),
    ("tag", "2024=q1"),
    ("tag", "0=z"),
    ("api_key", "cb_abcdefg"),
]


def made(agent: Agent) -> list[Session]:
    return [
        Session.objects.create(project=agent.project, external_id=sid, user_id=user, tags=tags)
        for sid, (user, tags) in SESSIONS.items()
    ]


def test_budget_sessions_is_budget_covers_as_a_filter(agent: Agent) -> None:
    sessions = made(agent)
    other = make_agent("globex")
    Session.objects.create(project=other.project, external_id="ann", user_id="ann")
    for scope, value in BUDGETS:
        budget = PeriodBudget.objects.create(
            project=agent.project, name=scope, scope=scope, scope_value=value, token_limit=1
        )
        expected = sorted(
            s.external_id for s in sessions if budget_covers(budget, session_scope(s))
        )
        found = sorted(
            Session.objects.filter(budget_sessions(budget)).values_list("external_id", flat=True)
        )
        assert found == expected, (scope, value)
    assert sorted(
        Session.objects.filter(
            budget_sessions(PeriodBudget.objects.get(scope="tag", scope_value="feature=search"))
        ).values_list("external_id", flat=True)
    ) == ["ann-search", "bob-search"]


def test_held_by_names_the_first_budget_by_id(agent: Agent) -> None:
    sessions = made(agent)
    by_user = PeriodBudget.objects.create(
        project=agent.project, name="u", scope="user", scope_value="ann", token_limit=1
    )
    by_tag = PeriodBudget.objects.create(
        project=agent.project, name="t", scope="tag", scope_value="feature=search", token_limit=1
    )
    stops = [by_user, by_tag]
    annotated = dict(
        Session.objects.filter(held(stops))
        .annotate(by=held_by(stops))
        .values_list("external_id", "by")
    )
    assert annotated == {"ann": by_user.pk, "ann-search": by_user.pk, "bob-search": by_tag.pk}
    for s in sessions:
        found = session_held_by(s, stops)
        assert (found.pk if found else None) == annotated.get(s.external_id)


def test_only_exhausted_stop_budgets_are_in_force(agent: Agent) -> None:
    now = datetime.now(UTC)
    stop = PeriodBudget.objects.create(
        project=agent.project, name="stop", token_limit=100, action="stop"
    )
    warn = PeriodBudget.objects.create(
        project=agent.project, name="warn", token_limit=100, action="warn"
    )
    assert stops_in_force(project_ids=[agent.project.pk], now=now) == []
    agent.events(
        {"session_id": "s", "step_type": "x", "model": "m", "input_tokens": 100},
    )
    assert [b.pk for b in stops_in_force(project_ids=[agent.project.pk], now=now)] == [stop.pk]
    assert warn.ledgers.get().state == "exhausted"  # exhausted, but it only warns
    assert stops_in_force(project_ids=[make_agent("globex").project.pk], now=now) == []
    assert agent.budget("s").json()["stopped_by"] == f"budget:{stop.pk}"
