"""The admin's decimals are typed in the digits 0-9: Django's DecimalField calls Decimal(),
which reads "１２" (fullwidth) or "١٢" (Arabic-Indic) as 12, so a price, a negotiated
percentage, a project's USD cap or a budget's limit in such digits was saved as that number.
Each is now a form error on its field, saying how to write it, and nothing is saved."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from costboard.models import ModelPrice, PeriodBudget, PriceAdjustment
from tests.conftest import Agent
from tests.costboard.api.test_inflight import FormFields
from tests.costboard.test_page_input import PRICE  # an admin price form, every field

pytestmark = pytest.mark.django_db

FIX = "write the amount in ASCII digits, e.g."


def field_errors(html: str, field: str) -> str:
    """The admin's errors of one field (its `id_<field>_error` list), or ""."""
    found = re.search(rf'<ul class="errorlist" id="id_{field}_error">(.*?)</ul>', html, re.S)
    return found[1] if found else ""


def test_a_price_adjustment_in_other_digits_is_a_form_error(staff: Client) -> None:
    form = {"provider": "testco", "percent": "-１５", "effective_from": "2026-11-01"}
    refused = staff.post("/admin/costboard/priceadjustment/add/", form)
    assert refused.status_code == 200
    errors = field_errors(refused.content.decode(), "percent")
    assert "has a digit that is not 0-9" in errors and FIX in errors
    assert not PriceAdjustment.objects.exists()
    saved = staff.post("/admin/costboard/priceadjustment/add/", {**form, "percent": "-15"})
    assert saved.status_code == 302
    assert PriceAdjustment.objects.get().percent == Decimal(-15)


@pytest.mark.parametrize(
    ("field", "value"),
    [("input_mtok", "٣"), ("output_mtok", "1５"), ("tiers", '[{"start": 9, "input_mtok": "６"}]')],
)
def test_a_price_in_other_digits_is_a_form_error(staff: Client, field: str, value: str) -> None:
    refused = staff.post("/admin/costboard/modelprice/add/", {**PRICE, field: value})
    assert refused.status_code == 200
    errors = field_errors(refused.content.decode(), field)
    assert "has a digit that is not 0-9" in errors and FIX in errors
    assert not ModelPrice.objects.exists()


def project_form(agent: Agent, staff: Client) -> tuple[str, dict[str, Any]]:
    """The project's admin change page and its form's fields as it renders them."""
    url = f"/admin/costboard/project/{agent.project.pk}/change/"
    parser = FormFields()
    parser.feed(staff.get(url).content.decode())
    data: dict[str, Any] = {}
    for name, value in parser.fields:
        data.setdefault(name, []).append(value)
    return url, data


def test_a_projects_usd_cap_in_other_digits_is_a_form_error(agent: Agent, staff: Client) -> None:
    url, data = project_form(agent, staff)
    data["cost_cap_usd"] = ["１２"]
    refused = staff.post(url, data)
    assert refused.status_code == 200
    errors = field_errors(refused.content.decode(), "cost_cap_usd")
    assert "has a digit that is not 0-9" in errors and FIX in errors
    agent.project.refresh_from_db()
    assert agent.project.cost_cap_usd is None
    data["cost_cap_usd"] = ["12"]
    assert staff.post(url, data).status_code == 302
    agent.project.refresh_from_db()
    assert agent.project.cost_cap_usd == Decimal(12)


@pytest.mark.parametrize(("field", "value"), [("cost_limit_usd", "５０"), ("warn_at", "0.5, ٠.٨")])
def test_a_budget_in_other_digits_is_a_form_error(
    admin_client: Client, agent: Agent, field: str, value: str
) -> None:
    form = {
        "project": agent.project.pk,
        "name": "monthly",
        "scope": "project",
        "scope_value": "",
        "period": "month",
        "window_hours": "",
        "timezone": "UTC",
        "token_limit": "",
        "cost_limit_usd": "50",
        "warn_at": "0.5, 0.8",
        "action": "warn",
        "ledgers-TOTAL_FORMS": "0",
        "ledgers-INITIAL_FORMS": "0",
    }
    refused = admin_client.post("/admin/costboard/periodbudget/add/", {**form, field: value})
    assert refused.status_code == 200
    errors = field_errors(refused.content.decode(), field)
    assert "has a digit that is not 0-9" in errors and FIX in errors
    assert not PeriodBudget.objects.exists()
    made = admin_client.post("/admin/costboard/periodbudget/add/", form)
    assert made.status_code == 302, made.content.decode()[:2000]
    assert PeriodBudget.objects.get().cost_limit_usd == Decimal(50)


@pytest.mark.parametrize("tokens", ["５０００", "5_000"])
def test_a_projects_token_cap_typed_otherwise_than_in_digits_is_a_form_error(
    agent: Agent, staff: Client, tokens: str
) -> None:
    # int() reads fullwidth digits and "5_000" as 5000: the admin's whole numbers refuse them
    url, data = project_form(agent, staff)
    before = agent.project.token_cap
    data["token_cap"] = [tokens]
    refused = staff.post(url, data)
    assert refused.status_code == 200
    assert "write the amount in" in field_errors(refused.content.decode(), "token_cap")
    agent.project.refresh_from_db()
    assert agent.project.token_cap == before
    data["token_cap"] = ["5000"]
    assert staff.post(url, data).status_code == 302
    agent.project.refresh_from_db()
    assert agent.project.token_cap == 5000
