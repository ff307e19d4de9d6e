"""A repricing reaches the period budgets (docs/budgets.md, "Repricing"): each ledger, day and
rolling hour that counted a step gets the step's cost difference, so a budget reads what the
spend API reads; its current period is decided again (a crossing recorded once, a state
cleared); an `api_key` budget and a budget made after a step keep what they counted."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from costboard.budgets.period_services import period_budget_create
from costboard.models import (
    ApiKey,
    BudgetDay,
    BudgetEvent,
    BudgetHour,
    ModelPrice,
    PeriodBudget,
    PeriodLedger,
    Step,
    UserDailyRollup,
)
from costboard.pricing.repricing import steps_reprice
from tests.conftest import Agent, add_price, make_agent, run_in_threads, usd

OLD, NEW = Decimal(3), Decimal(5)  # USD per million input tokens, before and after


def step(session_id: str, tokens: int, **fields: Any) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "step_type": "response",
        "model": "test-sonnet",
        "input_tokens": tokens,
        **fields,
    }


def traffic(agent: Agent) -> None:
    agent.events(
        {"type": "session", "session_id": "s1", "user_id": "ann", "tags": {"team": "core"}},
        {"type": "session", "session_id": "s2", "user_id": "bob"},
        step("s1", 1000),
        step("s1", 2500),
        step("s2", 4000),
        step("s2", 700, tags={"team": "core"}),
    )


def budget(agent: Agent, name: str, **fields: Any) -> PeriodBudget:
    values = {"name": name, "cost_limit_usd": "100", **fields}
    return period_budget_create(project=agent.project, fields=values)


def reprice(rate: Decimal) -> None:
    ModelPrice.objects.filter(model="test-sonnet").update(input_mtok=rate)
    assert steps_reprice(models=["test-sonnet"]).steps_changed > 0


def ledgers(of: PeriodBudget) -> dict[str, Decimal]:
    return dict(PeriodLedger.objects.filter(budget=of).values_list("member", "cost_usd"))


def cost(tokens: Iterable[int], rate: Decimal) -> Decimal:
    return sum((usd(n, rate) for n in tokens), Decimal(0))


@pytest.mark.django_db
def test_calendar_budgets_read_the_new_prices_but_a_keys_keeps_what_it_counted(
    agent: Agent,
) -> None:
    add_price("test-sonnet", input_mtok=OLD, output_mtok=Decimal(0))
    prefix = ApiKey.objects.get(project=agent.project).prefix
    project = budget(agent, "all of it")
    users = budget(agent, "each user", scope="user", scope_value="*")
    core = budget(agent, "core, a day", scope="tag", scope_value="team=core", period="day")
    key = budget(agent, "the key", scope="api_key", scope_value=prefix)
    traffic(agent)
    assert ledgers(project) == {"": cost([1000, 2500, 4000, 700], OLD)}

    reprice(NEW)

    assert Step.objects.get(input_tokens=4000).cost_usd == usd(4000, NEW)
    every = cost([1000, 2500, 4000, 700], NEW)
    assert every == Decimal("0.041")  # 8,200 tokens at $5 a million
    assert ledgers(project) == {"": every}
    assert ledgers(users) == {"ann": cost([1000, 2500], NEW), "bob": cost([4000, 700], NEW)}
    # s1's steps carry the session's tag; s2's one tagged step its own
    assert ledgers(core) == {"": cost([1000, 2500, 700], NEW)}
    # the days the forecasts read, the same sums
    days = dict(BudgetDay.objects.filter(budget=users).values_list("member", "cost_usd"))
    assert days == ledgers(users)
    assert BudgetDay.objects.get(budget=core).cost_usd == cost([1000, 2500, 700], NEW)
    # which key sent a step is not kept: the key's budget keeps the cost it counted
    assert ledgers(key) == {"": cost([1000, 2500, 4000, 700], OLD)}


@pytest.mark.django_db
def test_a_rolling_budgets_hours_and_window_read_the_new_prices(agent: Agent) -> None:
    add_price("test-sonnet", input_mtok=OLD, output_mtok=Decimal(0))
    window = budget(
        agent, "each user, a day", scope="user", scope_value="*", period="rolling", window_hours=24
    )
    traffic(agent)
    reprice(NEW)
    ann, bob = cost([1000, 2500], NEW), cost([4000, 700], NEW)
    assert ledgers(window) == {"ann": ann, "bob": bob}
    hours = dict(BudgetHour.objects.filter(budget=window).values_list("member", "cost_usd"))
    assert hours == {"ann": ann, "bob": bob}


@pytest.mark.django_db
def test_a_repricing_that_takes_a_budget_past_its_limit_stops_and_one_back_clears(
    agent: Agent,
) -> None:
    add_price("test-sonnet", input_mtok=Decimal(1), output_mtok=Decimal(0))
    stop = budget(agent, "a dollar", cost_limit_usd="1.00", action="stop", warn_at=["0.9"])
    agent.events(
        {"type": "session", "session_id": "s1", "cost_cap_usd": "100", "token_cap": 10**7},
        step("s1", 600_000),
    )
    assert PeriodLedger.objects.get(budget=stop).state == "ok"

    reprice(Decimal(2))  # $0.60 → $1.20

    ledger = PeriodLedger.objects.get(budget=stop)
    assert (ledger.cost_usd, ledger.state) == (Decimal("1.2"), "exhausted")
    kinds = sorted(BudgetEvent.objects.filter(ledger=ledger).values_list("kind", flat=True))
    assert kinds == ["exhausted", "soft_warned", "threshold"]
    answer = agent.budget("s1").json()
    assert (answer["state"], answer["stopped_by"]) == ("exhausted", f"budget:{stop.pk}")

    reprice(Decimal(1))  # back to $0.60: under the limit again

    ledger.refresh_from_db()
    assert (ledger.cost_usd, ledger.state) == (Decimal("0.6"), "ok")
    assert agent.budget("s1").json()["state"] == "ok"
    # recorded once, whatever was repriced since
    assert BudgetEvent.objects.filter(ledger=ledger, kind="exhausted").count() == 1


@pytest.mark.django_db
def test_a_budget_made_after_a_step_is_not_moved_by_its_repricing(agent: Agent) -> None:
    add_price("test-sonnet", input_mtok=OLD, output_mtok=Decimal(0))
    agent.events(step("s1", 1000))
    later = budget(agent, "from now on")
    assert not PeriodLedger.objects.filter(budget=later).exists()
    agent.events(step("s1", 3000, timestamp=timezone.now().isoformat()))
    assert ledgers(later) == {"": usd(3000, OLD)}

    reprice(NEW)

    assert ledgers(later) == {"": usd(3000, NEW)}
    assert BudgetDay.objects.get(budget=later).cost_usd == usd(3000, NEW)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_repricing_racing_ingest_leaves_every_ledger_the_sum_of_its_steps() -> None:
    # four clients send batches for the users' sessions while a repricing moves the same
    # budgets: taken in one lock order (sessions, then ledgers), nothing deadlocks, and each
    # ledger and day ends up the sum of its steps as they are stored, whichever price a step
    # was given and whether the repricing saw it
    agent = make_agent("racing")
    add_price("test-sonnet", input_mtok=OLD, output_mtok=Decimal(0))
    users = budget(agent, "each user", scope="user", scope_value="*", action="stop")
    project = budget(agent, "all of it", action="stop")
    for n in range(4):
        agent.events(
            {"type": "session", "session_id": f"s{n}", "user_id": f"u{n % 2}"},
            *[step(f"s{n}", 1000 + k) for k in range(20)],
        )

    def work(index: int) -> None:
        if index == 4:
            reprice(NEW)
            return
        client = Agent(agent.project, agent.key, agent.client.__class__())
        for batch in range(5):
            client.events(*[step(f"s{(index + k) % 4}", 100 * batch + k) for k in range(10)])

    assert run_in_threads(5, work) == []

    steps = list(Step.objects.select_related("session"))
    assert len(steps) == 80 + 4 * 5 * 10
    by_user: dict[str, Decimal] = {}
    for each in steps:
        by_user[each.session.user_id] = (
            by_user.get(each.session.user_id, Decimal(0)) + each.cost_usd
        )
    assert ledgers(users) == by_user
    assert ledgers(project) == {"": sum(by_user.values(), Decimal(0))}
    days = dict(BudgetDay.objects.filter(budget=users).values_list("member", "cost_usd"))
    assert days == by_user
    # the repricing reached the steps stored before it began
    assert Step.objects.get(session__external_id="s0", input_tokens=1000).cost_usd == usd(1000, NEW)


@pytest.mark.django_db
def test_what_a_budget_counted_is_known_by_arrival_not_by_timestamp(agent: Agent) -> None:
    # a step stamped ahead of the clock arrives before the budget is made: not counted, so a
    # repricing must not take it off; one stamped before the budget arrives after: counted
    add_price("test-sonnet", input_mtok=OLD, output_mtok=Decimal(0))
    now = timezone.now()
    agent.events(step("s1", 1_000_000, timestamp=(now + timedelta(minutes=30)).isoformat()))
    made = budget(agent, "from now on", period="total")
    agent.events(step("s1", 3000, timestamp=(now - timedelta(minutes=5)).isoformat()))
    assert ledgers(made) == {"": usd(3000, OLD)}

    reprice(NEW)

    assert ledgers(made) == {"": usd(3000, NEW)}


@pytest.mark.django_db
def test_a_repricing_moves_the_user_a_step_arrived_with_not_its_sessions_next(
    agent: Agent,
) -> None:
    """s1's steps arrive as ann's (the spend by user and ann's ledger count them); then s1 is
    given to zed, and a later step is zed's. A repricing moves each step's difference where
    it was counted: ann's figures, not zed's (who would go negative)."""
    add_price("test-sonnet", input_mtok=OLD, output_mtok=Decimal(0))
    users = budget(agent, "each user", scope="user", scope_value="*")
    agent.events(
        {"type": "session", "session_id": "s1", "user_id": "ann"},
        step("s1", 1000),
        step("s1", 2500),
    )
    agent.events({"type": "session", "session_id": "s1", "user_id": "zed"}, step("s1", 400))
    assert list(Step.objects.order_by("pk").values_list("user_id", flat=True)) == [
        "ann",
        "ann",
        "zed",
    ]
    assert ledgers(users) == {"ann": cost([1000, 2500], OLD), "zed": usd(400, OLD)}

    reprice(NEW)

    assert ledgers(users) == {"ann": cost([1000, 2500], NEW), "zed": usd(400, NEW)}
    by_user = dict(
        UserDailyRollup.objects.filter(project=agent.project).values_list("user_id", "cost_usd")
    )
    assert by_user == {"ann": cost([1000, 2500], NEW), "zed": usd(400, NEW)}
    reader = ApiKey.issue(project=agent.project, role="read")[1]
    spend = agent.client.get(
        "/api/v1/spend?group_by=user", headers={"authorization": f"Bearer {reader}"}
    ).json()
    assert {row["user"]: Decimal(row["cost_usd"]) for row in spend["rows"]} == by_user


@pytest.mark.django_db
def test_a_step_stored_before_steps_kept_their_user_is_its_sessions_user_now(
    agent: Agent,
) -> None:
    add_price("test-sonnet", input_mtok=OLD, output_mtok=Decimal(0))
    users = budget(agent, "each user", scope="user", scope_value="*")
    agent.events({"type": "session", "session_id": "s1", "user_id": "ann"}, step("s1", 1000))
    Step.objects.update(user_id=None)  # as migration 0042 left the steps stored before it

    reprice(NEW)

    assert ledgers(users) == {"ann": usd(1000, NEW)}
