"""A price row's start day (docs/pricing.md, "Editing prices and repricing"): from
2000-01-01, the day a price that has always applied starts (genai-prices' rows and a row given
no date), to two years after today. The admin took any day, 0001-01-01 or 9999-12-31
included, and saved it; now the form shows the fault on its field, naming the range and an
example, and price_save refuses it whoever calls it. Nothing is saved either way."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from costboard.models import PRICE_EPOCH, ModelPrice
from costboard.pricing import services as pricing_services
from costboard.pricing.services import PriceError, price_day_fault
from costboard.pricing.sync import builtin_rows
from tests.conftest import add_price
from tests.costboard.test_admin_amounts import field_errors, price_list_edit
from tests.costboard.test_page_input import PRICE  # an admin price form, every field

TODAY = date(2026, 11, 29)


def at(day: str) -> datetime:
    return datetime.combine(date.fromisoformat(day), datetime.min.time(), tzinfo=UTC)


@pytest.mark.parametrize(
    ("day", "says"),
    [
        (
            "1999-12-31",
            "1999-12-31 is before 2000-01-01: a price starts on a day from 2000-01-01 (a price "
            "that has always applied) to 2028-11-29 (two years from today), e.g. 2026-11-29",
        ),
        (
            "0001-01-01",
            "0001-01-01 is before 2000-01-01: a price starts on a day from 2000-01-01 (a price "
            "that has always applied) to 2028-11-29 (two years from today), e.g. 2026-11-29",
        ),
        (
            "2028-11-30",
            "2028-11-30 is more than two years from today: a price starts on a day from "
            "2000-01-01 (a price that has always applied) to 2028-11-29 (two years from "
            "today), e.g. 2026-11-29",
        ),
    ],
)
def test_a_day_outside_the_range_is_refused_naming_the_range(day: str, says: str) -> None:
    fault = price_day_fault(at(day), today=TODAY)
    assert fault is not None
    assert (fault.field, fault.message) == ("effective_from", says)


def test_the_ends_of_the_range_are_taken() -> None:
    assert price_day_fault(at("2000-01-01"), today=TODAY) is None
    assert price_day_fault(at("2028-11-29"), today=TODAY) is None
    assert price_day_fault(datetime.max.replace(tzinfo=UTC), today=TODAY) is not None
    # two years from a 29 February is the 28th
    assert price_day_fault(at("2030-02-28"), today=date(2028, 2, 29)) is None
    assert price_day_fault(at("2030-03-01"), today=date(2028, 2, 29)) is not None


def test_every_genai_prices_row_is_in_the_range() -> None:
    days = [row["effective_from"] for row in builtin_rows()]
    assert min(days) == PRICE_EPOCH
    assert [d for d in days if price_day_fault(d, today=TODAY) is not None] == []


@pytest.mark.django_db
@pytest.mark.parametrize("day", ["0001-01-01", "1999-12-31", "9999-12-31"])
def test_the_admin_refuses_a_start_day_out_of_range_on_its_field(staff: Client, day: str) -> None:
    refused = staff.post("/admin/costboard/modelprice/add/", {**PRICE, "effective_from_0": day})
    assert refused.status_code == 200
    errors = field_errors(refused.content.decode(), "effective_from")
    assert f"{day} is " in errors
    assert "a price starts on a day from 2000-01-01 (a price that has always applied) to" in (
        errors
    )
    assert not ModelPrice.objects.exists()
    today = timezone.now().date().isoformat()
    added = staff.post("/admin/costboard/modelprice/add/", {**PRICE, "effective_from_0": today})
    assert added.status_code == 302
    assert ModelPrice.objects.get().effective_from == at(today)


@pytest.mark.django_db
def test_price_save_refuses_a_day_out_of_range_whoever_calls_it() -> None:
    price = ModelPrice(
        provider="p",
        model="m",
        input_mtok=Decimal(1),
        output_mtok=Decimal(1),
        effective_from=at("9999-12-31"),
    )
    with pytest.raises(PriceError) as refused:
        pricing_services.price_save(price=price)
    assert refused.value.field == "effective_from"
    assert not ModelPrice.objects.exists()


@pytest.mark.django_db
def test_a_row_stored_with_a_day_out_of_range_is_a_form_error_in_the_rate_list(
    staff: Client,
) -> None:
    """Saved before the range was held: a rate edited in the list's cells is refused with the
    day's fault (not a server error from price_save), and the row is left as it was."""
    price = add_price("oldrow")
    ModelPrice.objects.filter(pk=price.pk).update(effective_from=at("0001-01-01"))
    refused = price_list_edit(staff, price, output_mtok="16.5")
    assert refused.status_code == 200
    assert "effective_from: 0001-01-01 is before 2000-01-01: a price starts on a day" in (
        refused.content.decode()
    )
    price.refresh_from_db()
    assert price.output_mtok == Decimal(15)
