"""Period budgets' warn fractions (issue 34, part 1): `"warn_at": [0.5, 0.8, 0.95]` records a
`threshold` event per fraction crossed, once per budget, member and period under any
concurrency; the first is also the old `soft_warned` and is alerted once, as that; the events
reply's entry says `threshold_crossed`; `warn_at_pct` is still accepted as a list of one;
a list that cannot be stored is refused naming `warn_at` and the fix."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.core import mail
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

from costboard.budgets.period_services import (
    BudgetInputError,
    period_budget_create,
    period_budget_update,
)
from costboard.models import AlertDelivery, ApiKey, BudgetEvent, PeriodBudget, PeriodLedger, Step
from costboard.outbox import outbox_dispatch
from tests.conftest import Agent, add_price, make_agent, run_in_threads, usd

pytestmark = pytest.mark.django_db

RATE = Decimal(3000)  # $0.30 a step of 100 tokens
STEP_TOKENS = 100
STEP_COST = usd(STEP_TOKENS, RATE)
NOW = datetime.now(UTC)
FRACTIONS = ["0.5", "0.8", "0.95"]


def steps(session_id: str, n: int, **fields: Any) -> list[dict[str, Any]]:
    return [
        {
            "session_id": session_id,
            "step_type": "response",
            "model": "test-sonnet",
            "input_tokens": STEP_TOKENS,
            "timestamp": NOW.isoformat(),
            **fields,
        }
        for _ in range(n)
    ]


def budget(agent: Agent, **fields: Any) -> PeriodBudget:
    values = {
        "name": "monthly",
        "cost_limit_usd": Decimal(10),  # 34 steps
        "action": "stop",
        "warn_at": FRACTIONS,
        **fields,
    }
    return PeriodBudget.objects.create(project=agent.project, **values)


def events_of(b: PeriodBudget) -> list[tuple[str, Decimal, Decimal]]:
    """(kind, threshold, cost then) of the budget's events, oldest first."""
    return list(
        BudgetEvent.objects.filter(ledger__budget=b)
        .order_by("at", "id")
        .values_list("kind", "threshold", "cost_usd")
    )


@pytest.fixture(autouse=True)
def _priced(db: None) -> None:
    add_price("test-sonnet", input_mtok=RATE)


def test_each_fraction_is_recorded_once_at_the_step_that_crossed_it(agent: Agent) -> None:
    agent.project.alert_emails = "ops@example.com"
    agent.project.save(update_fields=["alert_emails"])
    b = budget(agent)
    agent.events({"type": "session", "session_id": "s", "cost_cap_usd": "100"})

    first = agent.events(*steps("s", 16))  # $4.80: under half
    entry = first["budgets"][str(b.pk)]
    assert (entry["state"], entry["threshold_crossed"]) == ("ok", None)
    assert entry["warn_at"] == [0.5, 0.8, 0.95] and entry["warn_at_pct"] == 0.5

    second = agent.events(*steps("s", 1))  # $5.10: past 0.5 × $10
    entry = second["budgets"][str(b.pk)]
    assert (entry["state"], entry["threshold_crossed"]) == ("warning", 0.5)
    assert events_of(b) == [
        ("soft_warned", Decimal("0.5"), STEP_COST * 17),
        ("threshold", Decimal("0.5"), STEP_COST * 17),
    ]

    # one batch past 0.8 ($8.00, its 27th step) and 0.95 ($9.50, its 32nd): each at its step
    third = agent.events(*steps("s", 16))  # $9.90
    assert third["budgets"][str(b.pk)]["threshold_crossed"] == 0.95
    assert events_of(b)[2:] == [
        ("threshold", Decimal("0.8"), STEP_COST * 27),
        ("threshold", Decimal("0.95"), STEP_COST * 32),
    ]
    fourth = agent.events(*steps("s", 2))  # $10.50: exhausted, nothing crossed twice
    assert fourth["budgets"][str(b.pk)]["state"] == "exhausted"
    assert fourth["budgets"][str(b.pk)]["threshold_crossed"] == 0.95
    assert fourth["sessions"]["s"]["stopped_by"] == f"budget:{b.pk}"
    assert [kind for kind, *_ in events_of(b)] == [
        "soft_warned",
        "threshold",
        "threshold",
        "threshold",
        "exhausted",
    ]
    detail = BudgetEvent.objects.get(ledger__budget=b, threshold=Decimal("0.8")).detail
    assert (detail["threshold"], detail["warn_at"]) == (0.8, FRACTIONS)

    # alerted once each: the first fraction as soft_warned, the others as threshold
    outbox_dispatch()
    subjects = sorted(message.subject.rpartition(") ")[2] for message in mail.outbox)
    assert subjects == [
        "exhausted its cost cap",
        "passed 50% of its cost cap",
        "passed 80% of its cost cap",
        "passed 95% of its cost cap",
    ]
    delivered = Counter(
        (d.budget_event.kind, d.budget_event.threshold)
        for d in AlertDelivery.objects.select_related("budget_event")
        if d.budget_event is not None
    )
    assert delivered == {
        ("soft_warned", Decimal("0.5")): 1,  # its fraction: one soft_warned per first fraction
        ("threshold", Decimal("0.8")): 1,
        ("threshold", Decimal("0.95")): 1,
        ("exhausted", Decimal(0)): 1,
    }


@pytest.mark.parametrize("action", ["stop", "warn"])
def test_a_fraction_of_1_is_alerted_once_as_the_exhaustion(agent: Agent, action: str) -> None:
    agent.project.alert_emails = "ops@example.com"
    agent.project.save(update_fields=["alert_emails"])
    b = budget(agent, cost_limit_usd=Decimal("0.60"), warn_at=["0.5", "1"], action=action)
    agent.events({"type": "session", "session_id": "s", "cost_cap_usd": "100"})
    agent.events(*steps("s", 2))  # $0.60: past 0.5 and at the limit in one batch
    assert [(kind, threshold) for kind, threshold, _ in events_of(b)] == [
        ("soft_warned", Decimal("0.5")),
        ("threshold", Decimal("0.5")),
        ("threshold", Decimal(1)),  # recorded, as every fraction is
        ("exhausted", Decimal(0)),
    ]
    outbox_dispatch()
    subjects = sorted(message.subject.rpartition(") ")[2] for message in mail.outbox)
    assert subjects == ["exhausted its cost cap", "passed 50% of its cost cap"]


def test_a_per_member_budget_crosses_each_fraction_per_member(agent: Agent) -> None:
    b = budget(agent, scope="user", scope_value="*", cost_limit_usd=Decimal("1.00"))
    agent.events(
        {"type": "session", "session_id": "a", "user_id": "u-a", "cost_cap_usd": "100"},
        {"type": "session", "session_id": "b", "user_id": "u-b", "cost_cap_usd": "100"},
    )
    answer = agent.events(*steps("a", 3), *steps("b", 2))  # u-a $0.90, u-b $0.60
    assert answer["budgets"][f"{b.pk}:u-a"]["threshold_crossed"] == 0.8
    assert answer["budgets"][f"{b.pk}:u-b"]["threshold_crossed"] == 0.5
    crossed = Counter(
        BudgetEvent.objects.filter(ledger__budget=b, kind="threshold").values_list(
            "ledger__member", "threshold"
        )
    )
    assert crossed == {
        ("u-a", Decimal("0.5")): 1,
        ("u-a", Decimal("0.8")): 1,
        ("u-b", Decimal("0.5")): 1,
    }


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_sixteen_concurrent_clients_cross_each_fraction_once() -> None:
    agent = make_agent("race")
    agent.project.alert_emails = "ops@example.com"
    agent.project.save(update_fields=["alert_emails"])
    b = budget(agent, cost_limit_usd=Decimal("12.00"))  # 40 steps; 16 × 2 × 2 = 64 are sent
    answers: list[dict[str, Any]] = []

    def client(i: int) -> None:
        for batch in range(2):
            answers.append(
                Agent(agent.project, agent.key, Client()).events(*steps(f"s{i}-{batch}", 2))
            )

    assert run_in_threads(16, client) == []
    assert len(answers) == 32
    assert Counter((kind, threshold) for kind, threshold, _ in events_of(b)) == {
        ("soft_warned", Decimal("0.5")): 1,
        ("threshold", Decimal("0.5")): 1,
        ("threshold", Decimal("0.8")): 1,
        ("threshold", Decimal("0.95")): 1,
        ("exhausted", Decimal(0)): 1,
    }
    # each at the totals of the step that crossed it: the 20th, 32nd and 38th, whatever order
    costs = {threshold: cost for kind, threshold, cost in events_of(b) if kind == "threshold"}
    assert costs == {
        Decimal("0.5"): STEP_COST * 20,
        Decimal("0.8"): STEP_COST * 32,
        Decimal("0.95"): STEP_COST * 38,
    }
    ledger = PeriodLedger.objects.get(budget=b)
    assert ledger.cost_usd == sum((s.cost_usd for s in Step.objects.all()), Decimal(0))
    assert (ledger.cost_usd, ledger.threshold_crossed) == (STEP_COST * 64, Decimal("0.95"))
    seen = sorted({a["budgets"][str(b.pk)]["threshold_crossed"] or 0 for a in answers})
    assert seen[-1] == 0.95

    outbox_dispatch()
    alerted = Counter(
        (d.budget_event.kind, d.budget_event.threshold)
        for d in AlertDelivery.objects.select_related("budget_event")
        if d.budget_event is not None
    )
    assert alerted == {
        ("soft_warned", Decimal("0.5")): 1,
        ("threshold", Decimal("0.8")): 1,
        ("threshold", Decimal("0.95")): 1,
        ("exhausted", Decimal(0)): 1,
    }
    assert len(mail.outbox) == 4


def admin_call(agent: Agent, method: str, path: str, body: Any = None) -> Any:
    _, key = ApiKey.issue(project=agent.project, role="admin")
    return Client().generic(
        method,
        path,
        "" if body is None else json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


def test_the_api_takes_warn_at_and_the_older_warn_at_pct(agent: Agent) -> None:
    made = admin_call(
        agent,
        "POST",
        "/api/v1/budgets",
        {"name": "tiers", "cost_limit_usd": "10", "warn_at": [0.5, "0.8", 0.95]},
    )
    assert made.status_code == 201, made.content
    body = made.json()
    assert (body["warn_at"], body["warn_at_pct"], body["threshold_crossed"]) == (
        [0.5, 0.8, 0.95],
        0.5,
        None,
    )
    assert PeriodBudget.objects.get(pk=body["id"]).warn_at == FRACTIONS

    older = admin_call(
        agent, "POST", "/api/v1/budgets", {"name": "old", "token_limit": 5, "warn_at_pct": 0.7}
    )
    assert older.status_code == 201, older.content
    assert (older.json()["warn_at"], older.json()["warn_at_pct"]) == ([0.7], 0.7)
    # a PATCH with the older field replaces the list; with the list, the list
    patched = admin_call(agent, "PATCH", f"/api/v1/budgets/{body['id']}", {"warn_at_pct": 0.9})
    assert patched.status_code == 200, patched.content
    assert patched.json()["warn_at"] == [0.9]
    again = admin_call(agent, "PATCH", f"/api/v1/budgets/{body['id']}", {"warn_at": [0.25, 0.75]})
    assert again.json()["warn_at"] == [0.25, 0.75]

    schema = Client().get("/api/v1/openapi.json").json()["components"]["schemas"]
    answer = schema["PeriodBudgetAnswer"]["properties"]
    assert {"warn_at", "threshold_crossed", "window_hours"} <= set(answer)
    assert "warn_at" in schema["BudgetFields"]["properties"]


@pytest.mark.parametrize(
    ("warn_at", "fix"),
    [
        ([], "give 1 to 10 fractions"),
        ([0.8, 0.5], "smallest first"),
        ([0.5, 0.5], "list each fraction once"),
        ([0.5, 1.5], "1.5 is not a fraction from 0.01 to 1"),
        ([0.001], "0.001 is not a fraction from 0.01 to 1"),
        (["0.8555"], "at most 3 decimals"),
        ([0.05 * n for n in range(1, 12)], "at most 10"),
    ],
)
def test_a_list_that_cannot_be_stored_is_refused_naming_the_fix(
    agent: Agent, warn_at: list[Any], fix: str
) -> None:
    refused = admin_call(
        agent, "POST", "/api/v1/budgets", {"name": "x", "token_limit": 5, "warn_at": warn_at}
    )
    assert refused.status_code == 422, refused.content
    [error] = refused.json()["errors"]
    assert error["field"].startswith("warn_at")
    assert fix in error["message"]
    assert not PeriodBudget.objects.exists()


def test_both_forms_at_once_are_refused(agent: Agent) -> None:
    with pytest.raises(BudgetInputError) as refused:
        period_budget_create(
            project=agent.project,
            fields={"name": "x", "token_limit": 5, "warn_at": [0.5], "warn_at_pct": 0.8},
        )
    assert refused.value.field == "warn_at" and "not both" in refused.value.message


def test_a_raised_limit_clears_the_fractions_no_longer_reached(agent: Agent) -> None:
    b = budget(agent, cost_limit_usd=Decimal("1.00"))
    agent.events(*steps("s", 3))  # $0.90: 0.5 and 0.8
    assert PeriodLedger.objects.get(budget=b).threshold_crossed == Decimal("0.8")
    period_budget_update(b, changes={"cost_limit_usd": "1.50"})  # now 0.6: 0.5 alone
    assert PeriodLedger.objects.get(budget=b).threshold_crossed == Decimal("0.5")
    period_budget_update(b, changes={"cost_limit_usd": "0.90"})  # exhausted: 0.95 crossed
    kinds = Counter((k, t) for k, t, _ in events_of(b))
    assert kinds[("threshold", Decimal("0.8"))] == 1  # recorded once in the period
    assert kinds[("threshold", Decimal("0.95"))] == 1
    assert kinds[("exhausted", Decimal(0))] == 1


def test_the_admin_takes_the_fractions_comma_separated(admin_client: Client, agent: Agent) -> None:
    client = admin_client
    form = {
        "project": agent.project.pk,
        "name": "tiers",
        "scope": "project",
        "scope_value": "",
        "period": "month",
        "window_hours": "",
        "timezone": "UTC",
        "token_limit": "1000",
        "cost_limit_usd": "",
        "warn_at": "0.5, 0.8, 0.95",
        "action": "warn",
        "ledgers-TOTAL_FORMS": "0",
        "ledgers-INITIAL_FORMS": "0",
    }
    made = client.post("/admin/costboard/periodbudget/add/", form)
    assert made.status_code == 302, made.content.decode()[:2000]
    assert PeriodBudget.objects.get(name="tiers").warn_at == FRACTIONS
    refused = client.post(
        "/admin/costboard/periodbudget/add/", {**form, "name": "bad", "warn_at": "0.9, 0.5"}
    )
    assert refused.status_code == 200
    assert "smallest first" in refused.content.decode()
    assert not PeriodBudget.objects.filter(name="bad").exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_migration_makes_each_warn_at_pct_a_list_of_one() -> None:
    executor = MigrationExecutor(connection)
    graph = executor.loader.graph
    [ours] = [n for n in graph.nodes if n[1].endswith("_warn_fractions_and_rolling_windows")]
    before = sorted(graph.node_map[ours].parents)
    latest = graph.leaf_nodes()
    executor.migrate([n.key for n in before])
    old = executor.loader.project_state([n.key for n in before]).apps
    project = old.get_model("costboard", "Project").objects.create(name="Old", slug="old")
    old.get_model("costboard", "PeriodBudget").objects.create(
        project=project, name="b", token_limit=5, warn_at_pct=Decimal("0.650")
    )
    executor = MigrationExecutor(connection)
    executor.migrate(latest)
    assert PeriodBudget.objects.get(name="b").warn_at == ["0.65"]


# --- the first fraction moved: each fraction alerted once, as the first's soft_warned --------


def alerts_of(b: PeriodBudget) -> Counter[tuple[str, Decimal]]:
    """(kind, threshold) of the budget's alert deliveries, each counted."""
    return Counter(
        AlertDelivery.objects.filter(budget_event__ledger__budget=b).values_list(
            "budget_event__kind", "budget_event__threshold"
        )
    )


def subjects() -> list[str]:
    return sorted(message.subject.rpartition(") ")[2] for message in mail.outbox)


def test_moving_the_first_fraction_up_warns_once_when_the_new_one_is_crossed(
    agent: Agent,
) -> None:
    agent.project.alert_emails = "ops@example.com"
    agent.project.save(update_fields=["alert_emails"])
    b = budget(agent, warn_at=["0.5"])
    agent.events({"type": "session", "session_id": "s", "cost_cap_usd": "100"})
    agent.events(*steps("s", 17))  # $5.10: past 0.5, warned

    period_budget_update(b, changes={"warn_at": ["0.8"]})  # $5.10 is under 0.8: ok again
    ledger = PeriodLedger.objects.get(budget=b)
    assert (ledger.state, ledger.warned_at, ledger.threshold_crossed) == ("ok", None, None)
    agent.events(*steps("s", 9))  # $7.80: under 0.8
    crossed = agent.events(*steps("s", 1))  # $8.10: past 0.8
    entry = crossed["budgets"][str(b.pk)]
    assert (entry["state"], entry["threshold_crossed"]) == ("warning", 0.8)

    # lowered to the fraction alerted before, then kept at the one alerted now: neither
    # warns again, nor does more spend
    period_budget_update(b, changes={"warn_at": ["0.5"]})
    period_budget_update(b, changes={"warn_at": ["0.8"]})
    agent.events(*steps("s", 2))  # $8.70
    outbox_dispatch()
    assert subjects() == ["passed 50% of its cost cap", "passed 80% of its cost cap"]
    assert alerts_of(b) == {("soft_warned", Decimal("0.5")): 1, ("soft_warned", Decimal("0.8")): 1}
    assert events_of(b) == [
        ("soft_warned", Decimal("0.5"), STEP_COST * 17),
        ("threshold", Decimal("0.5"), STEP_COST * 17),
        ("soft_warned", Decimal("0.8"), STEP_COST * 27),
        ("threshold", Decimal("0.8"), STEP_COST * 27),
    ]


def test_a_first_fraction_moved_past_by_the_spend_warns_once_at_the_edit(agent: Agent) -> None:
    agent.project.alert_emails = "ops@example.com"
    agent.project.save(update_fields=["alert_emails"])
    b = budget(agent, warn_at=["0.8"])
    agent.events({"type": "session", "session_id": "s", "cost_cap_usd": "100"})
    agent.events(*steps("s", 20))  # $6.00: under 0.8
    assert events_of(b) == []

    # moved down below the spend: crossed now, so recorded and alerted at the edit's decision
    period_budget_update(b, changes={"warn_at": ["0.5"]})
    # moved up, the spend still past it: 0.6 is crossed now and was never alerted
    period_budget_update(b, changes={"warn_at": ["0.6"]})
    ledger = PeriodLedger.objects.get(budget=b)
    assert (ledger.state, ledger.threshold_crossed) == ("warning", Decimal("0.6"))
    # moved down while warned, and back up to the fraction alerted: no warning again
    period_budget_update(b, changes={"warn_at": ["0.3"]})
    period_budget_update(b, changes={"warn_at": ["0.6"]})
    agent.events(*steps("s", 1))  # $6.30
    outbox_dispatch()
    assert subjects() == ["passed 50% of its cost cap", "passed 60% of its cost cap"]
    assert alerts_of(b) == {("soft_warned", Decimal("0.5")): 1, ("soft_warned", Decimal("0.6")): 1}
    assert [(kind, threshold) for kind, threshold, _ in events_of(b)] == [
        ("soft_warned", Decimal("0.5")),
        ("threshold", Decimal("0.5")),
        ("soft_warned", Decimal("0.6")),
        ("threshold", Decimal("0.6")),
    ]
    assert {cost for *_, cost in events_of(b)} == {STEP_COST * 20}  # the totals at each edit


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_sixteen_clients_crossing_a_first_fraction_moved_up_warn_once() -> None:
    agent = make_agent("race")
    agent.project.alert_emails = "ops@example.com"
    agent.project.save(update_fields=["alert_emails"])
    b = budget(agent, cost_limit_usd=Decimal("12.00"), warn_at=["0.5"])  # 0.8: the 32nd step
    agent.events({"type": "session", "session_id": "s", "cost_cap_usd": "100"})
    agent.events(*steps("s", 20))  # $6.00: past 0.5
    period_budget_update(b, changes={"warn_at": ["0.8"]})  # under it: ok again

    def client(i: int) -> None:
        Agent(agent.project, agent.key, Client()).events(*steps(f"s{i}", 1))

    assert run_in_threads(16, client) == []  # 36 steps: $10.80, past 0.8 and under $12
    outbox_dispatch()
    assert subjects() == ["passed 50% of its cost cap", "passed 80% of its cost cap"]
    assert alerts_of(b) == {("soft_warned", Decimal("0.5")): 1, ("soft_warned", Decimal("0.8")): 1}
    assert Counter((kind, threshold) for kind, threshold, _ in events_of(b)) == {
        ("soft_warned", Decimal("0.5")): 1,
        ("threshold", Decimal("0.5")): 1,
        ("soft_warned", Decimal("0.8")): 1,
        ("threshold", Decimal("0.8")): 1,
    }
    warned = BudgetEvent.objects.get(ledger__budget=b, kind="soft_warned", threshold="0.8")
    assert warned.cost_usd == STEP_COST * 32  # at the step that crossed, whatever order
    ledger = PeriodLedger.objects.get(budget=b)
    assert (ledger.state, ledger.cost_usd) == ("warning", STEP_COST * 36)
