"""Rolling period budgets (issue 34, part 2): `"period": "rolling"` with `window_hours` holds
the spend of the last N hours — summed from hourly buckets kept by ingest, never from steps —
for any scope, `*` members included; a `stop` budget stops a user past it within the window
and lets them through once the window has moved on, with or without new spend; its crossings
are recorded once per episode and recorded (and alerted) again in a new one. The clock is
turned by hand (time-machine): the window is decided at the batch's time."""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.core import mail
from django.test import Client

from costboard.budgets.period_services import BudgetInputError, period_budget_create
from costboard.budgets.periods import window_bounds
from costboard.models import ApiKey, BudgetEvent, BudgetHour, PeriodBudget, PeriodLedger
from costboard.outbox import outbox_dispatch
from costboard.retention import budget_hours_prune
from tests.conftest import Agent, add_price, usd

pytestmark = pytest.mark.django_db

RATE = Decimal(3000)  # $0.30 a step of 100 tokens
STEP_TOKENS = 100
STEP_COST = usd(STEP_TOKENS, RATE)
# a quarter past an hour, so "an hour later" and "a day later" fall where the tests say
T0 = datetime.now(UTC).replace(minute=15, second=0, microsecond=0) - timedelta(days=2)
HOUR = timedelta(hours=1)


def steps(session_id: str, n: int, at: datetime) -> list[dict[str, Any]]:
    return [
        {
            "session_id": session_id,
            "step_type": "response",
            "model": "test-sonnet",
            "input_tokens": STEP_TOKENS,
            "timestamp": at.isoformat(),
        }
        for _ in range(n)
    ]


def session(session_id: str, user_id: str) -> dict[str, Any]:
    # the session's own cost cap far above: only the budget stops it
    return {"type": "session", "session_id": session_id, "user_id": user_id, "cost_cap_usd": "100"}


def rolling(agent: Agent, **fields: Any) -> PeriodBudget:
    values: dict[str, Any] = {
        "name": "each user, 24 h",
        "scope": "user",
        "scope_value": "*",
        "period": "rolling",
        "window_hours": 24,
        "cost_limit_usd": "0.60",  # two steps
        "action": "stop",
        **fields,
    }
    return period_budget_create(project=agent.project, fields=values, now=T0)


def at(moment: datetime, agent: Agent, *events: dict[str, Any]) -> dict[str, Any]:
    with time_machine.travel(moment, tick=False):
        return agent.events(*events)


def read_at(moment: datetime, agent: Agent, session_id: str) -> dict[str, Any]:
    with time_machine.travel(moment, tick=False):
        response = agent.budget(session_id)
        assert response.status_code == 200, response.content
        return dict(response.json())


def kinds(b: PeriodBudget, member: str) -> list[tuple[str, int]]:
    return list(
        BudgetEvent.objects.filter(ledger__budget=b, ledger__member=member)
        .order_by("at", "id")
        .values_list("kind", "episode")
    )


@pytest.fixture(autouse=True)
def _priced(db: None) -> None:
    add_price("test-sonnet", input_mtok=RATE)


def test_a_user_past_the_window_s_limit_is_stopped_until_the_window_moves_on(
    agent: Agent,
) -> None:
    agent.project.alert_emails = "ops@example.com"
    agent.project.save(update_fields=["alert_emails"])
    b = rolling(agent)
    stop = f"budget:{b.pk}"
    at(T0, agent, session("ann-1", "ann"), session("bob-1", "bob"))

    spent = at(T0, agent, *steps("ann-1", 2, T0), *steps("bob-1", 1, T0))
    ann = spent["budgets"][f"{b.pk}:ann"]
    assert (ann["state"], ann["cost_usd"], ann["period"], ann["window_hours"]) == (
        "exhausted",
        "0.60",
        "rolling",
        24,
    )
    start, end = window_bounds(24, T0)
    assert (ann["period_start"], ann["period_end"]) == (start.isoformat(), end.isoformat())
    assert ann["forecast_cost_usd"] is None
    assert spent["sessions"]["ann-1"]["stopped_by"] == stop
    assert spent["sessions"]["bob-1"]["stopped_by"] is None  # bob is held on his own
    assert spent["budgets"][f"{b.pk}:bob"]["state"] == "ok"

    # within the window: a new session of ann's is stopped before it sends a step, and her
    # one more step (3 h later) still counts in the window
    later = T0 + 3 * HOUR
    opened = at(later, agent, session("ann-2", "ann"))
    assert opened["sessions"]["ann-2"]["stopped_by"] == stop
    more = at(later, agent, *steps("ann-2", 1, later))
    assert more["sessions"]["ann-2"]["stopped_by"] == stop
    assert more["budgets"][str(b.pk)]["cost_usd"] == "0.90"
    assert read_at(T0 + 23 * HOUR, agent, "ann-1")["stopped_by"] == stop

    # a day after her first steps, their hour has left the window: $0.30 left, she goes on
    # — told so with no new spend in between (the session read decides at its own time)
    moved = T0 + 24 * HOUR
    assert read_at(moved, agent, "ann-1")["stopped_by"] is None
    assert read_at(moved, agent, "ann-2")["state"] == "ok"
    again = at(moved, agent, session("ann-3", "ann"))
    assert again["sessions"]["ann-3"]["stopped_by"] is None
    # and once the later step has left it too, her window is empty
    with time_machine.travel(T0 + 27 * HOUR, tick=False):
        admin = ApiKey.issue(project=agent.project, role="admin")[1]
        read = Client().get(f"/api/v1/budgets/{b.pk}", headers={"Authorization": f"Bearer {admin}"})
    members = {m["member"]: m for m in read.json()["members"]}
    assert members == {}

    # the first episode's crossings, each once; ann's ledger back to ok at her next batch,
    # a new episode: crossed again, recorded and alerted again
    assert kinds(b, "ann") == [("soft_warned", 0), ("threshold", 0), ("exhausted", 0)]
    back = at(moved, agent, *steps("ann-3", 1, moved))  # $0.60 in the window: exhausted
    assert back["sessions"]["ann-3"]["stopped_by"] == stop
    ledger = PeriodLedger.objects.get(budget=b, member="ann")
    assert (ledger.episode, ledger.state, ledger.cost_usd) == (1, "exhausted", STEP_COST * 2)
    assert kinds(b, "ann") == [
        ("soft_warned", 0),
        ("threshold", 0),
        ("exhausted", 0),
        ("soft_warned", 1),
        ("threshold", 1),
        ("exhausted", 1),
    ]
    assert kinds(b, "bob") == []
    outbox_dispatch()
    subjects = Counter(message.subject.rpartition(") ")[2] for message in mail.outbox)
    assert subjects == {"passed 80% of its cost cap": 2, "exhausted its cost cap": 2}
    assert all("for 'ann'" in message.subject for message in mail.outbox)


def test_the_window_is_the_sum_of_its_hours(agent: Agent) -> None:
    b = rolling(agent, scope="project", scope_value=None, window_hours=3, cost_limit_usd="100")
    at(T0, agent, *steps("s", 2, T0), *steps("s", 1, T0 - HOUR))
    answer = at(T0, agent, *steps("s", 1, T0 + 20 * timedelta(minutes=1)))
    assert answer["budgets"][str(b.pk)]["tokens_used"] == 4 * STEP_TOKENS
    hours = dict(BudgetHour.objects.filter(budget=b).values_list("hour", "cost_usd"))
    now_hour = T0.replace(minute=0)
    assert hours == {now_hour: STEP_COST * 3, now_hour - HOUR: STEP_COST}
    # a step stamped before the window counts toward nothing
    old = at(T0, agent, *steps("s", 5, T0 - 3 * HOUR))
    assert (old["budgets"][str(b.pk)]["tokens_used"], old["budgets"][str(b.pk)]["cost_usd"]) == (
        4 * STEP_TOKENS,
        "1.20",
    )
    assert BudgetHour.objects.filter(budget=b).count() == 2
    # two hours on, the earlier hour has left the 3-hour window
    later = at(T0 + 2 * HOUR, agent, *steps("s", 1, T0 + 2 * HOUR))
    entry = later["budgets"][str(b.pk)]
    assert (entry["tokens_used"], entry["cost_usd"]) == (4 * STEP_TOKENS, "1.20")
    stored = PeriodLedger.objects.get(budget=b)
    assert (stored.tokens_used, stored.cost_usd) == (4 * STEP_TOKENS, STEP_COST * 4)

    # the retention sweep deletes the hours the window has left
    assert budget_hours_prune(T0 + 2 * HOUR) == 1
    assert budget_hours_prune(T0 + 2 * HOUR) == 0  # safe to run twice
    assert set(BudgetHour.objects.values_list("hour", flat=True)) == {
        now_hour,
        now_hour + 2 * HOUR,
    }


def test_a_rolling_tag_budget_holds_each_value_on_its_own(agent: Agent) -> None:
    b = rolling(agent, scope="tag", scope_value="customer=*", warn_at=[0.5, 0.8])
    tagged = [
        {**step, "tags": {"customer": customer}}
        for customer, n in (("acme", 2), ("globex", 1))
        for step in steps(f"{customer}-1", n, T0)
    ]
    answer = at(T0, agent, *tagged)
    assert answer["budgets"][f"{b.pk}:acme"]["state"] == "exhausted"
    assert answer["budgets"][f"{b.pk}:acme"]["threshold_crossed"] == 0.8
    assert answer["budgets"][f"{b.pk}:globex"]["threshold_crossed"] == 0.5
    assert answer["sessions"]["acme-1"]["stopped_by"] == f"budget:{b.pk}"
    assert answer["sessions"]["globex-1"]["stopped_by"] is None


@pytest.mark.parametrize(
    ("fields", "field", "fix"),
    [
        ({"period": "rolling"}, "window_hours", 'is required for period "rolling"'),
        ({"period": "month", "window_hours": 24}, "window_hours", 'for period "rolling" only'),
    ],
)
def test_a_window_that_cannot_be_stored_is_refused(
    agent: Agent, fields: dict[str, Any], field: str, fix: str
) -> None:
    with pytest.raises(BudgetInputError) as refused:
        period_budget_create(
            project=agent.project, fields={"name": "x", "token_limit": 5, **fields}
        )
    assert (refused.value.field, fix in refused.value.message) == (field, True)


@pytest.mark.parametrize("hours", [0, 721])
def test_the_api_refuses_a_window_out_of_range(agent: Agent, hours: int) -> None:
    _, key = ApiKey.issue(project=agent.project, role="admin")
    refused = Client().post(
        "/api/v1/budgets",
        {"name": "x", "token_limit": 5, "period": "rolling", "window_hours": hours},
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["field"] == "window_hours"
    assert not PeriodBudget.objects.exists()


def test_a_budget_does_not_change_between_rolling_and_a_calendar_period(agent: Agent) -> None:
    b = rolling(agent)
    _, key = ApiKey.issue(project=agent.project, role="admin")

    def patch(body: dict[str, Any]) -> Any:
        return Client().patch(
            f"/api/v1/budgets/{b.pk}",
            body,
            content_type="application/json",
            headers={"Authorization": f"Bearer {key}"},
        )

    refused = patch({"period": "day", "window_hours": None})
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["field"] == "period"
    changed = patch({"window_hours": 48})
    assert changed.status_code == 200, changed.content
    assert changed.json()["window_hours"] == 48


def test_the_budget_page_shows_the_window_and_the_fractions(
    agent: Agent, admin_client: Client
) -> None:
    b = rolling(agent, warn_at=[0.5, 0.8, 0.95])
    page = admin_client.get(f"/budgets/{b.pk}/?project={agent.project.slug}")
    assert page.status_code == 200
    html = page.content.decode()
    assert "in the last 24 hours (rolling)" in html
    assert "warns at 50%, 80%, 95%" in html


def test_the_pages_hold_a_user_s_sessions_while_the_window_holds_the_spend(
    agent: Agent, staff: Client
) -> None:
    b = rolling(agent)
    at(T0, agent, session("ann-1", "ann"), session("bob-1", "bob"))
    at(T0, agent, *steps("ann-1", 2, T0), *steps("bob-1", 1, T0))

    def held_now(moment: datetime) -> list[str]:
        with time_machine.travel(moment, tick=False):
            html = staff.get(f"/budgets/{b.pk}/").content.decode()
        stopped = re.search(r'<section class="card" id="stopped">.*?</section>', html, re.S)
        return re.findall(r'<tr data-session="([^"]+)">', stopped.group(0)) if stopped else []

    assert held_now(T0 + HOUR) == ["ann-1"]
    assert held_now(T0 + 24 * HOUR) == []  # her spend has left the window


def test_the_budget_page_s_period_is_the_window_now(agent: Agent, staff: Client) -> None:
    """A rolling budget has no calendar periods: its page shows the window now, with the
    figures /budgets/ and the API read, never its ledger's epoch ("Jan 1, 1970 onwards") nor
    what its last batch decided once the window has moved past that spend."""
    b = rolling(agent)
    at(T0, agent, session("ann-1", "ann"))
    at(T0, agent, *steps("ann-1", 2, T0))  # $0.60: ann exhausted

    def periods(moment: datetime) -> tuple[list[tuple[str, str, str]], str]:
        with time_machine.travel(moment, tick=False):
            html = staff.get(f"/budgets/{b.pk}/").content.decode()
            listing = staff.get("/budgets/").content.decode()
        rows = re.findall(
            r"<tr data-period=\"[\d-]+\" data-current>\s*<td>([^<]*)<.*?badge (\w+)\".*?"
            r"data-period-spent>([^<]+)<",
            html,
            re.S,
        )
        assert "1970" not in html and "onwards" not in html
        spent = re.search(r'<tr data-budget="\d+">.*?data-budget-spent>([^<]+)<', listing, re.S)
        assert spent is not None
        return [(label.strip(), state, cost) for label, state, cost in rows], spent.group(1)

    assert periods(T0 + HOUR) == ([("the last 24 hours", "exhausted", "$0.60")], "$0.60")
    # a day later her spend has left the window: nothing now, as /budgets/ says
    assert periods(T0 + 25 * HOUR) == ([("the last 24 hours", "ok", "$0.00")], "$0.00")
