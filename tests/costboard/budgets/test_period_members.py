"""Per-member period budgets (issue 30, item 4): `scope_value: "*"` on a user, api_key or
tag ("customer=*") budget holds each user, key or tag value to the limits on its own — a
ledger per member and period, crossings once per member and period, `stopped_by` for that
member's sessions only, the events reply's entry naming the member — and a scope value that
can be known to match nothing is refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.core import mail
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from costboard.budgets.alert_messages import alert_payload
from costboard.budgets.period_ledgers import period_forecast_sweep
from costboard.budgets.periods import members_nearest_limit, period_bounds
from costboard.models import AlertDelivery, ApiKey, BudgetEvent, PeriodBudget, PeriodLedger, Step
from costboard.outbox import outbox_dispatch
from tests.conftest import Agent, add_price, make_agent, run_in_threads, usd

pytestmark = pytest.mark.django_db

RATE = Decimal(3000)  # $0.30 a step of 100 tokens
STEP_TOKENS = 100
STEP_COST = usd(STEP_TOKENS, RATE)
NOW = datetime.now(UTC)


def steps(session_id: str, n: int, *, at: datetime | None = None, **fields: Any) -> list[Any]:
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


def session(session_id: str, **fields: Any) -> dict[str, Any]:
    # the session's own cost cap far above: only the budget stops it
    return {"type": "session", "session_id": session_id, "cost_cap_usd": "100", **fields}


def every(agent: Agent, scope: str, scope_value: str = "*", **fields: Any) -> PeriodBudget:
    values = {
        "name": f"each {scope}",
        "scope": scope,
        "scope_value": scope_value,
        "period": "day",
        "cost_limit_usd": Decimal("0.60"),  # two steps
        "action": "stop",
        **fields,
    }
    return PeriodBudget.objects.create(project=agent.project, **values)


def kinds(b: PeriodBudget, member: str) -> list[str]:
    return list(
        BudgetEvent.objects.filter(ledger__budget=b, ledger__member=member)
        .order_by("at", "id")
        .values_list("kind", flat=True)
    )


def ledgers(b: PeriodBudget) -> dict[str, Decimal]:
    return dict(PeriodLedger.objects.filter(budget=b).values_list("member", "cost_usd"))


def spent(**step_filter: Any) -> Decimal:
    return sum((s.cost_usd for s in Step.objects.filter(**step_filter)), Decimal(0))


def post(key: str, *events: dict[str, Any]) -> dict[str, Any]:
    response = Client().post(
        "/api/v1/events",
        {"events": list(events)},
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 200, response.content
    return dict(response.json())


@pytest.fixture(autouse=True)
def _priced(db: None) -> None:
    add_price("test-sonnet", input_mtok=RATE)


def test_each_user_is_held_to_the_limit_on_their_own(agent: Agent) -> None:
    b = every(agent, "user")
    agent.events(session("a-1", user_id="u-a"), session("b-1", user_id="u-b"))

    first = agent.events(*steps("a-1", 2))  # u-a: $0.60 of $0.60
    entry = first["budgets"][str(b.pk)]
    assert (entry["member"], entry["state"], entry["cost_usd"]) == ("u-a", "exhausted", "0.60")
    assert entry["scope_value"] == "*"
    assert first["sessions"]["a-1"]["stopped_by"] == f"budget:{b.pk}"

    other = agent.events(*steps("b-1", 1))  # u-b: $0.30, its own ledger
    entry = other["budgets"][str(b.pk)]
    assert (entry["member"], entry["state"], entry["cost_usd"]) == ("u-b", "ok", "0.30")
    assert other["sessions"]["b-1"]["stopped_by"] is None
    assert other["sessions"]["b-1"]["state"] == "ok"

    again = agent.events(*steps("a-1", 1))  # u-a's next event: still exhausted, said so
    assert again["sessions"]["a-1"]["state"] == "exhausted"
    assert again["sessions"]["a-1"]["stopped_by"] == f"budget:{b.pk}"
    assert again["budgets"][str(b.pk)]["member"] == "u-a"
    assert agent.budget("a-1").json()["stopped_by"] == f"budget:{b.pk}"
    assert agent.budget("b-1").json()["stopped_by"] is None

    # a new session of u-a's is told at once, before its first step; a new user's is not
    opened = agent.events(session("a-2", user_id="u-a"), session("c-1", user_id="u-c"))
    assert opened["sessions"]["a-2"]["stopped_by"] == f"budget:{b.pk}"
    assert opened["sessions"]["c-1"]["stopped_by"] is None

    # each ledger is its member's steps, to the last digit
    assert ledgers(b) == {
        "u-a": spent(session__user_id="u-a"),
        "u-b": spent(session__user_id="u-b"),
    }
    assert ledgers(b) == {"u-a": STEP_COST * 3, "u-b": STEP_COST}
    # crossed once for u-a, whatever came after; not at all for u-b
    assert kinds(b, "u-a") == ["soft_warned", "threshold", "exhausted"]
    assert kinds(b, "u-b") == []
    exhausted = BudgetEvent.objects.get(ledger__budget=b, kind="exhausted")
    assert exhausted.detail["member"] == "u-a"


def test_a_batch_of_several_members_answers_for_each(agent: Agent) -> None:
    b = every(agent, "user", action="warn")
    agent.events(session("a", user_id="u-a"), session("b", user_id="u-b"), session("n"))
    answer = agent.events(*steps("a", 2), *steps("b", 1), *steps("n", 5))  # n: no user
    assert set(answer["budgets"]) == {f"{b.pk}:u-a", f"{b.pk}:u-b"}
    assert answer["budgets"][f"{b.pk}:u-a"]["member"] == "u-a"
    assert answer["budgets"][f"{b.pk}:u-a"]["state"] == "exhausted"
    assert answer["budgets"][f"{b.pk}:u-b"]["cost_usd"] == "0.30"
    assert answer["sessions"]["a"]["stopped_by"] is None  # a warn budget never stops
    assert ledgers(b) == {"u-a": STEP_COST * 2, "u-b": STEP_COST}


def test_a_member_s_steps_count_in_the_periods_they_fall_in(agent: Agent) -> None:
    b = every(agent, "user", action="warn")
    today = period_bounds("day", "UTC", NOW)[0]
    yesterday = today - timedelta(hours=1)
    agent.events(session("a", user_id="u-a"), session("b", user_id="u-b"))
    agent.events(*steps("a", 1, at=yesterday), *steps("b", 1, at=yesterday), *steps("a", 2))
    counted = {
        (row.member, row.period_start): row.cost_usd
        for row in PeriodLedger.objects.filter(budget=b)
    }
    assert counted == {
        ("u-a", today - timedelta(days=1)): STEP_COST,
        ("u-b", today - timedelta(days=1)): STEP_COST,
        ("u-a", today): STEP_COST * 2,
    }
    assert kinds(b, "u-a") == ["soft_warned", "threshold", "exhausted"]  # today's, at $0.60


def test_an_ordinary_budget_is_unchanged_beside_a_per_member_one(agent: Agent) -> None:
    whole = PeriodBudget.objects.create(
        project=agent.project, name="all", cost_limit_usd=Decimal(100), action="warn"
    )
    one = every(agent, "user", "u-a", action="warn")
    each = every(agent, "user", action="warn")
    agent.events(session("a", user_id="u-a"), session("b", user_id="u-b"))
    answer = agent.events(*steps("a", 1), *steps("b", 2))
    assert answer["budgets"][str(whole.pk)]["member"] is None
    assert answer["budgets"][str(whole.pk)]["cost_usd"] == "0.90"
    assert answer["budgets"][str(one.pk)]["member"] is None
    assert answer["budgets"][str(one.pk)]["cost_usd"] == "0.30"
    assert ledgers(whole) == {"": STEP_COST * 3}
    assert ledgers(one) == {"": STEP_COST}
    assert ledgers(each) == {"u-a": STEP_COST, "u-b": STEP_COST * 2}


def test_members_are_upserted_in_the_statements_every_budget_shares(agent: Agent) -> None:
    users = [session(f"s{n}", user_id=f"u-{n}") for n in range(3)]
    PeriodBudget.objects.create(
        project=agent.project, name="all", cost_limit_usd=Decimal(100), action="warn"
    )
    agent.events(*users, *steps("s0", 1))  # the first batch makes the sessions

    def statements(*events: dict[str, Any]) -> int:
        with CaptureQueriesContext(connection) as queries:
            agent.events(*events)
        return len(queries)

    batch = [step for n in range(3) for step in steps(f"s{n}", 2)]
    alone = statements(*batch)
    each = every(agent, "user", cost_limit_usd=Decimal(100), action="warn")
    assert statements(*batch) == alone  # three members more: no statement more
    assert ledgers(each) == {f"u-{n}": STEP_COST * 2 for n in range(3)}


def test_each_api_key_is_held_to_the_limit_on_its_own(agent: Agent) -> None:
    b = every(agent, "api_key")
    _, second = ApiKey.issue(project=agent.project)
    mine, theirs = agent.key[:10], second[:10]

    first = post(agent.key, *steps("k1", 2))
    assert first["budgets"][str(b.pk)]["member"] == mine
    assert first["sessions"]["k1"]["stopped_by"] == f"budget:{b.pk}"
    other = post(second, *steps("k2", 1))
    assert other["budgets"][str(b.pk)]["member"] == theirs
    assert other["sessions"]["k2"]["stopped_by"] is None

    again = post(agent.key, *steps("k1", 1))
    assert again["sessions"]["k1"]["stopped_by"] == f"budget:{b.pk}"
    asked = Client().get(
        "/api/v1/sessions/k2/budget", headers={"Authorization": f"Bearer {second}"}
    )
    assert asked.json()["stopped_by"] is None  # asked with the key that is not exhausted
    assert agent.budget("k1").json()["stopped_by"] == f"budget:{b.pk}"
    assert ledgers(b) == {mine: STEP_COST * 3, theirs: STEP_COST}
    assert sum(ledgers(b).values()) == spent()
    assert kinds(b, mine) == ["soft_warned", "threshold", "exhausted"]
    assert kinds(b, theirs) == []


def test_each_customer_is_held_to_the_limit_on_its_own(agent: Agent) -> None:
    b = every(agent, "tag", "customer=*")
    agent.events(
        session("acme-1", tags={"customer": "acme"}),
        session("globex-1", tags={"customer": "globex"}),
        session("untagged"),
    )
    first = agent.events(*steps("acme-1", 2), *steps("untagged", 4))
    assert first["budgets"][str(b.pk)]["member"] == "acme"
    assert first["sessions"]["acme-1"]["stopped_by"] == f"budget:{b.pk}"
    assert first["sessions"]["untagged"]["stopped_by"] is None  # not counted

    # a step's own tag counts it for that customer
    other = agent.events(*steps("globex-1", 1), *steps("untagged", 1, tags={"customer": "ini"}))
    assert set(other["budgets"]) == {f"{b.pk}:globex", f"{b.pk}:ini"}
    assert other["sessions"]["globex-1"]["stopped_by"] is None

    again = agent.events(*steps("acme-1", 1), *steps("globex-1", 0))
    assert again["sessions"]["acme-1"]["stopped_by"] == f"budget:{b.pk}"
    assert agent.budget("globex-1").json()["stopped_by"] is None
    assert agent.budget("untagged").json()["stopped_by"] is None
    assert ledgers(b) == {"acme": STEP_COST * 3, "globex": STEP_COST, "ini": STEP_COST}
    assert ledgers(b)["acme"] == spent(session__external_id="acme-1")
    assert kinds(b, "acme") == ["soft_warned", "threshold", "exhausted"]
    assert kinds(b, "globex") == kinds(b, "ini") == []


def test_a_member_s_crossings_are_alerted_naming_it(agent: Agent) -> None:
    agent.project.alert_emails = "ops@example.com"
    agent.project.save(update_fields=["alert_emails"])
    every(agent, "user", name="daily per user")
    agent.events(session("a", user_id="u-a"), *steps("a", 2))
    outbox_dispatch()
    start = period_bounds("day", "UTC", NOW)[0].isoformat()
    who = f"budget 'daily per user' for 'u-a' (day from {start})"
    assert sorted(message.subject for message in mail.outbox) == [
        f"[Costboard] acme: {who} exhausted its cost cap",
        f"[Costboard] acme: {who} passed 80% of its cost cap",
    ]
    delivery = AlertDelivery.objects.get(budget_event__kind="exhausted")
    payload = alert_payload(delivery)
    assert (payload["member"], payload["budget"]["member"]) == ("u-a", "u-a")
    assert payload["detail"]["member"] == "u-a"


def test_the_forecast_is_each_member_s_own(agent: Agent) -> None:
    now = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
    b = every(agent, "user", period="month", cost_limit_usd=Decimal("5.00"), action="warn")
    PeriodBudget.objects.filter(pk=b.pk).update(created_at=now - timedelta(days=20))
    agent.events(session("a", user_id="u-a"), session("b", user_id="u-b"))
    for n in range(1, 4):  # u-a: $0.60 a day, heading past $5 this month; u-b: $0.30 once
        agent.events(*steps("a", 2, at=now - timedelta(days=n)))
    agent.events(*steps("b", 1, at=now - timedelta(days=1)))
    with time_machine.travel(now, tick=False):
        assert period_forecast_sweep(now=now) == 1
        assert period_forecast_sweep(now=now) == 0  # once per member and period
    [event] = BudgetEvent.objects.filter(ledger__budget=b, kind="forecast")
    assert event.ledger is not None and event.ledger.member == "u-a"
    assert event.detail["member"] == "u-a"


def test_members_nearest_their_limit_come_first(agent: Agent) -> None:
    b = every(agent, "user", token_limit=1000, cost_limit_usd=Decimal("1.00"))
    start, end = period_bounds("day", "UTC", NOW)
    spends = {  # member: tokens, cost → the larger fraction
        "by-tokens": (900, Decimal("0.10")),  # 0.9
        "by-cost": (100, Decimal("0.95")),  # 0.95
        "half": (500, Decimal("0.50")),  # 0.5
        "over": (1000, Decimal("0.20")),  # 1.0
        "quiet": (1, Decimal("0.0001")),  # 0.001
    }
    for member, (tokens, cost) in spends.items():
        state = "exhausted" if member == "over" else "ok"
        PeriodLedger.objects.create(
            project=agent.project,
            budget=b,
            member=member,
            period_start=start,
            period_end=end,
            tokens_used=tokens,
            cost_usd=cost,
            state=state,
        )
    PeriodLedger.objects.create(  # yesterday's: another period
        project=agent.project,
        budget=b,
        member="gone",
        period_start=start - timedelta(days=1),
        period_end=start,
        tokens_used=999,
        cost_usd=Decimal("0.99"),
    )
    nearest = members_nearest_limit(b, NOW, limit=4)
    assert [m.member for m in nearest] == ["over", "by-cost", "by-tokens", "half"]
    assert [m.fraction for m in nearest] == [
        Decimal("1.0000"),
        Decimal("0.9500"),
        Decimal("0.9000"),
        Decimal("0.5000"),
    ]
    top = nearest[0]
    assert (top.tokens_used, top.token_limit, top.cost_usd, top.cost_limit_usd, top.state) == (
        1000,
        1000,
        Decimal("0.20"),
        Decimal("1.00"),
        "exhausted",
    )
    assert [m.member for m in members_nearest_limit(b, NOW)][-1] == "quiet"
    # one limit alone orders by it
    PeriodBudget.objects.filter(pk=b.pk).update(token_limit=None)
    b.refresh_from_db()
    assert [m.member for m in members_nearest_limit(b, NOW, limit=3)] == [
        "by-cost",
        "half",
        "over",
    ]


def test_members_nearest_limit_from_real_spend(agent: Agent) -> None:
    b = every(agent, "user", cost_limit_usd=Decimal("1.20"), action="warn")
    agent.events(
        session("a", user_id="u-a"),
        session("b", user_id="u-b"),
        session("c", user_id="u-c"),
        *steps("a", 1),
        *steps("b", 3),
        *steps("c", 2),
    )
    nearest = members_nearest_limit(b, NOW)
    assert [(m.member, m.cost_usd, m.fraction, m.state) for m in nearest] == [
        ("u-b", STEP_COST * 3, Decimal("0.7500"), "ok"),
        ("u-c", STEP_COST * 2, Decimal("0.5000"), "ok"),
        ("u-a", STEP_COST, Decimal("0.2500"), "ok"),
    ]


class TestScopeValues:
    @pytest.fixture
    def admin_key(self, agent: Agent) -> str:
        return ApiKey.issue(project=agent.project, role="admin")[1]

    def make(self, admin_key: str, **fields: Any) -> Any:
        body = {"name": "each", "cost_limit_usd": "1.00", **fields}
        return Client().post(
            "/api/v1/budgets",
            body,
            content_type="application/json",
            headers={"Authorization": f"Bearer {admin_key}"},
        )

    @pytest.mark.parametrize(
        ("scope", "value"), [("user", "*"), ("api_key", "*"), ("tag", "customer=*")]
    )
    def test_a_star_makes_a_per_member_budget(self, admin_key: str, scope: str, value: str) -> None:
        made = self.make(admin_key, scope=scope, scope_value=value)
        assert made.status_code == 201, made.content
        assert (made.json()["scope_value"], made.json()["member"]) == (value, None)

    def test_an_unknown_key_prefix_is_refused_naming_the_fix(
        self, admin_key: str, agent: Agent
    ) -> None:
        refused = self.make(admin_key, scope="api_key", scope_value="cb_nothere")
        assert refused.status_code == 422
        [error] = refused.json()["errors"]
        assert error["field"] == "scope_value"
        assert "no key of project acme has the prefix 'cb_nothere'" in error["message"]
        assert '"*" for each key on its own' in error["message"]
        assert not PeriodBudget.objects.exists()

    @pytest.mark.parametrize("value", ["customer", "*", "=*", "Customer=*"])
    def test_a_tag_scope_without_a_key_is_refused(self, admin_key: str, value: str) -> None:
        refused = self.make(admin_key, scope="tag", scope_value=value)
        assert refused.status_code == 422
        [error] = refused.json()["errors"]
        assert error["field"] == "scope_value"
        assert '"customer=*"' in error["message"]
        assert not PeriodBudget.objects.exists()

    def test_a_budget_stays_per_member_or_not(self, admin_key: str, agent: Agent) -> None:
        b = every(agent, "user")
        refused = Client().patch(
            f"/api/v1/budgets/{b.pk}",
            {"scope_value": "u-a"},
            content_type="application/json",
            headers={"Authorization": f"Bearer {admin_key}"},
        )
        assert refused.status_code == 422
        assert refused.json()["errors"][0]["field"] == "scope_value"
        b.refresh_from_db()
        assert b.scope_value == "*"

    def test_a_lowered_limit_decides_each_member_again(self, admin_key: str, agent: Agent) -> None:
        b = every(agent, "user", cost_limit_usd=Decimal("10.00"))
        agent.events(
            session("a", user_id="u-a"), session("b", user_id="u-b"), *steps("a", 2), *steps("b", 1)
        )
        changed = Client().patch(
            f"/api/v1/budgets/{b.pk}",
            {"cost_limit_usd": "0.50"},
            content_type="application/json",
            headers={"Authorization": f"Bearer {admin_key}"},
        )
        assert changed.status_code == 200, changed.content
        assert kinds(b, "u-a") == ["soft_warned", "threshold", "exhausted"]
        assert kinds(b, "u-b") == []  # $0.30 < 0.8 × $0.50
        assert agent.budget("a").json()["stopped_by"] == f"budget:{b.pk}"
        assert agent.budget("b").json()["stopped_by"] is None
        detail = Client().get(
            f"/api/v1/budgets/{b.pk}", headers={"Authorization": f"Bearer {admin_key}"}
        )
        assert {e["member"] for e in detail.json()["events"]} == {"u-a"}
        assert detail.json()["members"] == [
            {
                "member": "u-a",
                "state": "exhausted",
                "tokens_used": 2 * STEP_TOKENS,
                "cost_usd": "0.60",
                "used": 1.2,
            },
            {
                "member": "u-b",
                "state": "ok",
                "tokens_used": STEP_TOKENS,
                "cost_usd": "0.30",
                "used": 0.6,
            },
        ]

    def test_an_ordinary_budget_lists_no_members(self, admin_key: str, agent: Agent) -> None:
        b = every(agent, "user", "u-a")
        detail = Client().get(
            f"/api/v1/budgets/{b.pk}", headers={"Authorization": f"Bearer {admin_key}"}
        )
        assert detail.json()["members"] is None


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_batches_of_one_member_at_once_lose_no_count() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("row locks under concurrent writers: PostgreSQL's (SQLite has one writer)")
    agent = make_agent("race")
    b = every(agent, "user", cost_limit_usd=Decimal("3.00"))  # 10 steps; 2 × 4 × 2 sent
    Agent(agent.project, agent.key, Client()).events(
        session("a-0", user_id="u-a"), session("a-1", user_id="u-a")
    )

    def client(i: int) -> None:
        for _ in range(4):
            Agent(agent.project, agent.key, Client()).events(*steps(f"a-{i}", 2))

    assert run_in_threads(2, client) == []
    ledger = PeriodLedger.objects.get(budget=b)
    assert ledger.member == "u-a" and ledger.tokens_used == 16 * STEP_TOKENS
    assert ledger.cost_usd == spent() == STEP_COST * 16
    assert kinds(b, "u-a") == ["soft_warned", "threshold", "exhausted"]


def test_the_admin_keeps_a_budget_per_member_or_not(admin_client: Client, agent: Agent) -> None:
    b = every(agent, "tag", "customer=*", token_limit=1000, cost_limit_usd=None)
    form = {
        "project": agent.project.pk,
        "name": "each customer",
        "scope": "tag",
        "scope_value": "customer=acme",
        "period": "day",
        "timezone": "UTC",
        "token_limit": "1000",
        "cost_limit_usd": "",
        "warn_at_pct": "0.8",
        "action": "stop",
        "ledgers-TOTAL_FORMS": "0",
        "ledgers-INITIAL_FORMS": "0",
    }
    url = f"/admin/costboard/periodbudget/{b.pk}/change/"
    refused = admin_client.post(url, form)
    assert refused.status_code == 200
    assert "cannot change between" in refused.content.decode()
    # nor to another tag: its members' spend is their customers'
    other = admin_client.post(url, {**form, "scope_value": "plan=*"})
    assert other.status_code == 200
    assert "the spend counted so far is its scope&#x27;s" in other.content.decode()
    kept = admin_client.post(url, {**form, "scope_value": "customer=*", "token_limit": "2000"})
    assert kept.status_code == 302, kept.content.decode()[:2000]
    b.refresh_from_db()
    assert (b.scope_value, b.token_limit) == ("customer=*", 2000)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a column collation: PostgreSQL's")
def test_ledgers_are_locked_in_ingests_order_whatever_the_databases_collation(
    agent: Agent,
) -> None:
    # ingest's upsert locks a batch's ledgers in Python's order of their members; the locks
    # taken in SQL (a limit's recheck, a repricing) must follow it, or the two deadlock. Here
    # the members' column collates as en_US does, which orders them otherwise than Python
    from costboard.budgets.period_ledgers import LEDGER_ORDER

    with connection.cursor() as cursor:
        cursor.execute(
            f"ALTER TABLE {PeriodLedger._meta.db_table} ALTER COLUMN member "
            'TYPE varchar(128) COLLATE "en-US-x-icu"'
        )
    b = PeriodBudget.objects.create(
        project=agent.project, name="each", scope="user", scope_value="*", token_limit=10
    )
    members = ["u-a", "U-b", "a1", "a-2", "Zed", "zed"]
    start = period_bounds("month", "UTC", datetime.now(UTC))[0]
    for member in members:
        PeriodLedger.objects.create(
            project=agent.project, budget=b, member=member, period_start=start
        )
    by_collation = list(
        PeriodLedger.objects.filter(budget=b).order_by("member").values_list("member", flat=True)
    )
    assert by_collation != sorted(members)  # the column's own order is not Python's
    locked = PeriodLedger.objects.select_for_update().filter(budget=b).order_by(*LEDGER_ORDER)
    assert [row.member for row in locked] == sorted(members)
