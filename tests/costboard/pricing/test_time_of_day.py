"""Time-of-day prices: a row's daily UTC window, in ingest, repricing, sync_prices and the
admin (genai-prices agreement for every built-in row: test_builtin_prices.py)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, time
from decimal import Decimal
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from costboard.models import DailyRollup, ModelPrice, OutboxItem, Session, Step
from costboard.outbox import outbox_dispatch
from costboard.pricing.rates import forget_rate_table, rate_table, windows_overlap
from costboard.pricing.services import PriceError, price_save
from costboard.pricing.sync import prices_sync
from tests.conftest import Agent, add_price, usd
from tests.costboard.pricing.test_repricing import assert_rollups_match_steps
from tests.costboard.test_admin_amounts import price_list_edit

pytestmark = pytest.mark.django_db

# deepseek-reasoner in genai-prices 0.2.3: standard price 00:30–16:30 UTC, off-peak otherwise
STANDARD = {"input": Decimal("0.55"), "cache_read": Decimal("0.14"), "output": Decimal("2.19")}
OFF_PEAK = {"input": Decimal("0.135"), "cache_read": Decimal("0.035"), "output": Decimal("0.55")}


def reasoner_step(event_id: str, at: str) -> dict[str, Any]:
    return {
        "event_id": event_id,
        "session_id": "s1",
        "turn": 1,
        "step_type": "response",
        "model": "deepseek-reasoner",
        "provider": "deepseek",
        "timestamp": at,
        "input_tokens": 1_000,
        "cache_read_input_tokens": 2_000,
        "output_tokens": 4_000,
    }


def cost_at(rates: dict[str, Decimal]) -> Decimal:
    return (
        usd(1_000, rates["input"]) + usd(2_000, rates["cache_read"]) + usd(4_000, rates["output"])
    )


@pytest.mark.slow
def test_a_deepseek_reasoner_step_at_noon_pays_the_standard_price_and_at_six_pm_off_peak(
    agent: Agent,
) -> None:
    prices_sync()
    peak = ModelPrice.objects.get(model="deepseek-reasoner", window_start__isnull=False)
    assert (peak.window_start, peak.window_end) == (time(0, 30), time(16, 30))
    assert (peak.input_mtok, peak.cache_read_mtok, peak.output_mtok) == tuple(
        STANDARD[k] for k in ("input", "cache_read", "output")
    )
    agent.events(
        reasoner_step("noon", "2026-11-20T12:00:00Z"),
        reasoner_step("evening", "2026-11-20T18:00:00Z"),
    )
    noon = Step.objects.get(event_id="noon")
    evening = Step.objects.get(event_id="evening")
    assert noon.price_id == peak.pk
    assert noon.cost_input_usd == Decimal("0.00055")  # 1,000 × $0.55 per million
    assert noon.cost_cache_read_usd == Decimal("0.00028")  # 2,000 × $0.14
    assert noon.cost_output_usd == Decimal("0.00876")  # 4,000 × $2.19
    assert noon.cost_usd == cost_at(STANDARD) == Decimal("0.00959")
    assert evening.price is not None
    assert evening.price.window_start is None  # the all-day (off-peak) row
    assert evening.cost_input_usd == Decimal("0.000135")
    assert evening.cost_cache_read_usd == Decimal("0.00007")
    assert evening.cost_output_usd == Decimal("0.0022")
    assert evening.cost_usd == cost_at(OFF_PEAK) == Decimal("0.002405")
    assert Session.objects.get(external_id="s1").cost_usd == Decimal("0.011995")
    assert DailyRollup.objects.get().cost_usd == Decimal("0.011995")


def windowed_series() -> tuple[ModelPrice, ModelPrice]:
    all_day = add_price("test-tod", input_mtok=Decimal(1))
    night = add_price("test-tod", input_mtok=Decimal(2), window_start=time(22), window_end=time(6))
    return all_day, night


@pytest.mark.parametrize(
    ("at", "row"),
    [
        ("2026-11-20T21:59:59.999999Z", "all_day"),
        ("2026-11-20T22:00:00Z", "night"),
        ("2026-11-20T23:30:00Z", "night"),
        ("2026-11-21T00:00:00Z", "night"),
        ("2026-11-21T05:59:59.999999Z", "night"),
        ("2026-11-21T06:00:00Z", "all_day"),
        ("2026-11-21T12:00:00Z", "all_day"),
        ("2026-11-21T09:30:00+05:00", "night"),  # 04:30 UTC: the window is in UTC
    ],
)
def test_a_window_may_wrap_midnight(agent: Agent, at: str, row: str) -> None:
    all_day, night = windowed_series()
    agent.events({"step_type": "x", "model": "test-tod", "timestamp": at, "input_tokens": 10**6})
    step = Step.objects.get()
    expected = {"all_day": all_day, "night": night}[row]
    assert step.price_id == expected.pk
    assert step.cost_usd == expected.input_mtok


def test_a_newer_all_day_price_beats_an_older_window(agent: Agent) -> None:
    add_price("test-tod", input_mtok=Decimal(1))
    window = add_price("test-tod", input_mtok=Decimal(2), window_start=time(0), window_end=time(12))
    newer = add_price(
        "test-tod", input_mtok=Decimal(3), effective_from=datetime(2026, 6, 1, tzinfo=UTC)
    )
    agent.events(
        {"event_id": "before", "step_type": "x", "model": "test-tod", "input_tokens": 10**6,
         "timestamp": "2026-05-31T08:00:00Z"},
        {"event_id": "after", "step_type": "x", "model": "test-tod", "input_tokens": 10**6,
         "timestamp": "2026-06-01T08:00:00Z"},
    )  # fmt: skip
    assert Step.objects.get(event_id="before").price_id == window.pk
    assert Step.objects.get(event_id="after").price_id == newer.pk


def test_a_window_that_misses_the_time_is_left_out_even_on_the_latest_date(agent: Agent) -> None:
    older = add_price("test-tod", input_mtok=Decimal(1))
    morning = add_price(
        "test-tod",
        input_mtok=Decimal(5),
        effective_from=datetime(2026, 6, 1, tzinfo=UTC),
        window_start=time(0),
        window_end=time(12),
    )
    table = rate_table()
    when = datetime(2026, 7, 1, 8, tzinfo=UTC)
    rate = table.rate_at("test-tod", "", when)
    assert rate is not None and rate.id == morning.pk
    later = when.replace(hour=15)
    rate = table.rate_at("test-tod", "", later)
    assert rate is not None and rate.id == older.pk
    cost = table.price(
        model="test-tod",
        provider="",
        when=later,
        input_tokens=10**6,
        output_tokens=0,
        cache_read_input_tokens=0,
        cache_creation_input_tokens=0,
    )
    assert (cost.price_id, cost.total) == (older.pk, Decimal(1))


def test_windows_overlap_across_midnight() -> None:
    hour = 3600 * 10**6
    assert windows_overlap((22 * hour, 6 * hour), (5 * hour, 7 * hour))
    assert windows_overlap((22 * hour, 6 * hour), (23 * hour, 1 * hour))
    assert not windows_overlap((22 * hour, 6 * hour), (6 * hour, 22 * hour))
    assert not windows_overlap((1 * hour, 4 * hour), (6 * hour, 10 * hour))


@pytest.mark.slow
def test_sync_prices_reprices_the_steps_the_new_windows_cover(agent: Agent) -> None:
    """Before this change the peak rows were not imported: a noon step paid off-peak. The
    next sync_prices adds them and reprices the steps of the models they cover."""
    prices_sync()
    ModelPrice.objects.filter(window_start__isnull=False).delete()
    forget_rate_table()
    agent.events(
        reasoner_step("noon", "2026-11-20T12:00:00Z"),
        reasoner_step("evening", "2026-11-20T18:00:00Z"),
    )
    assert Session.objects.get(external_id="s1").cost_usd == 2 * cost_at(OFF_PEAK)

    out = io.StringIO()
    call_command("sync_prices", stdout=out)  # no broker in tests: it dispatches the repricing
    assert "14 created, 0 updated" in out.getvalue()
    assert Step.objects.get(event_id="noon").cost_usd == cost_at(STANDARD)
    assert Step.objects.get(event_id="evening").cost_usd == cost_at(OFF_PEAK)
    session = Session.objects.get(external_id="s1")
    assert session.cost_usd == cost_at(STANDARD) + cost_at(OFF_PEAK)
    assert_rollups_match_steps()


@pytest.mark.slow
def test_sync_prices_is_idempotent_and_keeps_an_admin_edited_window(db: None) -> None:
    first = prices_sync()
    assert first.created > 2000
    again = prices_sync()
    assert (again.created, again.updated, again.removed) == (0, 0, 0)
    peak = ModelPrice.objects.get(model="deepseek-chat", window_start__isnull=False)
    peak.window_end = time(17)
    peak.input_mtok = Decimal("0.3")
    price_save(price=peak)
    third = prices_sync()
    assert (third.created, third.updated, third.removed) == (0, 0, 0)
    assert third.kept_admin_edits == 1
    peak.refresh_from_db()
    assert (peak.window_end, peak.input_mtok, peak.edited_by_admin) == (
        time(17),
        Decimal("0.3"),
        True,
    )


@pytest.mark.slow
def test_sync_prices_removes_a_builtin_window_the_data_no_longer_has(agent: Agent) -> None:
    prices_sync()
    gone = ModelPrice.objects.create(
        provider="deepseek",
        model="deepseek-chat",
        window_start=time(20),
        window_end=time(22),
        input_mtok=Decimal(9),
        source=ModelPrice.Source.BUILTIN,
    )
    agent.events(
        {"event_id": "late", "step_type": "x", "model": "deepseek-chat", "provider": "deepseek",
         "timestamp": "2026-11-20T21:00:00Z", "input_tokens": 10**6},
    )  # fmt: skip
    assert Step.objects.get().price_id == gone.pk
    out = io.StringIO()
    call_command("sync_prices", stdout=out)
    assert "1 removed" in out.getvalue()
    assert not ModelPrice.objects.filter(pk=gone.pk).exists()
    step = Step.objects.get()
    assert step.price is not None and step.price.window_start is None
    assert step.cost_usd == Decimal("0.135")  # deepseek-chat's off-peak input rate
    assert_rollups_match_steps()


ADMIN_FORM = {
    "provider": "testco",
    "model": "test-tod",
    "model_regex": "",
    "input_mtok": "2",
    "output_mtok": "0",
    "cache_read_mtok": "",
    "cache_write_mtok": "",
    "cache_write_1h_mtok": "",
    "tiers": "[]",
    "context_window": "",
    "effective_from_0": "2000-01-01",
    "effective_from_1": "00:00:00",
    "window_start": "",
    "window_end": "",
    "source": "manual",
    "external_id": "",
}


def admin_errors(response: Any) -> dict[str, list[str]]:
    assert response.status_code == 200, response.status_code
    return {
        field: list(errors) for field, errors in response.context["adminform"].form.errors.items()
    }


@pytest.mark.parametrize(
    ("start", "end", "field", "message"),
    [
        ("01:00", "", "window_end", "set both window start and window end"),
        ("", "04:00", "window_start", "set both window start and window end"),
        ("01:00", "01:00", "window_end", "must differ from window start"),
        ("21:00", "23:00", "window_start", "overlaps the 22:00–06:00 UTC window"),
        ("05:00", "07:00", "window_start", "overlaps the 22:00–06:00 UTC window"),
        ("25:00", "07:00", "window_start", "Enter a valid time"),
    ],
)
def test_the_admin_refuses_a_bad_window_naming_the_field(
    staff: Client, start: str, end: str, field: str, message: str
) -> None:
    windowed_series()
    response = staff.post(
        "/admin/costboard/modelprice/add/",
        {**ADMIN_FORM, "window_start": start, "window_end": end,
         "effective_from_1": "00:00:00"},
    )  # fmt: skip
    errors = admin_errors(response)
    assert field in errors, errors
    assert any(message in e for e in errors[field]), errors
    assert ModelPrice.objects.filter(model="test-tod").count() == 2


@pytest.mark.parametrize(("provider", "model"), [("testco", "Test-TOD"), ("TestCo", "test-tod")])
def test_a_window_overlapping_one_of_its_model_in_other_letters_is_refused(
    staff: Client, provider: str, model: str
) -> None:
    # the rate table reads names in lower case, so this row is test-tod's: its window overlapped
    # the night's unseen (the rule compared names exactly) and 23:00 had two prices
    windowed_series()
    response = staff.post(
        "/admin/costboard/modelprice/add/",
        {**ADMIN_FORM, "provider": provider, "model": model, "window_start": "21:00",
         "window_end": "23:00"},
    )  # fmt: skip
    errors = admin_errors(response)
    assert any("overlaps the 22:00–06:00 UTC window" in e for e in errors["window_start"]), errors
    assert ModelPrice.objects.filter(model__iexact="test-tod").count() == 2


def test_a_second_all_day_price_of_a_model_in_other_letters_is_refused(staff: Client) -> None:
    windowed_series()
    response = staff.post(
        "/admin/costboard/modelprice/add/",
        {**ADMIN_FORM, "provider": "TestCo", "model": "TEST-tod"},
    )
    errors = admin_errors(response)
    assert any("another all-day price of this model" in e for e in errors["model"]), errors
    price = ModelPrice(
        provider="testco", model="Test-Tod", source=ModelPrice.Source.MANUAL, input_mtok=Decimal(5)
    )
    with pytest.raises(PriceError) as raised:
        price_save(price=price)
    assert raised.value.field == "model"
    assert ModelPrice.objects.filter(model__iexact="test-tod").count() == 2
    assert not OutboxItem.objects.exists()
    other_day = {**ADMIN_FORM, "model": "TEST-tod", "effective_from_0": "2026-01-01"}
    assert staff.post("/admin/costboard/modelprice/add/", other_day).status_code == 302


WINDOW_FAULTS = [
    (time(1), None, "window_end", "set both window start and window end"),
    (None, time(4), "window_start", "set both window start and window end"),
    (time(1), time(1), "window_end", "must differ from window start"),
    (time(21), time(23), "window_start", "overlaps the 22:00–06:00 UTC window"),
    (time(5), time(7), "window_start", "overlaps the 22:00–06:00 UTC window"),
]


@pytest.mark.parametrize(("start", "end", "field", "message"), WINDOW_FAULTS)
def test_the_price_service_refuses_a_bad_window_as_the_admin_does(
    db: None, start: time | None, end: time | None, field: str, message: str
) -> None:
    """The rule is the service's: a caller that is not the admin's form meets it too."""
    windowed_series()
    price = ModelPrice(
        provider="testco", model="test-tod", source=ModelPrice.Source.MANUAL,
        input_mtok=Decimal(5), window_start=start, window_end=end,
    )  # fmt: skip
    with pytest.raises(PriceError) as raised:
        price_save(price=price)
    assert (raised.value.field, message in raised.value.message) == (field, True)
    assert ModelPrice.objects.filter(model="test-tod").count() == 2  # nothing stored
    assert not OutboxItem.objects.exists()  # nor a repricing queued


def test_the_price_service_lets_a_window_move_past_its_own_old_place(db: None) -> None:
    _, night = windowed_series()
    night.window_start, night.window_end = time(23), time(5)  # inside its old self: no overlap
    price_save(price=night)
    beside = ModelPrice(
        provider="testco", model="test-tod", source=ModelPrice.Source.MANUAL,
        input_mtok=Decimal(5), window_start=time(6), window_end=time(9),
    )  # fmt: skip
    price_save(price=beside)  # 06:00 is where the night window ends: they share no time
    assert ModelPrice.objects.filter(model="test-tod").count() == 3


def test_a_window_added_in_the_admin_reprices_the_steps_inside_it(
    staff: Client, agent: Agent
) -> None:
    all_day = add_price("test-tod", input_mtok=Decimal(1))
    agent.events(
        {"event_id": "in", "session_id": "s1", "step_type": "x", "model": "test-tod",
         "timestamp": "2026-11-20T02:00:00Z", "input_tokens": 10**6},
        {"event_id": "out", "session_id": "s1", "step_type": "x", "model": "test-tod",
         "timestamp": "2026-11-20T05:00:00Z", "input_tokens": 10**6},
    )  # fmt: skip
    response = staff.post(
        "/admin/costboard/modelprice/add/",
        {**ADMIN_FORM, "window_start": "01:00", "window_end": "04:00"},
    )
    assert response.status_code == 302, admin_errors(response)
    assert outbox_dispatch().kinds.get("prices.reprice") == 1
    window = ModelPrice.objects.get(model="test-tod", window_start__isnull=False)
    assert (window.window_start, window.window_end) == (time(1), time(4))
    assert Step.objects.get(event_id="in").price_id == window.pk
    assert Step.objects.get(event_id="in").cost_usd == Decimal(2)
    assert Step.objects.get(event_id="out").price_id == all_day.pk
    assert Session.objects.get(external_id="s1").cost_usd == Decimal(3)
    assert_rollups_match_steps()

    # and the change list shows it
    listing = staff.get("/admin/costboard/modelprice/?q=test-tod")
    assert "01:00–04:00" in listing.content.decode()


def test_the_database_refuses_half_a_window(db: None) -> None:
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        add_price("test-tod", window_start=time(1))
    with pytest.raises(IntegrityError), transaction.atomic():
        add_price("test-tod", window_start=time(1), window_end=time(1))
    add_price("test-tod", window_start=time(1), window_end=time(2))
    add_price("test-tod")  # an all-day row beside it, same date
    with pytest.raises(IntegrityError), transaction.atomic():
        add_price("test-tod")  # but one all-day row a date


def test_the_rate_lists_cells_of_a_row_whose_twin_predates_the_rule_say_why_not_saved(
    staff: Client,
) -> None:
    # two all-day rows of one model in other letters, stored before the rule held: editing a
    # rate in the list's cells meets price_save's refusal, shown on the list, not a 500
    twin = add_price("Test-TOD", input_mtok=Decimal(1))
    add_price("test-tod", input_mtok=Decimal(2))
    response = price_list_edit(staff, twin, input_mtok="3")
    assert response.status_code == 200
    assert "another all-day price of this model" in response.content.decode()
    twin.refresh_from_db()
    assert twin.input_mtok == Decimal(1)
