"""A per-member budget read as a whole (`scope_value` "*", a tag's "key=*") says the same on
every surface: `GET /api/v1/budgets`, `GET /api/v1/budgets/<id>`, /budgets/ and the overview
answer its members' ledgers of the current period summed — tokens and USD, to the last
digit — and its state is the worst of its members' (ok < warning < exhausted); a rolling one
its members' windows summed. Spend is sent through `POST /api/v1/events` alone."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.test import Client

from costboard.budgets.periods import period_bounds, window_bounds
from costboard.models import ApiKey, PeriodBudget, PeriodLedger, Step
from costboard.numbers import usd_text
from tests.conftest import Agent, add_price, usd

pytestmark = pytest.mark.django_db

# rates with six decimals: every step costs a different twelve-decimal amount
INPUT_RATE = Decimal("2.718281")
OUTPUT_RATE = Decimal("11.314159")
# a quarter past an hour, two days back: the tests' clock, turned by hand
# two days ago at 12:15 UTC: the test reads the day's budget an hour later, still that day
# (at the clock's own hour, a run after 23:00 UTC read the next day: 0 tokens)
T0 = datetime.now(UTC).replace(hour=12, minute=15, second=0, microsecond=0) - timedelta(days=2)
HOUR = timedelta(hours=1)

# (input, output) tokens of each member's steps: against a 10,000-token limit (warn at 80 %)
# "big" is exhausted (10,500), "mid" warned (8,410), "small" ok (1,557)
SPEND = {
    "big": [(4_001, 999), (4_203, 1_297)],
    "mid": [(7_001, 1_409)],
    "small": [(1_237, 311), (7, 2)],
}


@pytest.fixture(autouse=True)
def _priced(db: None) -> None:
    add_price("test-odd", input_mtok=INPUT_RATE, output_mtok=OUTPUT_RATE)


def cost(input_tokens: int, output_tokens: int) -> Decimal:
    return usd(input_tokens, INPUT_RATE) + usd(output_tokens, OUTPUT_RATE)


def expected(*members: str) -> tuple[int, Decimal]:
    """The members' tokens and USD, from the rates alone."""
    pairs = [pair for member in members for pair in SPEND[member]]
    return sum(i + o for i, o in pairs), sum((cost(i, o) for i, o in pairs), Decimal(0))


def step(session_id: str, input_tokens: int, output_tokens: int, at: datetime) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "step_type": "response",
        "model": "test-odd",
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "timestamp": at.isoformat(),
    }


def opened(scope: str, member: str) -> dict[str, Any]:
    """The session of `member` (a user, or a customer tag); its own caps far above."""
    who = {"user_id": member} if scope == "user" else {"tags": {"customer": member}}
    return {"type": "session", "session_id": f"s-{member}", "cost_cap_usd": "1000", **who}


def spend(agent: Agent, scope: str, members: list[str], at: datetime) -> None:
    """Each member's steps sent through the API, a batch per member."""
    for member in members:
        agent.events(
            opened(scope, member),
            *[step(f"s-{member}", i, o, at) for i, o in SPEND[member]],
        )


class Admin:
    def __init__(self, agent: Agent) -> None:
        _, self.key = ApiKey.issue(project=agent.project, role="admin")

    def get(self, path: str) -> Any:
        response = Client().get(path, headers={"Authorization": f"Bearer {self.key}"})
        assert response.status_code == 200, response.content
        return response.json()

    def make(self, **fields: Any) -> PeriodBudget:
        response = Client().post(
            "/api/v1/budgets",
            fields,
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.key}"},
        )
        assert response.status_code == 201, response.content
        return PeriodBudget.objects.get(pk=response.json()["id"])

    def listed(self, budget: PeriodBudget) -> dict[str, Any]:
        [entry] = [b for b in self.get("/api/v1/budgets")["budgets"] if b["id"] == budget.pk]
        return dict(entry)

    def read(self, budget: PeriodBudget) -> dict[str, Any]:
        return dict(self.get(f"/api/v1/budgets/{budget.pk}"))


def page_row(staff: Client, budget: PeriodBudget) -> tuple[int, Decimal, str, str]:
    """/budgets/'s row of `budget`: its tokens, USD and state as the page has them, and the
    spend it prints."""
    response = staff.get("/budgets/")
    assert response.status_code == 200
    [row] = [row for row, _ in response.context["rows"] if row.budget.pk == budget.pk]
    html = response.content.decode()
    found = re.search(
        rf'<tr data-budget="{budget.pk}">.*?data-budget-state="(\w+)".*?'
        r"<td class=\"num\" data-budget-spent>([^<]+)<",
        html,
        re.S,
    )
    assert found is not None
    assert found.group(1) == row.state
    return row.tokens_used, row.cost_usd, row.state, found.group(2)


def overview_row(staff: Client, budget: PeriodBudget) -> tuple[int, Decimal, str]:
    response = staff.get("/")
    assert response.status_code == 200
    [row] = [row for row in response.context["budgets"] if row.budget.pk == budget.pk]
    return row.tokens_used, row.cost_usd, row.state


def stepped(**step_filter: Any) -> tuple[int, Decimal]:
    """The tokens and USD of the stored steps matching `step_filter`."""
    rows = list(Step.objects.filter(**step_filter))
    return (
        sum(s.input_tokens + s.output_tokens for s in rows),
        sum((s.cost_usd for s in rows), Decimal(0)),
    )


def agrees(answer: dict[str, Any], tokens: int, cost_usd: Decimal, state: str) -> None:
    assert (answer["tokens_used"], Decimal(answer["cost_usd"]), answer["state"]) == (
        tokens,
        cost_usd,
        state,
    )
    assert answer["member"] is None  # the budget as a whole


@pytest.mark.parametrize(("scope", "value"), [("user", "*"), ("tag", "customer=*")])
def test_a_per_member_budget_answers_its_members_summed_and_its_worst_state(
    agent: Agent, staff: Client, scope: str, value: str
) -> None:
    admin = Admin(agent)
    start = period_bounds("day", "UTC", T0)[0]
    with time_machine.travel(T0, tick=False):
        each = admin.make(
            name="each", scope=scope, scope_value=value, period="day", token_limit=10_000
        )
        # the same spend against a higher limit: "big" only warned, the others ok
        roomy = admin.make(
            name="roomy", scope=scope, scope_value=value, period="day", token_limit=12_000
        )
        spend(agent, scope, ["small"], start - HOUR)  # the day before: not counted now
        spend(agent, scope, ["big", "mid", "small"], T0)

    tokens, cost_usd = expected("big", "mid", "small")
    # the rates' sum is the stored steps' and the members' ledgers', to the last digit
    assert stepped(timestamp__gte=start) == (tokens, cost_usd)
    ledgers = PeriodLedger.objects.filter(budget=each, period_start=start)
    assert {ledger.member: ledger.state for ledger in ledgers} == {
        "big": "exhausted",
        "mid": "warning",
        "small": "ok",
    }
    assert sum((ledger.cost_usd for ledger in ledgers), Decimal(0)) == cost_usd
    assert cost_usd.as_tuple().exponent == -12  # a twelve-decimal amount, not rounded

    with time_machine.travel(T0 + HOUR, tick=False):
        for budget, state in ((each, "exhausted"), (roomy, "warning")):
            listed, read = admin.listed(budget), admin.read(budget)
            agrees(listed, tokens, cost_usd, state)
            agrees(read, tokens, cost_usd, state)
            assert read["period_start"] == start.isoformat()
            # the members listed are what the totals add up
            members = read["members"]
            assert sum(m["tokens_used"] for m in members) == tokens
            assert sum((Decimal(m["cost_usd"]) for m in members), Decimal(0)) == cost_usd
            assert state in {m["state"] for m in members}
            # a per-member budget's forecasts are its members': none for the whole (the pages
            # show none either)
            assert read["forecast_cost_usd"] is None and read["crossing_date"] is None
            # the pages say the same
            assert page_row(staff, budget) == (tokens, cost_usd, state, usd_text(cost_usd))
            assert overview_row(staff, budget) == (tokens, cost_usd, state)
        # "big" crossed each: the budget's crossings are its
        assert admin.read(each)["exhausted_at"] is not None
        assert admin.read(each)["threshold_crossed"] == 0.8
        assert admin.read(roomy)["exhausted_at"] is None
        assert admin.read(roomy)["warned_at"] is not None


def test_a_rolling_per_member_budget_answers_its_members_windows_summed(
    agent: Agent, staff: Client
) -> None:
    admin = Admin(agent)
    with time_machine.travel(T0, tick=False):
        each = admin.make(
            name="each, 24 h",
            scope="user",
            scope_value="*",
            period="rolling",
            window_hours=24,
            token_limit=10_000,
            action="stop",
        )

    def at(moment: datetime) -> tuple[dict[str, Any], dict[str, Any], tuple[Any, ...]]:
        with time_machine.travel(moment, tick=False):
            return admin.listed(each), admin.read(each), page_row(staff, each)

    with time_machine.travel(T0, tick=False):
        spend(agent, "user", ["small"], T0 - 30 * HOUR)  # before the window: not counted
        spend(agent, "user", ["big", "mid", "small"], T0 - HOUR)
    tokens, cost_usd = expected("big", "mid", "small")
    start = window_bounds(24, T0)[0]
    assert stepped(timestamp__gte=start) == (tokens, cost_usd)
    listed, read, page = at(T0)
    agrees(listed, tokens, cost_usd, "exhausted")  # "big" is past the limit in its window
    agrees(read, tokens, cost_usd, "exhausted")
    assert page == (tokens, cost_usd, "exhausted", usd_text(cost_usd))
    assert read["period_start"] == start.isoformat()
    assert sum((Decimal(m["cost_usd"]) for m in read["members"]), Decimal(0)) == cost_usd
    assert read["exhausted_at"] is not None

    # a day on, the window holds only what "mid" spent since: the budget is that, ok
    later = T0 + 26 * HOUR
    with time_machine.travel(later, tick=False):
        agent.events(step("s-mid", 1_001, 3, later))
    listed, read, page = at(later)
    tokens, cost_usd = 1_004, cost(1_001, 3)
    assert stepped(timestamp__gte=window_bounds(24, later)[0]) == (tokens, cost_usd)
    agrees(listed, tokens, cost_usd, "ok")
    agrees(read, tokens, cost_usd, "ok")
    assert page == (tokens, cost_usd, "ok", usd_text(cost_usd))
    assert (read["exhausted_at"], read["warned_at"], read["threshold_crossed"]) == (
        None,
        None,
        None,
    )
