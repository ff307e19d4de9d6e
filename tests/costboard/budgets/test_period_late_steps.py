"""A late batch (steps timed in a period that has ended, sent after it) is answered for the
period the answer is for, as a read of the session is: a past period its steps exhausted stops
nothing now, and the current period, exhausted, stops it though its steps counted toward the
one before (docs/budgets.md, "Stopped by a budget")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.test import Client

from costboard.budgets.period_services import period_budget_create
from costboard.models import ApiKey, PeriodBudget, PeriodLedger
from tests.conftest import Agent, add_price

pytestmark = pytest.mark.django_db

# a day, its last hour and the next day's first minutes (UTC, the budget's timezone)
DAY = (datetime.now(UTC) - timedelta(days=3)).replace(hour=0, minute=0, second=0, microsecond=0)
EVENING, MIDNIGHT = DAY + timedelta(hours=23), DAY + timedelta(days=1)


def session(session_id: str) -> dict[str, Any]:
    return {"type": "session", "session_id": session_id, "token_cap": 10**9, "cost_cap_usd": "100"}


def step(session_id: str, tokens: int, at: datetime) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "step_type": "response",
        "model": "test-sonnet",
        "input_tokens": tokens,
        "timestamp": at.isoformat(),
    }


def at(moment: datetime, agent: Agent, *events: dict[str, Any]) -> dict[str, Any]:
    with time_machine.travel(moment, tick=False):
        return agent.events(*events)["sessions"]


def read(moment: datetime, agent: Agent, session_id: str) -> tuple[str, str | None]:
    with time_machine.travel(moment, tick=False):
        answer = agent.budget(session_id).json()
    return answer["state"], answer["stopped_by"]


@pytest.fixture
def daily(agent: Agent) -> PeriodBudget:
    add_price("test-sonnet", input_mtok=Decimal(1), output_mtok=Decimal(0))  # $1 a million
    with time_machine.travel(DAY, tick=False):
        return period_budget_create(
            project=agent.project,
            fields={"name": "a dollar a day", "period": "day", "cost_limit_usd": "1.00"}
            | {"action": "stop"},
        )


def test_a_late_step_of_an_exhausted_day_past_stops_nothing_the_next_day(
    agent: Agent, daily: PeriodBudget
) -> None:
    evening = at(EVENING, agent, session("s1"), step("s1", 1_000_000, EVENING))
    assert evening["s1"]["stopped_by"] == f"budget:{daily.pk}"

    # five minutes into the next day, the last minute's step of the day before arrives
    late = MIDNIGHT + timedelta(minutes=5)
    answer = at(late, agent, step("s1", 1000, MIDNIGHT - timedelta(minutes=1)))

    assert (answer["s1"]["state"], answer["s1"]["stopped_by"]) == ("ok", None)
    assert read(late, agent, "s1") == ("ok", None)
    # it counted toward the day it was timed in
    ledger = PeriodLedger.objects.get(budget=daily)
    assert (ledger.period_start, ledger.cost_usd) == (DAY, Decimal("1.001"))


def test_a_late_step_of_a_day_past_is_stopped_by_todays_exhausted_budget(
    agent: Agent, daily: PeriodBudget
) -> None:
    today = MIDNIGHT + timedelta(hours=10)
    at(today, agent, session("s1"), step("s1", 1_000_000, today))  # today: exhausted

    later = today + timedelta(minutes=5)
    answer = at(later, agent, session("s2"), step("s2", 1000, EVENING))

    stopped = ("exhausted", f"budget:{daily.pk}")
    assert (answer["s2"]["state"], answer["s2"]["stopped_by"]) == stopped
    assert read(later, agent, "s2") == stopped
    # yesterday's ledger holds its one step, under its limit
    yesterday = PeriodLedger.objects.get(budget=daily, period_start=DAY)
    assert (yesterday.cost_usd, yesterday.state) == (Decimal("0.001"), "ok")


def test_a_step_whose_own_tag_replaces_its_sessions_is_still_stopped_by_the_sessions(
    agent: Agent,
) -> None:
    # team=a is exhausted; s1 is a team=a session whose step says team=b: the step counts
    # toward team=b, and the session, read by its own tags, is held by team=a's budget
    add_price("test-sonnet", input_mtok=Decimal(1), output_mtok=Decimal(0))
    team_a = period_budget_create(
        project=agent.project,
        fields={
            "name": "team a",
            "scope": "tag",
            "scope_value": "team=a",
            "period": "day",
            "cost_limit_usd": "1.00",
            "action": "stop",
        },
    )
    now = datetime.now(UTC)
    agent.events(session("s0") | {"tags": {"team": "a"}}, step("s0", 1_000_000, now))
    answer = agent.events(
        session("s1") | {"tags": {"team": "a"}}, step("s1", 10, now) | {"tags": {"team": "b"}}
    )["sessions"]
    stopped = ("exhausted", f"budget:{team_a.pk}")
    assert (answer["s1"]["state"], answer["s1"]["stopped_by"]) == stopped
    assert read(now, agent, "s1") == stopped


def test_a_batch_across_midnight_is_answered_for_the_period_it_is_sent_in(
    agent: Agent, daily: PeriodBudget
) -> None:
    # at 23:50 a batch exhausts the day, with one step stamped 00:05 the next day (the
    # agent's clock ahead): its budget entry is today's, as the budget's own read says then
    evening = MIDNIGHT - timedelta(minutes=10)
    key = ApiKey.issue(project=agent.project, role="admin")[1]
    with time_machine.travel(evening, tick=False):
        reply = agent.events(
            session("s1"),
            step("s1", 1_000_000, evening - timedelta(minutes=5)),
            step("s1", 1000, MIDNIGHT + timedelta(minutes=5)),
        )
        read = Client().get(
            f"/api/v1/budgets/{daily.pk}", headers={"Authorization": f"Bearer {key}"}
        )
    entry = reply["budgets"][str(daily.pk)]
    assert (entry["period_start"], entry["state"], entry["cost_usd"]) == (
        DAY.isoformat(),
        "exhausted",
        "1.00",
    )
    assert reply["sessions"]["s1"]["stopped_by"] == f"budget:{daily.pk}"
    whole = read.json()
    assert entry == {k: v for k, v in whole.items() if k not in ("events", "members")}
    # tomorrow's step counted toward tomorrow, answered there once the day is tomorrow
    tomorrow = PeriodLedger.objects.get(budget=daily, period_start=MIDNIGHT)
    assert (tomorrow.cost_usd, tomorrow.state) == (Decimal("0.001"), "ok")


def test_a_late_step_that_exhausts_a_day_past_says_it_crossed_that_day(
    agent: Agent, daily: PeriodBudget
) -> None:
    # five minutes into the next day, the day before's last steps arrive and exhaust it: its
    # entry's crossing_date is that day (its exhaustion's), never one after its period
    late = MIDNIGHT + timedelta(minutes=5)
    with time_machine.travel(late, tick=False):
        reply = agent.events(session("s1"), step("s1", 1_000_000, MIDNIGHT - timedelta(minutes=1)))
    entry = reply["budgets"][str(daily.pk)]
    assert (entry["period_start"], entry["state"]) == (DAY.isoformat(), "exhausted")
    assert entry["exhausted_at"] == (MIDNIGHT - timedelta(minutes=1)).isoformat()
    assert entry["crossing_date"] == DAY.date().isoformat()
