"""Period budgets decided with the spend (issue 15, part 2): the events response carries each
budget a batch touched; soft_warned and exhausted are recorded once per budget and period,
under concurrency too; a stop-budget exhausted stops the sessions it covers
(`stopped_by: "budget:<id>"`), a warn-budget never does; a new period starts clean; alerts go
out through the outbox; the client names the budget that stopped it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.core import mail
from django.test import Client

from costboard.budgets.period_ledgers import period_forecast_sweep
from costboard.budgets.periods import budget_days, forecast, period_bounds
from costboard.models import ApiKey, BudgetEvent, PeriodBudget, PeriodLedger, Step
from costboard.outbox import outbox_dispatch
from tests.conftest import Agent, add_price, make_agent, run_in_threads, usd

pytestmark = pytest.mark.django_db

# a dear model, so a step costs $0.30 for 100 tokens, far from the sessions' own token caps
RATE = Decimal(3000)
STEP_TOKENS = 100
STEP_COST = usd(STEP_TOKENS, RATE)
NOW = datetime.now(UTC)


def steps(
    session_id: str, n: int, *, at: datetime | None = None, **fields: Any
) -> list[dict[str, Any]]:
    when = (at or NOW).isoformat()
    return [
        {
            "session_id": session_id,
            "step_type": "response",
            "model": "test-sonnet",
            "input_tokens": STEP_TOKENS,
            "timestamp": when,
            **fields,
        }
        for _ in range(n)
    ]


def budget(agent: Agent, **fields: Any) -> PeriodBudget:
    values = {"name": "monthly", "cost_limit_usd": Decimal(5), "action": "stop", **fields}
    return PeriodBudget.objects.create(project=agent.project, **values)


def kinds(b: PeriodBudget) -> list[str]:
    return list(
        BudgetEvent.objects.filter(ledger__budget=b)
        .order_by("at", "id")
        .values_list("kind", flat=True)
    )


@pytest.fixture(autouse=True)
def _priced(db: None) -> None:
    add_price("test-sonnet", input_mtok=RATE)


def test_a_monthly_stop_budget_warns_once_stops_once_and_names_itself(agent: Agent) -> None:
    b = budget(agent)
    first = agent.events(*steps("s1", 10))  # $3.00
    view = first["budgets"][str(b.pk)]
    start, end = period_bounds("month", "UTC", NOW)
    assert view["period_start"] == start.isoformat() and end is not None
    assert view["period_end"] == end.isoformat()
    assert (view["state"], view["cost_usd"], view["tokens_used"]) == ("ok", "3.00", 1_000)
    assert first["sessions"]["s1"]["stopped_by"] is None

    second = agent.events(*steps("s2", 4))  # $4.20: past 80 % of $5 at its 4th step
    assert second["budgets"][str(b.pk)]["state"] == "warning"
    assert second["budgets"][str(b.pk)]["warned_at"] is not None
    assert second["sessions"]["s2"]["state"] == "ok"  # warning a budget stops nothing
    assert kinds(b) == ["soft_warned", "threshold"]  # the first warn fraction: both
    warned = BudgetEvent.objects.get(ledger__budget=b, kind="soft_warned")
    assert (warned.cost_usd, warned.tokens_used) == (STEP_COST * 14, STEP_TOKENS * 14)

    third = agent.events(*steps("s3", 3))  # $5.10: exhausted at its 3rd step
    assert third["budgets"][str(b.pk)]["state"] == "exhausted"
    assert third["sessions"]["s3"]["state"] == "exhausted"
    assert third["sessions"]["s3"]["stopped_by"] == f"budget:{b.pk}"
    assert kinds(b) == ["soft_warned", "threshold", "exhausted"]
    exhausted = BudgetEvent.objects.get(ledger__budget=b, kind="exhausted")
    assert exhausted.cost_usd == STEP_COST * 17 and exhausted.session_id is None

    later = agent.events(*steps("s1", 1))  # the budget holds: every later batch says so
    assert later["sessions"]["s1"]["state"] == "exhausted"
    assert later["sessions"]["s1"]["stopped_by"] == f"budget:{b.pk}"
    assert kinds(b) == ["soft_warned", "threshold", "exhausted"]  # recorded once
    ledger = PeriodLedger.objects.get(budget=b)
    stored = sum((s.cost_usd for s in Step.objects.all()), Decimal(0))
    assert ledger.cost_usd == stored == STEP_COST * 18
    assert ledger.tokens_used == STEP_TOKENS * 18

    # the budget's own read lists its crossings, each once, with its period
    admin_key = ApiKey.issue(project=agent.project, role="admin")[1]
    read_budget = (
        Client()
        .get(f"/api/v1/budgets/{b.pk}", headers={"Authorization": f"Bearer {admin_key}"})
        .json()
    )
    assert [(e["kind"], e["period_start"]) for e in read_budget["events"]] == [
        ("soft_warned", start.isoformat()),
        ("threshold", start.isoformat()),
        ("exhausted", start.isoformat()),
    ]
    assert read_budget["events"][1]["detail"]["threshold"] == 0.8
    assert Decimal(read_budget["events"][2]["cost_usd"]) == STEP_COST * 17
    # the session's own budget read says so too
    read = agent.budget("s1").json()
    assert (read["state"], read["stopped_by"]) == ("exhausted", f"budget:{b.pk}")

    # next month starts clean (the answer is for the month it is given in)
    next_month = end + timedelta(days=2)
    with time_machine.travel(next_month, tick=False):
        fresh = agent.events(*steps("s4", 1, at=next_month))
    assert fresh["budgets"][str(b.pk)]["state"] == "ok"
    assert (
        fresh["budgets"][str(b.pk)]["period_start"]
        == period_bounds("month", "UTC", next_month)[0].isoformat()
    )
    assert fresh["sessions"]["s4"]["stopped_by"] is None
    assert PeriodLedger.objects.filter(budget=b).count() == 2


def test_a_user_budget_stops_that_user_alone(agent: Agent) -> None:
    b = budget(
        agent,
        name="per user",
        scope="user",
        scope_value="ann",
        period="day",
        cost_limit_usd=Decimal("0.60"),
    )
    agent.events(
        {"type": "session", "session_id": "ann-1", "user_id": "ann"},
        {"type": "session", "session_id": "bob-1", "user_id": "bob"},
    )
    answer = agent.events(*steps("ann-1", 2), *steps("bob-1", 5))
    assert answer["budgets"][str(b.pk)]["cost_usd"] == "0.60"  # ann's two steps only
    assert answer["sessions"]["ann-1"]["stopped_by"] == f"budget:{b.pk}"
    assert answer["sessions"]["bob-1"]["stopped_by"] is None
    assert answer["sessions"]["bob-1"]["state"] == "ok"
    # a new session of ann's is stopped at its first step; bob's are not
    opened = agent.events({"type": "session", "session_id": "ann-2", "user_id": "ann"})
    # told at once, before it sends a step: a session event alone hears it too
    assert opened["sessions"]["ann-2"]["stopped_by"] == f"budget:{b.pk}"
    assert agent.events(*steps("ann-2", 1))["sessions"]["ann-2"]["state"] == "exhausted"
    bob_turn = agent.events(
        {"type": "turn", "session_id": "bob-1", "turn": 1, "user_message": "hi"}
    )
    assert bob_turn["sessions"]["bob-1"]["stopped_by"] is None
    assert agent.budget("bob-1").json()["stopped_by"] is None


def test_tag_and_key_budgets_count_what_they_cover(agent: Agent) -> None:
    tag = budget(
        agent,
        name="search",
        scope="tag",
        scope_value="feature=search",
        token_limit=10**9,
        cost_limit_usd=None,
        action="warn",
    )
    _, other_key = ApiKey.issue(project=agent.project)
    other_prefix = other_key[:10]
    key = budget(
        agent,
        name="integration",
        scope="api_key",
        scope_value=other_prefix,
        token_limit=10**9,
        cost_limit_usd=None,
        action="warn",
    )
    answer = agent.events(
        {"type": "session", "session_id": "t", "tags": {"feature": "search"}},
        *steps("t", 2),
        *steps("u", 1, tags={"feature": "search"}),
        *steps("v", 3, tags={"feature": "chat"}),
    )
    assert answer["budgets"][str(tag.pk)]["tokens_used"] == 3 * STEP_TOKENS
    assert str(key.pk) not in answer["budgets"]  # not sent with that key
    sent = (
        Client()
        .post(
            "/api/v1/events",
            {"events": steps("w", 2)},
            content_type="application/json",
            headers={"Authorization": f"Bearer {other_key}"},
        )
        .json()
    )
    assert sent["budgets"][str(key.pk)]["tokens_used"] == 2 * STEP_TOKENS
    assert str(tag.pk) not in sent["budgets"]


def test_a_warn_budget_never_stops(agent: Agent) -> None:
    b = budget(agent, action="warn", cost_limit_usd=Decimal("0.30"))
    answer = agent.events(*steps("s", 3))
    assert answer["budgets"][str(b.pk)]["state"] == "exhausted"
    assert answer["sessions"]["s"]["state"] == "ok"
    assert answer["sessions"]["s"]["stopped_by"] is None
    assert kinds(b) == ["soft_warned", "threshold", "exhausted"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_sixteen_concurrent_clients_cross_once() -> None:
    agent = make_agent("race")
    b = budget(agent, cost_limit_usd=Decimal("12.00"))  # 40 steps; 16 × 4 = 64 are sent
    answers: list[dict[str, Any]] = []

    def client(i: int) -> None:
        for batch in range(2):
            answers.append(
                Agent(agent.project, agent.key, Client()).events(*steps(f"s{i}-{batch}", 2))
            )

    assert run_in_threads(16, client) == []
    assert len(answers) == 32
    assert kinds(b) == ["soft_warned", "threshold", "exhausted"]
    ledger = PeriodLedger.objects.get(budget=b)
    assert ledger.cost_usd == sum((s.cost_usd for s in Step.objects.all()), Decimal(0))
    assert ledger.cost_usd == STEP_COST * 64 and ledger.state == "exhausted"
    crossed = [a for a in answers if a["budgets"][str(b.pk)]["exhausted_at"] is not None]
    assert crossed  # the batches after the crossing say so, each naming the budget
    for answer in crossed:
        for budget_answer in answer["sessions"].values():
            assert budget_answer["stopped_by"] == f"budget:{b.pk}"


def test_the_crossings_are_alerted_through_the_outbox(agent: Agent) -> None:
    agent.project.alert_emails = "ops@example.com"
    agent.project.save(update_fields=["alert_emails"])
    b = budget(agent)
    # the session's own cost cap far above: only the budget's crossings are alerted
    agent.events({"type": "session", "session_id": "s", "cost_cap_usd": "100"}, *steps("s", 17))
    outbox_dispatch()
    subjects = sorted(message.subject for message in mail.outbox)
    who = f"budget 'monthly' (month from {period_bounds('month', 'UTC', NOW)[0].isoformat()})"
    assert subjects == [
        f"[Costboard] acme: {who} exhausted its cost cap",
        f"[Costboard] acme: {who} passed 80% of its cost cap",
    ]
    assert f"Budget:      monthly (id {b.pk}, project)" in mail.outbox[0].body


def test_a_changed_limit_decides_the_current_period_again(agent: Agent) -> None:
    b = budget(agent, cost_limit_usd=Decimal("0.60"))
    assert agent.events(*steps("s", 2))["sessions"]["s"]["stopped_by"] == f"budget:{b.pk}"
    _, admin_key = ApiKey.issue(project=agent.project, role="admin")

    def patch(**changes: Any) -> dict[str, Any]:
        response = Client().patch(
            f"/api/v1/budgets/{b.pk}",
            changes,
            content_type="application/json",
            headers={"Authorization": f"Bearer {admin_key}"},
        )
        assert response.status_code == 200, response.content
        return dict(response.json())

    raised = patch(cost_limit_usd="10.00")
    assert (raised["state"], raised["exhausted_at"], raised["warned_at"]) == ("ok", None, None)
    assert agent.budget("s").json()["stopped_by"] is None  # the session may go on
    lowered = patch(cost_limit_usd="0.50")
    assert lowered["state"] == "exhausted"
    assert agent.budget("s").json()["stopped_by"] == f"budget:{b.pk}"
    # crossed twice in one period, recorded once each
    assert kinds(b) == ["soft_warned", "threshold", "exhausted"]


def test_the_overview_lists_each_budget_in_its_period(agent: Agent, staff: Client) -> None:
    b = budget(agent, cost_limit_usd=Decimal("1.00"))
    quiet = budget(agent, name="per user", scope="user", scope_value="nobody", period="day")
    agent.events(*steps("s", 3))  # $0.90 of $1.00
    html = staff.get("/").content.decode()
    row = html[html.index(f'data-budget="{b.pk}"') :]
    row = row[: row.index("</tr>")]
    assert ">near limit<" in row and "$0.90" in row and ">90%<" in row
    other = html[html.index(f'data-budget="{quiet.pk}"') :]
    other = other[: other.index("</tr>")]
    assert ">ok<" in other and "$0.00" in other


def test_the_forecast_projects_from_the_recent_days_and_alerts_once(agent: Agent) -> None:
    agent.project.alert_emails = "ops@example.com"
    agent.project.save(update_fields=["alert_emails"])
    now = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
    b = budget(agent, cost_limit_usd=Decimal("20.00"), action="warn")
    PeriodBudget.objects.filter(pk=b.pk).update(created_at=now - timedelta(days=20))
    b.refresh_from_db()
    # $0.30, $0.60 … a day over the seven days before the 10th: a rising daily rate
    for n in range(1, 8):
        day = now - timedelta(days=n)
        agent.events(
            {"type": "session", "session_id": f"d{n}", "cost_cap_usd": "100"},
            *steps(f"d{n}", 8 - n, at=day),
        )
    ledger = PeriodLedger.objects.get(budget=b)
    assert ledger.period_end is not None  # a monthly budget's period ends
    spent = ledger.cost_usd
    assert spent == STEP_COST * sum(range(1, 8))  # $8.40
    days = budget_days([b], now)[b.pk]
    assert days[(now - timedelta(days=1)).date()] == STEP_COST * 7
    ahead = forecast(b, spent, start=ledger.period_start, end=ledger.period_end, days=days, now=now)
    assert ahead is not None
    mean = STEP_COST * sum(range(1, 8)) / 7  # $1.20 a day
    left = Decimal((ledger.period_end - now) / timedelta(days=1))  # 20.5 days
    assert ahead.daily_usd == mean.quantize(Decimal("0.000001"))
    assert ahead.cost_usd == (spent + mean * left).quantize(Decimal("0.000001"))
    assert (ahead.low_usd, ahead.high_usd) == (
        (spent + STEP_COST * left).quantize(Decimal("0.000001")),
        (spent + STEP_COST * 7 * left).quantize(Decimal("0.000001")),
    )
    # (20 - 8.40) / 1.20 = 9.67 days after noon on the 10th: the 20th
    assert ahead.crossing_day == datetime(2026, 11, 20, tzinfo=UTC).date()

    with time_machine.travel(now, tick=False):
        assert period_forecast_sweep(now=now) == 1
        assert period_forecast_sweep(now=now) == 0  # once per period
        outbox_dispatch()
    [event] = BudgetEvent.objects.filter(ledger__budget=b, kind="forecast")
    assert event.detail["crossing_date"] == "2026-11-20"
    [message] = [m for m in mail.outbox if "projected" in m.subject]
    assert "is projected to pass its cost cap on 2026-11-20" in message.subject


def test_a_limit_far_out_of_reach_has_no_crossing_day(agent: Agent) -> None:
    b = budget(agent, cost_limit_usd=Decimal(10**9), action="warn")
    now = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
    start, end = period_bounds("month", "UTC", now)
    days = {(now - timedelta(days=1)).date(): Decimal("0.000001")}
    ahead = forecast(b, Decimal("0.01"), start=start, end=end, days=days, now=now)
    assert ahead is not None and ahead.crossing_day is None  # 10^15 days away: never
