"""The admin's decimals are typed in the digits 0-9: Django's DecimalField calls Decimal(),
which reads "１２" (fullwidth) or "١٢" (Arabic-Indic) as 12, so a price, a negotiated
percentage, a project's USD cap or a budget's limit in such digits was saved as that number.
Each is now a form error on its field, saying how to write it, and nothing is saved. So is a
rate below 0 (on the price form, in the rate list's cells and in price_save) and a USD cap
below 0 (a project's, a session's), which the admin saved where the API refuses them."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from costboard.models import ModelPrice, OutboxItem, PeriodBudget, PriceAdjustment, Session
from costboard.pricing import services as pricing_services
from costboard.pricing.services import RATE_FIELDS, PriceError
from tests.conftest import Agent, add_price
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


def change_form(staff: Client, url: str) -> dict[str, Any]:
    """An admin change page's form fields as it renders them (its inlines' included)."""
    parser = FormFields()
    parser.feed(staff.get(url).content.decode())
    data: dict[str, Any] = {}
    for name, value in parser.fields:
        data.setdefault(name, []).append(value)
    return data


USD_CAPS = ("cost_cap_usd", "system_cost_cap_usd")
TOKEN_CAPS = ("token_cap", "system_token_cap")


def project_form(agent: Agent, staff: Client) -> tuple[str, dict[str, Any]]:
    """The project's admin change page and its form's fields as it renders them."""
    url = f"/admin/costboard/project/{agent.project.pk}/change/"
    return url, change_form(staff, url)


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


def price_list_edit(staff: Client, price: ModelPrice, **rates: str) -> Any:
    """The rate list's editable cells of one row, posted as the list's Save sends them."""
    cells = {name: f"{getattr(price, name).normalize():f}" for name in RATE_FIELDS[:4]}
    cells.update(rates)
    form = {
        "form-TOTAL_FORMS": "1",
        "form-INITIAL_FORMS": "1",
        "form-MIN_NUM_FORMS": "0",
        "form-MAX_NUM_FORMS": "1000",
        "form-0-id": str(price.pk),
        **{f"form-0-{name}": value for name, value in cells.items()},
        "_save": "Save",
    }
    return staff.post("/admin/costboard/modelprice/", form)


@pytest.mark.parametrize("field", ["input_mtok", "output_mtok", "cache_read_mtok"])
def test_a_negative_rate_is_a_form_error_on_the_price_form(staff: Client, field: str) -> None:
    # a long-context tier's rate below 0 was refused, the row's own was saved (costs < $0)
    refused = staff.post("/admin/costboard/modelprice/add/", {**PRICE, field: "-5"})
    assert refused.status_code == 200
    assert "must be 0 or more USD per million tokens, got -5" in field_errors(
        refused.content.decode(), field
    )
    assert not ModelPrice.objects.exists()
    assert staff.post("/admin/costboard/modelprice/add/", {**PRICE, field: "0"}).status_code == 302


def test_a_negative_rate_is_refused_in_the_rate_lists_cells(staff: Client) -> None:
    price = add_price("cellmodel")
    refused = price_list_edit(staff, price, output_mtok="-7")
    assert refused.status_code == 200
    assert "must be 0 or more USD per million tokens, got -7" in refused.content.decode()
    price.refresh_from_db()
    assert price.output_mtok == Decimal(15) and not price.edited_by_admin
    assert not OutboxItem.objects.exists()  # nothing to reprice
    assert price_list_edit(staff, price, output_mtok="16.5").status_code == 302
    price.refresh_from_db()
    assert price.output_mtok == Decimal("16.5") and price.edited_by_admin


def test_price_save_refuses_a_negative_rate_whoever_calls_it(db: None) -> None:
    price = ModelPrice(provider="p", model="m", input_mtok=Decimal(1), output_mtok=Decimal(-1))
    with pytest.raises(PriceError) as refused:
        pricing_services.price_save(price=price)
    assert refused.value.field == "output_mtok"
    assert not ModelPrice.objects.exists()


@pytest.mark.parametrize(
    ("field", "refused_value", "message", "least", "stored"),
    [
        # the API's session event takes a USD cap of 0 or more, a token cap of 1 or more; a cap
        # under that held every session exhausted
        *[(f, "-1", "must be 0 or more USD, got -1", "0", Decimal(0)) for f in USD_CAPS],
        *[(f, "0", "must be 1 or more tokens, got 0", "1", 1) for f in TOKEN_CAPS],
    ],
)
def test_a_projects_cap_under_what_the_api_takes_is_a_form_error(
    agent: Agent,
    staff: Client,
    field: str,
    refused_value: str,
    message: str,
    least: str,
    stored: Decimal | int,
) -> None:
    url, data = project_form(agent, staff)
    data[field] = [refused_value]
    refused = staff.post(url, data)
    assert refused.status_code == 200
    assert message in field_errors(refused.content.decode(), field)
    agent.project.refresh_from_db()
    assert getattr(agent.project, field) is None
    data[field] = [least]
    assert staff.post(url, data).status_code == 302
    agent.project.refresh_from_db()
    assert getattr(agent.project, field) == stored


def test_a_sessions_token_cap_of_0_is_a_form_error(agent: Agent, staff: Client) -> None:
    agent.events({"session_id": "chat-1", "model": "none", "step_type": "search"})
    session = Session.objects.get(external_id="chat-1")
    url = f"/admin/costboard/session/{session.pk}/change/"
    data = change_form(staff, url)
    refused = staff.post(url, {**data, "token_cap": "0"})
    assert refused.status_code == 200
    assert "must be 1 or more tokens, got 0" in field_errors(refused.content.decode(), "token_cap")
    session.refresh_from_db()
    assert session.token_cap is None
    assert agent.budget("chat-1").json()["state"] == "ok"


def test_a_sessions_negative_usd_cap_is_a_form_error(agent: Agent, staff: Client) -> None:
    agent.events({"session_id": "chat-1", "model": "none", "step_type": "search"})
    session = Session.objects.get(external_id="chat-1")
    url = f"/admin/costboard/session/{session.pk}/change/"
    data = change_form(staff, url)
    refused = staff.post(url, {**data, "cost_cap_usd": "-2.5"})
    assert refused.status_code == 200
    assert "must be 0 or more USD, got -2.5" in field_errors(
        refused.content.decode(), "cost_cap_usd"
    )
    session.refresh_from_db()
    assert session.cost_cap_usd is None
    assert agent.budget("chat-1").json()["state"] == "ok"
    assert staff.post(url, {**data, "cost_cap_usd": "2.5"}).status_code == 302
    session.refresh_from_db()
    assert session.cost_cap_usd == Decimal("2.5")
