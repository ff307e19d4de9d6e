"""Negotiated rates (docs/pricing.md, "Negotiated rates"): a dated percentage off or on list,
per provider, optionally per model family and project, applied at ingest and by repricing,
the most specific in effect winning; adding, editing or deleting one reprices the steps it
covers and their rollups, and nothing else."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import pytest
from django.db.models import Sum
from django.test import Client

from costboard.models import DailyRollup, PriceAdjustment, Project, Session, Step, UserDailyRollup
from costboard.outbox import outbox_dispatch
from costboard.pricing.explain import price_explanation
from costboard.pricing.services import PriceError, adjustment_save, adjustments_delete
from tests.conftest import TEST_RATES, Agent, add_price, make_agent, usd

pytestmark = pytest.mark.django_db

OCT = datetime(2026, 10, 15, 12, tzinfo=UTC)
NOV = datetime(2026, 11, 15, 12, tzinfo=UTC)
PICO = Decimal("1e-12")


def list_cost(step: Step) -> Decimal:
    """The step's cost at TEST_RATES, each part kept to 12 places."""
    return (
        usd(step.input_tokens, TEST_RATES["input_mtok"])
        + usd(step.output_tokens, TEST_RATES["output_mtok"])
        + usd(step.cache_read_input_tokens, TEST_RATES["cache_read_mtok"])
        + usd(step.cache_creation_input_tokens, TEST_RATES["cache_write_mtok"])
    )


def scaled(step: Step, percent: str) -> Decimal:
    """Each part of the list cost × (1 + pct/100), to 12 places half-even, summed."""
    factor = 1 + Decimal(percent) / 100
    parts = [
        usd(step.input_tokens, TEST_RATES["input_mtok"]),
        usd(step.output_tokens, TEST_RATES["output_mtok"]),
        usd(step.cache_read_input_tokens, TEST_RATES["cache_read_mtok"]),
        usd(step.cache_creation_input_tokens, TEST_RATES["cache_write_mtok"]),
    ]
    return sum(
        ((part * factor).quantize(PICO, rounding=ROUND_HALF_EVEN) for part in parts), Decimal(0)
    )


def adjust(
    percent: str, since: date, *, family: str = "", project: Project | None = None
) -> PriceAdjustment:
    adjustment = PriceAdjustment(
        provider="testco",
        family=family,
        project=project,
        percent=Decimal(percent),
        effective_from=since,
    )
    adjustment_save(adjustment=adjustment)
    outbox_dispatch()
    return adjustment


def step(event_id: str, when: datetime = NOV, model: str = "test-sonnet", **more: Any) -> Any:
    return {
        "event_id": event_id,
        "session_id": f"s-{event_id}",
        "step_type": "response",
        "model": model,
        "provider": "testco",
        "timestamp": when.isoformat(),
        "input_tokens": 1234,
        "output_tokens": 567,
        "cache_read_input_tokens": 8_900,
        "cache_creation_input_tokens": 432,
        **more,
    }


def test_a_step_is_priced_at_list_times_the_factor_exactly(agent: Agent) -> None:
    add_price("test-sonnet")
    adjust("-12.5", date(2026, 11, 1))
    agent.events(step("a"))
    stored = Step.objects.get()
    # 1234 × $3/M × 0.875 and so on: each part exact
    assert stored.cost_input_usd == Decimal(1234) * Decimal(3) / 10**6 * Decimal("0.875")
    assert stored.cost_output_usd == Decimal(567) * Decimal(15) / 10**6 * Decimal("0.875")
    assert stored.cost_usd == list_cost(stored) * Decimal("0.875") == scaled(stored, "-12.5")
    assert stored.cost_usd == Decimal("0.016497") * Decimal("0.875") == Decimal("0.014434875")


def test_a_factor_past_twelve_places_is_rounded_half_even_per_part(agent: Agent) -> None:
    add_price("test-sonnet")
    adjust("-33.3333", date(2026, 11, 1))
    agent.events(step("a", input_tokens=1, output_tokens=0, cache_read_input_tokens=1))
    stored = Step.objects.get()
    # 1 cache read: $0.0000003 × 0.666667 = 0.0000002000001 → 0.000000200000
    assert stored.cost_cache_read_usd == Decimal("0.000000200000")
    assert stored.cost_input_usd == Decimal("0.000002000001")  # 0.000003 × 0.666667
    assert stored.cost_usd == scaled(stored, "-33.3333")


def test_the_most_specific_adjustment_in_effect_wins(agent: Agent) -> None:
    other = make_agent("other")
    add_price("test-sonnet")
    add_price("test-haiku", input_mtok=Decimal(1), output_mtok=Decimal(5))
    adjust("-10", date(2026, 10, 1))  # the provider
    adjust("-20", date(2026, 10, 1), family="test-haiku")  # a family
    adjust("-30", date(2026, 11, 1), project=agent.project)  # a project, from November
    adjust("5", date(2026, 11, 1), family="test-haiku", project=agent.project)
    agent.events(
        step("sonnet-oct", OCT),  # provider's only: the project's starts later
        step("sonnet-nov", NOV),  # the project's
        step("haiku-oct", OCT, model="test-haiku"),  # the family's
        step("haiku-nov", NOV, model="test-haiku"),  # the project's for the family
        step("sonnet-sep", datetime(2026, 9, 30, 23, 59, tzinfo=UTC)),  # before all: list
    )
    other.events(step("o-sonnet", NOV), step("o-haiku", NOV, model="test-haiku"))
    cost = dict(Step.objects.values_list("event_id", "cost_usd"))
    by_id = {s.event_id: s for s in Step.objects.all()}
    assert cost["sonnet-sep"] == list_cost(by_id["sonnet-sep"])
    assert cost["sonnet-oct"] == scaled(by_id["sonnet-oct"], "-10")
    assert cost["sonnet-nov"] == scaled(by_id["sonnet-nov"], "-30")
    haiku = Step.objects.get(event_id="haiku-oct")
    haiku_list = usd(1234, Decimal(1)) + usd(567, Decimal(5))
    haiku_list += usd(8_900, TEST_RATES["cache_read_mtok"])
    haiku_list += usd(432, TEST_RATES["cache_write_mtok"])
    assert haiku.cost_usd == haiku_list * Decimal("0.8")
    assert cost["haiku-nov"] == haiku_list * Decimal("1.05")
    assert cost["o-sonnet"] == scaled(by_id["o-sonnet"], "-10")  # another project
    assert cost["o-haiku"] == haiku_list * Decimal("0.8")


def rollups_match_steps() -> None:
    for project_id in Step.objects.values_list("project_id", flat=True).distinct():
        steps = Step.objects.filter(project_id=project_id).aggregate(c=Sum("cost_usd"))["c"]
        rolled = DailyRollup.objects.filter(project_id=project_id).aggregate(c=Sum("cost_usd"))
        users = UserDailyRollup.objects.filter(project_id=project_id).aggregate(c=Sum("cost_usd"))
        sessions = Session.objects.filter(project_id=project_id).aggregate(c=Sum("cost_usd"))
        assert rolled["c"] == steps == sessions["c"] == users["c"]


def test_an_adjustment_added_later_reprices_what_it_covers_and_nothing_else(
    agent: Agent,
) -> None:
    other = make_agent("other")
    add_price("test-sonnet")
    add_price("test-sonnet", provider="elsewhere")
    agent.events(
        step("covered", NOV),
        step("before", OCT),
        step("elsewhere", NOV, provider="elsewhere"),
    )
    other.events(step("other-project", NOV))
    before = dict(Step.objects.values_list("event_id", "cost_usd"))
    assert all(
        cost == list_cost(Step.objects.get(event_id=event)) for event, cost in before.items()
    )
    rollups_match_steps()

    adjustment = adjust("-12", date(2026, 11, 1), project=agent.project)
    after = dict(Step.objects.values_list("event_id", "cost_usd"))
    covered = Step.objects.get(event_id="covered")
    assert after["covered"] == scaled(covered, "-12") == list_cost(covered) * Decimal("0.88")
    for untouched in ("before", "elsewhere", "other-project"):
        assert after[untouched] == before[untouched]
    rollups_match_steps()
    session = Session.objects.get(external_id="s-covered")
    assert session.cost_usd == after["covered"]
    assert "−12 % negotiated on list for testco (this project) from 2026-11-01" in (
        price_explanation(covered)
    )

    # edited: the new percent and a date that now covers October too
    adjustment.percent = Decimal("-20")
    adjustment.effective_from = date(2026, 10, 1)
    adjustment_save(adjustment=adjustment)
    outbox_dispatch()
    after = dict(Step.objects.values_list("event_id", "cost_usd"))
    assert after["covered"] == scaled(covered, "-20")
    assert after["before"] == scaled(Step.objects.get(event_id="before"), "-20")
    assert after["elsewhere"] == before["elsewhere"]
    assert after["other-project"] == before["other-project"]
    rollups_match_steps()

    # deleted: back to list
    adjustments_delete(adjustments=[adjustment])
    outbox_dispatch()
    assert dict(Step.objects.values_list("event_id", "cost_usd")) == before
    rollups_match_steps()


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"provider": " "}, "provider"),
        ({"percent": Decimal("-100.5")}, "percent"),
        ({"percent": Decimal("1000.01")}, "percent"),
        ({"percent": Decimal("1.00001")}, "percent"),
    ],
)
def test_a_bad_adjustment_is_refused_naming_the_field(fields: dict[str, Any], field: str) -> None:
    values: dict[str, Any] = {
        "provider": "testco",
        "percent": Decimal(-5),
        "effective_from": date(2026, 1, 1),
        **fields,
    }
    with pytest.raises(PriceError) as refused:
        adjustment_save(adjustment=PriceAdjustment(**values))
    assert refused.value.field == field
    assert not PriceAdjustment.objects.exists()


def test_the_admin_adds_an_adjustment_that_reprices_and_shows_beside_the_list_price(
    agent: Agent, staff: Client
) -> None:
    price = add_price("test-sonnet")
    agent.events(step("a", NOV))
    response = staff.post(
        "/admin/costboard/priceadjustment/add/",
        {
            "provider": "TestCo",
            "family": "Test-Sonnet",
            "project": "",
            "percent": "-15",
            "effective_from": "2026-11-01",
            "note": "committed-use contract",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    adjustment = PriceAdjustment.objects.get()
    assert (adjustment.provider, adjustment.family) == ("testco", "test-sonnet")
    outbox_dispatch()
    stored = Step.objects.get()
    assert stored.cost_usd == scaled(stored, "-15")
    prices = staff.get("/admin/costboard/modelprice/").content.decode()
    assert "-15 %" in prices
    detail = staff.get(f"/admin/costboard/step/{stored.pk}/change/").content.decode()
    assert "−15 % negotiated on list for testco test-sonnet from 2026-11-01" in detail
    assert f"testco/test-sonnet price from {price.effective_from:%Y-%m-%d}" in detail
    page = staff.get(f"/sessions/{stored.session_id}/").content.decode()
    shown = re.search(r'data-price-explanation="([^"]*)"', page)
    assert shown is not None
    assert "List cost $0.016497; −15 % negotiated on list for testco test-sonnet" in shown[1]
    assert shown[1].endswith(": $0.01402245.")  # 0.016497 × 0.85
    bad = staff.post(
        "/admin/costboard/priceadjustment/add/",
        {"provider": "testco", "percent": "-150", "effective_from": "2026-11-01"},
    )
    assert bad.status_code == 200 and "from -100 (free) to 1000" in bad.content.decode()
    assert PriceAdjustment.objects.count() == 1


def test_azures_adjustment_scales_its_steps_priced_by_openais_row(agent: Agent) -> None:
    # Azure resells OpenAI's models at OpenAI's list (genai-prices prices them by OpenAI's
    # rows): an Azure step is priced by the openai row, but Azure bills it, so Azure's
    # contract scales it and OpenAI's does not
    add_price("test-gpt", provider="openai")
    for provider, percent in (("azure", "-20"), ("openai", "-50")):
        adjustment_save(
            adjustment=PriceAdjustment(
                provider=provider, percent=Decimal(percent), effective_from=date(2026, 11, 1)
            )
        )
    outbox_dispatch()
    agent.events(
        step("az", model="test-gpt", provider="azure"),
        step("oa", model="test-gpt", provider="openai"),
    )
    azure = Step.objects.get(provider="azure")
    assert azure.price is not None and azure.price.provider == "openai"
    assert azure.cost_usd == scaled(azure, "-20") == list_cost(azure) * Decimal("0.8")
    assert "−20 % negotiated on list for azure from 2026-11-01" in price_explanation(azure)
    openai = Step.objects.get(provider="openai")
    assert openai.cost_usd == scaled(openai, "-50")
