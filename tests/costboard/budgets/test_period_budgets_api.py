"""Period budgets through the API (admin keys) and the admin: made, read, changed and deleted,
every bad field a 422 naming it and the fix, other keys a 403; periods begin at midnight in
the budget's timezone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from unittest.mock import ANY

import pytest
from django.test import Client

from costboard.api.openapi import openapi_document
from costboard.budgets.periods import StepScope, budget_covers, period_bounds
from costboard.models import ApiKey, PeriodBudget, Project
from tests.conftest import Agent, make_agent

pytestmark = pytest.mark.django_db


class Admin:
    def __init__(self, agent: Agent) -> None:
        _, self.key = ApiKey.issue(project=agent.project, role="admin")
        self.agent = agent

    def call(self, method: str, path: str, body: Any = None) -> Any:
        client = Client()
        headers = {"Authorization": f"Bearer {self.key}"}
        if body is None:
            return client.generic(method, path, headers=headers)
        return client.generic(
            method,
            path,
            data=__import__("json").dumps(body),
            content_type="application/json",
            headers=headers,
        )


@pytest.fixture
def admin(agent: Agent) -> Admin:
    return Admin(agent)


def test_make_read_change_and_delete_a_budget(admin: Admin, agent: Agent) -> None:
    made = admin.call(
        "POST",
        "/api/v1/budgets",
        {"name": "monthly", "cost_limit_usd": "5.00", "action": "stop"},
    )
    assert made.status_code == 201, made.content
    body = made.json()
    start, end = period_bounds("month", "UTC", datetime.now(UTC))
    assert body == {
        "id": body["id"],
        "name": "monthly",
        "scope": "project",
        "scope_value": None,
        "member": None,
        "period": "month",
        "window_hours": None,
        "timezone": "UTC",
        "period_start": start.isoformat(),
        "period_end": end.isoformat() if end else None,
        "state": "ok",
        "tokens_used": 0,
        "token_limit": None,
        "cost_usd": "0.00",
        "cost_limit_usd": "5.00",
        "warn_at": [0.8],
        "warn_at_pct": 0.8,
        "threshold_crossed": None,
        "action": "stop",
        "channels": None,
        "warned_at": None,
        "exhausted_at": None,
        "forecast_cost_usd": "0.00",
        "forecast_range_usd": ["0.00", "0.00"],
        "forecast_daily_usd": "0.00",
        "crossing_date": None,
    }
    budget_id = body["id"]
    user = admin.call(
        "POST",
        "/api/v1/budgets",
        {
            "name": "per user",
            "scope": "user",
            "scope_value": "u-7",
            "period": "day",
            "timezone": "Europe/Berlin",
            "token_limit": 100_000,
            "warn_at_pct": 0.5,
        },
    )
    assert user.status_code == 201, user.content
    assert (user.json()["period"], user.json()["timezone"]) == ("day", "Europe/Berlin")
    # the older one-fraction warn_at_pct is a list of one
    assert (user.json()["warn_at"], user.json()["warn_at_pct"]) == ([0.5], 0.5)

    listed = admin.call("GET", "/api/v1/budgets").json()["budgets"]
    assert [b["name"] for b in listed] == ["monthly", "per user"]
    read = admin.call("GET", f"/api/v1/budgets/{budget_id}")
    assert read.status_code == 200
    assert read.json() == {**body, "events": [], "members": None}

    changed = admin.call(
        "PATCH", f"/api/v1/budgets/{budget_id}", {"cost_limit_usd": 10, "token_limit": 5000}
    )
    assert changed.status_code == 200, changed.content
    assert (changed.json()["cost_limit_usd"], changed.json()["token_limit"]) == ("10.00", 5000)
    assert changed.json()["name"] == "monthly"  # untouched
    # a limit removed, the other kept; removing both is refused
    one = admin.call("PATCH", f"/api/v1/budgets/{budget_id}", {"cost_limit_usd": None})
    assert (one.json()["cost_limit_usd"], one.json()["token_limit"]) == (None, 5000)
    none = admin.call("PATCH", f"/api/v1/budgets/{budget_id}", {"token_limit": None})
    assert none.status_code == 422
    assert none.json()["errors"][0]["field"] == "token_limit"
    assert PeriodBudget.objects.get(pk=budget_id).token_limit == 5000  # nothing half-stored

    assert admin.call("DELETE", f"/api/v1/budgets/{budget_id}").status_code == 204
    gone = admin.call("GET", f"/api/v1/budgets/{budget_id}")
    assert gone.status_code == 404
    assert gone.json()["errors"][0]["field"] == "budget_id"
    # another project's budget is not found either
    other = make_agent("other")
    theirs = PeriodBudget.objects.create(project=other.project, name="x", token_limit=5)
    assert admin.call("GET", f"/api/v1/budgets/{theirs.pk}").status_code == 404
    assert admin.call("DELETE", f"/api/v1/budgets/{theirs.pk}").status_code == 404
    assert PeriodBudget.objects.filter(pk=theirs.pk).exists()


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"cost_limit_usd": "5"}, "name", "is required"),
        ({"name": "x"}, "token_limit", "a budget needs a limit"),
        ({"name": "x", "token_limit": 5, "scope_value": "u-1"}, "scope_value", "must be absent"),
        ({"name": "x", "token_limit": 5, "scope": "user"}, "scope_value", "is required"),
        (
            {"name": "x", "token_limit": 5, "scope": "tag", "scope_value": "feature"},
            "scope_value",
            "key=value",
        ),
        (
            {"name": "x", "token_limit": 5, "scope": "api_key", "scope_value": "cb_nope000"},
            "scope_value",
            "no key of project acme has the prefix",
        ),
        (
            {"name": "x", "token_limit": 5, "timezone": "Mars/Olympus"},
            "timezone",
            "is not a timezone",
        ),
        ({"name": "x", "cost_limit_usd": "1.00001"}, "cost_limit_usd", "at most 4 decimals"),
        ({"name": "x", "token_limit": 0}, "token_limit", "must be at least 1, got 0"),
        ({"name": "x", "token_limit": 5, "warn_at_pct": 2}, "warn_at_pct", "at most 1, got 2"),
        (
            {"name": "x", "token_limit": 5, "warn_at_pct": "0.12345"},
            "warn_at_pct",
            "0.12345 is not a fraction from 0.01 to 1 with at most 3 decimals: 0.8 warns at "
            "80 %, e.g. 0.8",
        ),
        (
            {"name": "x", "token_limit": 5, "warn_at_pct": 0.8555},
            "warn_at_pct",
            "with at most 3 decimals",
        ),
        ({"name": "x", "token_limit": 5, "period": "year"}, "period", "'day', 'week'"),
        # Decimal() reads other scripts' digits as numbers: "５０" would be a $50 limit
        ({"name": "x", "cost_limit_usd": "５０"}, "cost_limit_usd", "write the amount in ASCII"),
        (
            {"name": "x", "token_limit": 5, "warn_at_pct": "０.５"},
            "warn_at_pct",
            "digit that is not 0-9",
        ),
        (
            {"name": "x", "token_limit": 5, "warn_at": ["0.5", "٠.٨"]},
            "warn_at",
            "digit that is not 0-9 ('٠', U+0660)",
        ),
        ({"name": "x", "token_limit": 5, "action": "block"}, "action", "'warn' or 'stop'"),
        ({"name": "x", "token_limit": 5, "limit": 3}, "limit", "did you mean 'token_limit'?"),
    ],
)
def test_a_bad_field_is_a_422_naming_it(
    admin: Admin, body: dict[str, Any], field: str, says: str
) -> None:
    response = admin.call("POST", "/api/v1/budgets", body)
    assert response.status_code == 422, response.content
    [error] = response.json()["errors"]
    assert error["field"] == field
    assert says in error["message"]
    assert not PeriodBudget.objects.exists()


def test_a_key_budget_names_an_existing_key_prefix(admin: Admin, agent: Agent) -> None:
    prefix = ApiKey.objects.filter(project=agent.project, role="ingest").get().prefix
    response = admin.call(
        "POST",
        "/api/v1/budgets",
        {"name": "integration", "scope": "api_key", "scope_value": prefix, "token_limit": 9},
    )
    assert response.status_code == 201
    assert response.json()["scope_value"] == prefix


def test_only_admin_keys_touch_budgets(agent: Agent, admin: Admin) -> None:
    budget = PeriodBudget.objects.create(project=agent.project, name="m", token_limit=10)
    _, read = ApiKey.issue(project=agent.project, role="read")
    for key in (agent.key, read):
        client = Client()
        headers = {"Authorization": f"Bearer {key}"}
        for method, path in (
            ("GET", "/api/v1/budgets"),
            ("POST", "/api/v1/budgets"),
            ("GET", f"/api/v1/budgets/{budget.pk}"),
            ("PATCH", f"/api/v1/budgets/{budget.pk}"),
            ("DELETE", f"/api/v1/budgets/{budget.pk}"),
        ):
            response = client.generic(method, path, headers=headers)
            assert response.status_code == 403, (method, path)
            assert "needs a key with the admin role" in response.json()["errors"][0]["message"]
    assert PeriodBudget.objects.filter(pk=budget.pk).exists()
    put = admin.call("PUT", f"/api/v1/budgets/{budget.pk}")
    assert put.status_code == 405 and put["Allow"] == "GET, PATCH, DELETE"


def test_the_document_has_the_budget_operations() -> None:
    paths = openapi_document()["paths"]
    assert set(paths["/api/v1/budgets"]) == {"get", "post"}
    assert set(paths["/api/v1/budgets/{budget_id}"]) == {"get", "patch", "delete"}
    assert "403" in paths["/api/v1/budgets"]["post"]["responses"]


def test_periods_begin_at_midnight_where_the_budget_is() -> None:
    at = datetime(2026, 3, 29, 12, 0, tzinfo=UTC)  # Berlin goes to summer time that night
    assert period_bounds("day", "UTC", at) == (
        datetime(2026, 3, 29, tzinfo=UTC),
        datetime(2026, 3, 30, tzinfo=UTC),
    )
    start, end = period_bounds("day", "Europe/Berlin", at)
    assert start == datetime(2026, 3, 28, 23, tzinfo=UTC)  # midnight CET
    assert end is not None and end - start == timedelta(hours=23)  # a short day
    week = period_bounds("week", "UTC", at)  # a Sunday: the week began on Monday the 23rd
    assert week == (datetime(2026, 3, 23, tzinfo=UTC), datetime(2026, 3, 30, tzinfo=UTC))
    month = period_bounds("month", "America/New_York", datetime(2026, 12, 1, 3, tzinfo=UTC))
    # 3:00 UTC on the 1st is still November 30th in New York
    assert month == (datetime(2026, 11, 1, 4, tzinfo=UTC), datetime(2026, 12, 1, 5, tzinfo=UTC))
    assert period_bounds("total", "UTC", at) == (datetime(1970, 1, 1, tzinfo=UTC), None)


def test_which_steps_a_budget_covers() -> None:
    project = Project(slug="p")
    step = StepScope(user_id="u-7", key_prefix="cb_AbCdEfG", tags={"feature": "search"})
    anonymous = StepScope(user_id="", key_prefix="cb_Other00", tags=None)

    def covers(scope: str, value: str, on: StepScope) -> bool:
        budget = PeriodBudget(project=project, scope=scope, scope_value=value)
        return budget_covers(budget, on)

    assert covers("project", "", step) and covers("project", "", anonymous)
    assert covers("user", "u-7", step) and not covers("user", "u-7", anonymous)
    assert not covers("user", "", anonymous)
    assert covers("api_key", "cb_AbCdEfG", step) and not covers("api_key", "cb_AbCdEfG", anonymous)
    assert covers("tag", "feature=search", step)
    assert not covers("tag", "feature=chat", step) and not covers(
        "tag", "feature=search", anonymous
    )


def test_the_admin_makes_a_budget_with_the_same_checks(admin_client: Client, agent: Agent) -> None:
    form = {
        "project": agent.project.pk,
        "name": "feature",
        "scope": "tag",
        "scope_value": "feature",
        "period": "month",
        "timezone": "UTC",
        "token_limit": "1000",
        "cost_limit_usd": "",
        "warn_at_pct": "0.8",
        "action": "warn",
        "ledgers-TOTAL_FORMS": "0",
        "ledgers-INITIAL_FORMS": "0",
    }
    refused = admin_client.post("/admin/costboard/periodbudget/add/", form)
    assert refused.status_code == 200
    assert "must be a tag as key=value" in refused.content.decode()
    assert not PeriodBudget.objects.exists()
    made = admin_client.post(
        "/admin/costboard/periodbudget/add/", {**form, "scope_value": "feature=search"}
    )
    assert made.status_code == 302, made.content.decode()[:2000]
    budget = PeriodBudget.objects.get()
    assert (budget.scope, budget.scope_value, budget.token_limit) == ("tag", "feature=search", 1000)


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"name": "x", "token_limit": 5, "scope": None}, "scope", "must be one of project, user"),
        ({"name": "x", "token_limit": 5, "period": None}, "period", "must be one of day, week"),
        ({"name": "x", "token_limit": 5, "action": None}, "action", "must be one of warn, stop"),
        ({"name": "x", "token_limit": 5, "warn_at_pct": None}, "warn_at_pct", "from 0.01 to 1"),
        ({"name": "   ", "token_limit": 5}, "name", "is required: 1 to 100 characters"),
        ({"name": "x", "cost_limit_usd": "0"}, "cost_limit_usd", "a USD amount from 0.0001"),
    ],
)
def test_a_choice_sent_as_null_is_refused_not_defaulted(
    admin: Admin, body: dict[str, Any], field: str, says: str
) -> None:
    """The service trusts BudgetFields' types and ranges and keeps the rules no type holds: a
    choice named as null is refused (left out, it has its default), a blank name is none."""
    response = admin.call("POST", "/api/v1/budgets", body)
    assert response.status_code == 422, response.content
    assert response.json()["errors"] == [{"index": None, "field": field, "message": ANY}]
    assert says in response.json()["errors"][0]["message"]
    assert not PeriodBudget.objects.exists()
    made = admin.call("POST", "/api/v1/budgets", {"name": "x", "token_limit": 5})
    assert made.status_code == 201, made.content
    assert {k: made.json()[k] for k in ("scope", "period", "action", "warn_at_pct")} == {
        "scope": "project",
        "period": "month",
        "action": "warn",
        "warn_at_pct": 0.8,
    }
    changed = admin.call("PATCH", f"/api/v1/budgets/{made.json()['id']}", body)
    assert changed.status_code == 422, changed.content
    assert changed.json()["errors"][0]["field"] == field


def test_the_admin_types_a_budget_as_the_api_does(admin_client: Client, agent: Agent) -> None:
    """The admin's form goes through the API's BudgetFields: a limit the column holds but the
    API refuses is refused in the form too, on its field, in the API's words."""
    form = {
        "project": agent.project.pk,
        "name": "huge",
        "scope": "project",
        "scope_value": "",
        "period": "month",
        "timezone": "UTC",
        "token_limit": str(10**15 + 1),
        "cost_limit_usd": "",
        "warn_at_pct": "0.8",
        "action": "warn",
        "ledgers-TOTAL_FORMS": "0",
        "ledgers-INITIAL_FORMS": "0",
    }
    refused = admin_client.post("/admin/costboard/periodbudget/add/", form)
    assert refused.status_code == 200
    errors = refused.context["adminform"].form.errors
    assert errors == {"token_limit": [f"must be at most {10**15}, got {10**15 + 1}"]}
    api = Admin(agent).call("POST", "/api/v1/budgets", {"name": "huge", "token_limit": 10**15 + 1})
    assert api.json()["errors"][0]["message"] == errors["token_limit"][0]
    assert not PeriodBudget.objects.exists()
    made = admin_client.post("/admin/costboard/periodbudget/add/", {**form, "token_limit": "7"})
    assert made.status_code == 302, made.content.decode()[:2000]
    assert PeriodBudget.objects.get().token_limit == 7


def test_a_calendar_budget_keeps_its_period_and_timezone(
    admin: Admin, agent: Agent, priced: object
) -> None:
    made = admin.call(
        "POST",
        "/api/v1/budgets",
        {"name": "monthly", "token_limit": 10, "action": "stop"},
    ).json()
    agent.events({"step_type": "response", "model": "test-sonnet", "session_id": "s",
                  "input_tokens": 100})  # fmt: skip
    path = f"/api/v1/budgets/{made['id']}"
    spent = admin.call("GET", path).json()
    assert spent["state"] == "exhausted"
    # under another period or timezone its spend so far would read 0 and its stop lift
    for change, field in (({"period": "week"}, "period"), ({"timezone": "Asia/Tokyo"}, "timezone")):
        refused = admin.call("PATCH", path, change)
        assert refused.status_code == 422, refused.content
        [error] = refused.json()["errors"]
        assert error["field"] == field
        assert "make a new budget with it and delete this one" in error["message"]
    # as it was (its forecast aside: today's pace moves with the clock)
    after = admin.call("GET", path).json()
    assert {k: v for k, v in after.items() if not k.startswith("forecast_")} == {
        k: v for k, v in spent.items() if not k.startswith("forecast_")
    }
    assert agent.budget("s").json()["stopped_by"] == f"budget:{made['id']}"
    assert admin.call("PATCH", path, {"name": "renamed"}).status_code == 200  # the rest change


def test_a_budget_keeps_its_scope(admin: Admin, agent: Agent, priced: object) -> None:
    made = admin.call(
        "POST",
        "/api/v1/budgets",
        {"name": "u-1's", "scope": "user", "scope_value": "u-1", "token_limit": 100,
         "action": "stop"},
    ).json()  # fmt: skip
    agent.events({"type": "session", "session_id": "a", "user_id": "u-1"},
                 {"type": "session", "session_id": "b", "user_id": "u-2"},
                 {"step_type": "response", "model": "test-sonnet", "session_id": "a",
                  "input_tokens": 150})  # fmt: skip
    path = f"/api/v1/budgets/{made['id']}"
    spent = admin.call("GET", path).json()
    assert (spent["state"], spent["tokens_used"], spent["cost_usd"]) == (
        "exhausted",
        150,
        "0.00045",
    )
    # under another scope the spend counted so far is another's: u-2, who spent nothing,
    # would read u-1's 150 tokens and be stopped by them
    for change in (
        {"scope_value": "u-2"},
        {"scope": "project", "scope_value": None},
        {"scope": "tag", "scope_value": "team=a"},
    ):
        refused = admin.call("PATCH", path, change)
        assert refused.status_code == 422, refused.content
        [error] = refused.json()["errors"]
        assert error["field"] == ("scope" if "scope" in change else "scope_value")
        assert "make a new budget with it and delete this one" in error["message"]
    # as it was (its forecast aside: today's pace moves with the clock)
    after = admin.call("GET", path).json()
    assert {k: v for k, v in after.items() if not k.startswith("forecast_")} == {
        k: v for k, v in spent.items() if not k.startswith("forecast_")
    }
    assert agent.budget("b").json()["stopped_by"] is None
    assert agent.budget("a").json()["stopped_by"] == f"budget:{made['id']}"
    # the same scope sent again, spaces around it, is no change
    same = admin.call("PATCH", path, {"scope": "user", "scope_value": " u-1 ", "name": "u-1"})
    assert same.status_code == 200, same.content
