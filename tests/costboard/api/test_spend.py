"""GET /api/v1/spend: spend grouped by day, model, step type, user or a tag, from the rollups;
its total equals the overview's for the same days and the sum of the steps; CSV on request;
read and admin keys only; every bad parameter a 422 naming it."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from costboard.models import ApiKey, Step
from costboard.pricing.repricing import steps_reprice
from tests.conftest import Agent, add_price

pytestmark = pytest.mark.django_db


@pytest.fixture
def reader(agent: Agent) -> str:
    add_price("test-sonnet")
    add_price("test-haiku")
    now = timezone.now()
    yesterday = (now - timedelta(days=1)).isoformat()
    agent.events(
        {"type": "session", "session_id": "a", "user_id": "ann", "tags": {"plan": "pro"}},
        {"type": "session", "session_id": "b", "user_id": "bob"},
        *(
            {
                "session_id": "a",
                "step_type": "search",
                "model": "test-haiku",
                "input_tokens": 100 * n,
                "tags": {"feature": "search"},
            }
            for n in range(1, 4)
        ),
        {
            "session_id": "b",
            "step_type": "response",
            "model": "test-sonnet",
            "input_tokens": 5000,
            "output_tokens": 700,
            "cache_read_input_tokens": 900,
            "timestamp": yesterday,
            "tags": {"feature": "=HYPERLINK(1)"},
        },
        {"session_id": "c", "step_type": "response", "model": "test-sonnet", "output_tokens": 10},
    )
    return ApiKey.issue(project=agent.project, role="read")[1]


def get(key: str, query: str = "", **headers: str) -> Any:
    return Client().get(
        f"/api/v1/spend{query}", headers={"Authorization": f"Bearer {key}", **headers}
    )


def cost_of(steps: Any) -> Decimal:
    return sum((s.cost_usd for s in steps), Decimal(0))


def test_totals_equal_the_steps_and_the_overview(reader: str, staff: Client) -> None:
    answer = get(reader).json()
    steps = Step.objects.all()
    assert answer["group_by"] == ["day"]
    assert Decimal(answer["total"]["cost_usd"]) == cost_of(steps)
    assert answer["total"]["steps"] == steps.count() == 5
    assert answer["total"]["input_tokens"] == sum(s.input_tokens for s in steps)
    assert answer["total"]["cache_read_input_tokens"] == 900
    assert len(answer["rows"]) == 2  # yesterday and today
    # the overview's 7-day figure for the same days
    html = staff.get("/").content.decode()
    seven = re.search(r'data-spend="7 days">([^<]+)<', html)
    assert seven is not None
    assert seven.group(1) == f"${Decimal(answer['total']['cost_usd']).quantize(Decimal('0.01'))}"


def test_grouped_by_model_user_and_tag(reader: str) -> None:
    by_model = get(reader, "?group_by=model,step_type").json()
    assert [(r["model"], r["step_type"], r["steps"]) for r in by_model["rows"]] == [
        ("test-haiku", "search", 3),
        ("test-sonnet", "response", 2),
    ]
    haiku = Step.objects.filter(model="test-haiku")
    assert Decimal(by_model["rows"][0]["cost_usd"]) == cost_of(haiku)
    by_user = get(reader, "?group_by=user").json()
    assert {r["user"]: r["steps"] for r in by_user["rows"]} == {"": 1, "ann": 3, "bob": 1}
    assert by_user["total"] == get(reader).json()["total"]
    by_tag = get(reader, "?group_by=day,tag:feature").json()
    assert {r["tag:feature"]: r["steps"] for r in by_tag["rows"]} == {
        "search": 3,
        "=HYPERLINK(1)": 1,
        None: 1,  # session c's step, untagged
    }
    [untagged] = [r for r in by_tag["rows"] if r["tag:feature"] is None]
    assert Decimal(untagged["cost_usd"]) == cost_of(Step.objects.filter(session__external_id="c"))
    assert Decimal(by_tag["total"]["cost_usd"]) == cost_of(Step.objects.all())
    today = timezone.now().date()
    only_today = get(reader, f"?since={today}&until={today}").json()
    assert only_today["total"]["steps"] == 4


def test_csv_has_a_header_and_quotes_formulas(reader: str) -> None:
    response = Client().get(
        "/api/v1/spend?group_by=tag:feature",
        headers={"Authorization": f"Bearer {reader}", "Accept": "text/csv"},
    )
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == [
        "tag:feature",
        "cost_usd",
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "steps",
    ]
    assert sorted(r[0] for r in rows[1:]) == ["'=HYPERLINK(1)", "(untagged)", "search"]


def test_only_read_and_admin_keys(agent: Agent, reader: str) -> None:
    assert get(agent.key).status_code == 403
    admin = ApiKey.issue(project=agent.project, role="admin")[1]
    assert get(admin).status_code == 200 and get(reader).status_code == 200


@pytest.mark.parametrize(
    ("query", "field", "says"),
    [
        ("?group_by=hour", "group_by", "'hour' is not a group"),
        ("?group_by=user,model", "group_by", "user goes with day alone"),
        ("?group_by=tag:a,tag:b", "group_by", "goes with day alone"),
        ("?group_by=day,day", "group_by", "named twice"),
        # a key no tag can have (tags' keys are [a-z0-9_.-]{1,64}): a typo, not all untagged
        ("?group_by=tag:Customer", "group_by", "'Customer' is not a tag key"),
        ("?group_by=day,tag:a%20b", "group_by", "'a b' is not a tag key"),
        (f"?group_by=tag:{'k' * 65}", "group_by", "up to 64 of a-z 0-9 _ . -"),
        ("?since=2026-02-10&until=2026-02-01", "since", "is after until"),
        ("?since=notadate", "since", "date"),
        ("?until=2026-13-01", "until", "date"),
        ("?groupby=day", "groupby", "did you mean 'group_by'"),
        ("?until=0001-01-05", "until", "outside the years 1970–2999"),
        ("?since=9999-01-01", "since", "outside the years 1970–2999"),
        # a number is not a Unix time here: until=0 was once read as 1970-01-01
        ("?until=0", "until", "'0' is not a date written YYYY-MM-DD"),
        ("?since=0", "since", "'0' is not a date written YYYY-MM-DD"),
        ("?until=1700000000", "until", "from 1970-01-01 to 2999-12-31"),
        ("?since=-1", "since", "is not a date"),
        ("?until=2026-11-01T00:00:00", "until", "is not a date written YYYY-MM-DD"),
        ("?until=2026-11-01T00:00:00Z", "until", "is not a date"),
        ("?until=20261101", "until", "is not a date"),
        ("?until=2026-2-01", "until", "is not a date"),
        ("?until=2026-02-30", "until", "'2026-02-30' is no such date"),
        ("?until=1969-12-31", "until", "outside the years 1970–2999"),
        ("?since=3000-01-01", "since", "outside the years 1970–2999"),
        ("?until=", "until", "is not a date"),
    ],
)
def test_a_bad_parameter_is_a_422_naming_it(reader: str, query: str, field: str, says: str) -> None:
    response = get(reader, query)
    assert response.status_code == 422, response.content
    [error] = response.json()["errors"]
    assert error["field"] == field
    assert says in error["message"]


def test_both_days_out_of_range_are_each_named(reader: str) -> None:
    response = get(reader, "?since=9999-01-01&until=0")
    assert response.status_code == 422
    fields = [error["field"] for error in response.json()["errors"]]
    assert fields == ["since", "until"]


@pytest.mark.parametrize(
    ("query", "since", "until"),
    [
        ("?since=1970-01-01&until=1970-01-31", "1970-01-01", "1970-01-31"),
        # the default 30 days back from an early until stop at the first day
        ("?until=1970-01-05", "1970-01-01", "1970-01-05"),
        ("?since=2999-12-01&until=2999-12-31", "2999-12-01", "2999-12-31"),
    ],
)
def test_the_first_and_last_days_of_the_range_are_answered(
    reader: str, query: str, since: str, until: str
) -> None:
    response = get(reader, query)
    assert response.status_code == 200, response.content
    assert (response.json()["since"], response.json()["until"]) == (since, until)
    assert response.json()["rows"] == []


def test_the_document_gives_since_and_until_as_dates() -> None:
    from costboard.api.openapi import openapi_document

    parameters = openapi_document()["paths"]["/api/v1/spend"]["get"]["parameters"]
    days = {p["name"]: p for p in parameters if p["name"] in ("since", "until")}
    for parameter in days.values():
        assert parameter["schema"]["anyOf"][0]["format"] == "date"
        assert "1970-01-01 to 2999-12-31" in parameter["description"]


@pytest.mark.parametrize(("group_by", "group"), [("model", "no-price"), ("step_type", "free")])
def test_a_group_of_unpriced_steps_costs_zero_dollars(
    reader: str, agent: Agent, group_by: str, group: str
) -> None:
    agent.events({"session_id": "d", "step_type": "free", "model": "no-price", "input_tokens": 50})
    answer = get(reader, f"?group_by={group_by}")
    assert answer.status_code == 200, answer.content
    rows = {row[group_by]: row for row in answer.json()["rows"]}
    assert (rows[group]["cost_usd"], rows[group]["input_tokens"]) == ("0.00", 50)
    assert Decimal(answer.json()["total"]["cost_usd"]) == cost_of(Step.objects.all()) > 0


# --- every grouping answers, and its rows add up to the window's whole spend -----------------

GROUPINGS = [
    "day",
    "model",
    "step_type",
    "user",
    "day,model",
    "day,step_type",
    "model,step_type",
    "day,model,step_type",
    "day,user",
    "tag:feature",
    "day,tag:feature",
    "tag:plan",
    "tag:absent",
]


@pytest.fixture
def mixed(reader: str, agent: Agent) -> str:
    """Beside `reader`'s priced steps: tool steps and an unknown model ($0 groups), tagged and
    untagged, on two days."""
    yesterday = (timezone.now() - timedelta(days=1)).isoformat()
    agent.events(
        {"session_id": "d", "step_type": "tool", "model": "none", "tags": {"feature": "tools"}},
        {"session_id": "d", "step_type": "tool", "model": "none", "timestamp": yesterday},
        {"session_id": "e", "step_type": "free", "model": "no-price", "input_tokens": 50},
        {
            "session_id": "e",
            "step_type": "free",
            "model": "no-price",
            "input_tokens": 7,
            "timestamp": yesterday,
            "tags": {"feature": "free"},
        },
    )
    return reader


def csv_rows(key: str, group_by: str) -> list[dict[str, str]]:
    response = get(key, f"?group_by={group_by}", Accept="text/csv")
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    return list(csv.DictReader(io.StringIO(response.content.decode())))


@pytest.mark.parametrize("group_by", GROUPINGS)
def test_every_grouping_adds_up_to_the_steps_in_json_and_csv(mixed: str, group_by: str) -> None:
    steps = Step.objects.all()
    whole = cost_of(steps)
    assert whole > 0 and steps.filter(cost_usd=0).count() == 4  # $0 groups are in the data
    response = get(mixed, f"?group_by={group_by}")
    assert response.status_code == 200, response.content
    answer = response.json()
    assert Decimal(answer["total"]["cost_usd"]) == whole
    assert sum(Decimal(row["cost_usd"]) for row in answer["rows"]) == whole
    assert answer["total"]["steps"] == sum(row["steps"] for row in answer["rows"]) == 9
    assert answer["total"]["input_tokens"] == sum(s.input_tokens for s in steps)
    rows = csv_rows(mixed, group_by)
    assert sum(Decimal(row["cost_usd"]) for row in rows) == whole
    assert sum(int(row["steps"]) for row in rows) == 9
    assert [row["cost_usd"] for row in rows] == [row["cost_usd"] for row in answer["rows"]]


def test_grouped_by_a_tag_the_untagged_spend_is_a_row_with_the_tag_null(mixed: str) -> None:
    answer = get(mixed, "?group_by=tag:feature").json()
    by_value = {row["tag:feature"]: row for row in answer["rows"]}
    assert list(by_value) == ["=HYPERLINK(1)", "free", "search", "tools", None]
    untagged = Step.objects.filter(tags__isnull=True) | Step.objects.exclude(
        tags__has_key="feature"
    )
    assert by_value[None]["steps"] == untagged.distinct().count() == 3
    assert Decimal(by_value[None]["cost_usd"]) == cost_of(untagged.distinct()) > 0
    assert (by_value["tools"]["cost_usd"], by_value["free"]["cost_usd"]) == ("0.00", "0.00")
    assert by_value["free"]["input_tokens"] == 7
    rows = csv_rows(mixed, "tag:feature")
    assert [row["tag:feature"] for row in rows] == [
        "'=HYPERLINK(1)",
        "free",
        "search",
        "tools",
        "(untagged)",
    ]
    assert rows[-1]["cost_usd"] == by_value[None]["cost_usd"]


def test_by_day_and_tag_each_day_has_its_untagged_row(mixed: str) -> None:
    answer = get(mixed, "?group_by=day,tag:feature").json()
    days = sorted({row["day"] for row in answer["rows"]})
    for day in days:
        of_day = [row for row in answer["rows"] if row["day"] == day]
        assert of_day[-1]["tag:feature"] is None  # after the day's values
        spent = cost_of(s for s in Step.objects.all() if s.timestamp.date().isoformat() == day)
        assert sum(Decimal(row["cost_usd"]) for row in of_day) == spent


def test_a_key_no_step_carries_is_one_untagged_row(mixed: str) -> None:
    answer = get(mixed, "?group_by=tag:absent").json()
    [row] = answer["rows"]
    assert row["tag:absent"] is None
    assert Decimal(row["cost_usd"]) == cost_of(Step.objects.all())
    assert row["steps"] == 9


def test_after_a_repricing_every_grouping_still_adds_up_to_the_steps(
    mixed: str, agent: Agent
) -> None:
    add_price("no-price")  # the unknown model gets a price: its steps are repriced
    steps_reprice(models=["no-price"])
    whole = cost_of(Step.objects.all())
    assert cost_of(Step.objects.filter(model="no-price")) > 0
    for group_by in GROUPINGS:
        answer = get(mixed, f"?group_by={group_by}").json()
        assert Decimal(answer["total"]["cost_usd"]) == whole, group_by
        assert sum(Decimal(row["cost_usd"]) for row in answer["rows"]) == whole, group_by
        assert all(row["steps"] > 0 for row in answer["rows"]), group_by
