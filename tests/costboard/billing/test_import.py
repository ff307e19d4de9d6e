"""The billing import against a local fake of each provider's API (tests/costboard/billing/
fakes.py), reached by the real clients through COSTBOARD_*_API_BASE: every day stored to the
cent, pagination followed, a 429 waited out by its Retry-After and a 5xx by a doubling
backoff (the sleeps recorded, never slept), re-import changes nothing, a failure keeps the
days stored before it and stores nothing after, and a garbage answer is refused naming the
provider and the field."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import pytest
import time_machine
from django.core.management import CommandError, call_command
from django.utils import timezone

from costboard.billing.providers import MAX_ATTEMPTS, REPORTS, Client
from costboard.billing.services import (
    ImportFailed,
    ProviderError,
    billing_import,
    provider_project_delete,
    provider_project_save,
    scheduled_import,
)
from costboard.models import BilledUsage, Project, ProviderProject
from tests.conftest import run_in_threads
from tests.costboard.billing.fakes import (
    ANTHROPIC_KEY,
    ANTHROPIC_PATHS,
    OPENAI_KEY,
    OPENAI_PATHS,
    FakeBilling,
    Fault,
    Number,
    Params,
)

pytestmark = pytest.mark.django_db

DAYS = [date(2026, 11, 1) + timedelta(days=n) for n in range(5)]
FIRST, LAST = DAYS[0], DAYS[-1]
COMPARED = (
    "provider",
    "source",
    "day",
    "model",
    "line_item",
    "provider_project",
    "project_id",
    "provider_api_key",
    "service_tier",
    "cost_usd",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "requests",
)


def no_sleep(seconds: float) -> None:
    """A sleep for the tests that do not read the waits."""


def openai_costs(n: int, scale: int = 1) -> list[dict[str, Any]]:
    return [
        {
            "amount": {"value": Number(f"{scale}.2{n}4567"), "currency": "usd"},
            "line_item": "gpt-4o-2024-08-06, input",
            "project_id": "proj_alpha",
        },
        {
            "amount": {"value": Number("0.5"), "currency": "usd"},
            "line_item": "gpt-4o-2024-08-06, output",
            "project_id": "proj_beta",
        },
        {
            "amount": {"value": Number("3"), "currency": "usd"},
            "line_item": "web search tool calls",
            "project_id": None,
        },
    ]


def openai_usage(n: int) -> list[dict[str, Any]]:
    return [
        {
            "input_tokens": 1000 + n,
            "output_tokens": 500,
            "input_cached_tokens": 200,
            "input_audio_tokens": 0,
            "output_audio_tokens": 0,
            "num_model_requests": 5,
            "project_id": "proj_alpha",
            "user_id": None,
            "api_key_id": "key_1",
            "model": "gpt-4o-2024-08-06",
            "batch": False,
            "service_tier": "default",
        },
        {
            "input_tokens": 300,
            "output_tokens": 100,
            "input_cached_tokens": 0,
            "num_model_requests": 1,
            "project_id": "proj_beta",
            "user_id": None,
            "api_key_id": "key_2",
            "model": "gpt-4o-mini",
            "batch": True,
            "service_tier": None,
        },
    ]


def anthropic_costs(n: int) -> list[dict[str, Any]]:
    return [
        {
            "currency": "USD",
            "amount": "123.45",  # cents
            "workspace_id": "wrkspc_a",
            "description": "Claude Sonnet 4.5 Usage - Input Tokens",
            "cost_type": "tokens",
            "context_window": "0-200k",
            "model": "claude-sonnet-4-5",
            "service_tier": "standard",
            "token_type": "uncached_input_tokens",
        },
        {
            "currency": "USD",
            "amount": f"{250 + n}.5",
            "workspace_id": None,
            "description": "Claude Sonnet 4.5 Usage - Output Tokens - Batch",
            "cost_type": "tokens",
            "context_window": "0-200k",
            "model": "claude-sonnet-4-5",
            "service_tier": "batch",
            "token_type": "output_tokens",
        },
        {
            "currency": "USD",
            "amount": "1000",
            "workspace_id": "wrkspc_a",
            "description": "Web Search",
            "cost_type": "web_search",
            "context_window": None,
            "model": None,
            "service_tier": None,
            "token_type": None,
        },
    ]


def anthropic_usage(n: int) -> list[dict[str, Any]]:
    return [
        {
            "uncached_input_tokens": 4000,
            "cache_creation": {"ephemeral_1h_input_tokens": 100, "ephemeral_5m_input_tokens": 50},
            "cache_read_input_tokens": 700,
            "output_tokens": 900 + n,
            "server_tool_use": {"web_search_requests": 2},
            "api_key_id": "apikey_1",
            "workspace_id": "wrkspc_a",
            "model": "claude-sonnet-4-5",
            "service_tier": "standard",
            "context_window": "0-200k",
        }
    ]


@pytest.fixture
def fake(settings: Any) -> Iterator[FakeBilling]:
    server = FakeBilling(page_size=2).start()
    server.results = {
        OPENAI_PATHS["costs"]: {day: openai_costs(n) for n, day in enumerate(DAYS)},
        OPENAI_PATHS["usage"]: {day: openai_usage(n) for n, day in enumerate(DAYS)},
        ANTHROPIC_PATHS["costs"]: {day: anthropic_costs(n) for n, day in enumerate(DAYS)},
        ANTHROPIC_PATHS["usage"]: {day: anthropic_usage(n) for n, day in enumerate(DAYS)},
    }
    settings.COSTBOARD_OPENAI_ADMIN_KEY = OPENAI_KEY
    settings.COSTBOARD_ANTHROPIC_ADMIN_KEY = ANTHROPIC_KEY
    settings.COSTBOARD_OPENAI_API_BASE = server.base_url
    settings.COSTBOARD_ANTHROPIC_API_BASE = server.base_url + "/"
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def acme(db: None) -> Project:
    project = Project.objects.create(name="Acme", slug="acme")
    ProviderProject.objects.create(provider="openai", external_id="proj_alpha", project=project)
    ProviderProject.objects.create(provider="anthropic", external_id="wrkspc_a", project=project)
    return project


def stored(**filters: Any) -> list[tuple[Any, ...]]:
    """The rows' values, in one order on both databases (a null first, as an empty text)."""
    rows = BilledUsage.objects.filter(**filters).values_list(*COMPARED)
    return sorted(rows, key=lambda row: (row[2], row[1], *(str(v or "") for v in row[3:6])))


def total(field: str, **filters: Any) -> Any:
    """The sum of a column over the rows that report it."""
    values = [getattr(row, field) for row in BilledUsage.objects.filter(**filters)]
    return sum(value for value in values if value is not None)


# --- what is stored ------------------------------------------------------------------------------


def test_openai_stores_every_day_to_the_cent_following_every_page(
    fake: FakeBilling, acme: Project
) -> None:
    sleeps: list[float] = []
    result = billing_import("openai", FIRST, LAST, sleep=sleeps.append)

    assert result.days == DAYS
    assert result.rows == {"openai_costs": 15, "openai_usage": 10}
    assert sleeps == []
    day3 = stored(day=DAYS[2], source="openai_costs")
    assert day3 == [
        ("openai", "openai_costs", DAYS[2], None, "web search tool calls", None, None, None, None,
         Decimal(3), None, None, None, None, None),
        ("openai", "openai_costs", DAYS[2], "gpt-4o-2024-08-06", "gpt-4o-2024-08-06, input",
         "proj_alpha", acme.pk, None, None, Decimal("1.224567"), None, None, None, None, None),
        ("openai", "openai_costs", DAYS[2], "gpt-4o-2024-08-06", "gpt-4o-2024-08-06, output",
         "proj_beta", None, None, None, Decimal("0.5"), None, None, None, None, None),
    ]  # fmt: skip
    usage = stored(day=DAYS[4], source="openai_usage")
    assert usage == [
        # input excludes the cached tokens OpenAI counts in it: 1004 - 200
        ("openai", "openai_usage", DAYS[4], "gpt-4o-2024-08-06", None, "proj_alpha", acme.pk,
         "key_1", "default", None, 804, 500, 200, None, 5),
        ("openai", "openai_usage", DAYS[4], "gpt-4o-mini", None, "proj_beta", None, "key_2",
         "batch", None, 300, 100, 0, None, 1),
    ]  # fmt: skip
    # every day's cost, to the cent and below: Σ 1.2n4567 + 5 × (0.5 + 3)
    assert total("cost_usd", provider="openai") == Decimal("6.122835") + Decimal("17.5")
    assert total("cost_usd", project=acme) == Decimal("6.122835")

    # the documented request: Bearer admin key, Unix-second bounds, daily buckets, group_by[],
    # at most 31 buckets, then each next_page until has_more is false (5 days, 2 a page)
    for path, groups in (
        (OPENAI_PATHS["costs"], ["project_id", "line_item"]),
        (OPENAI_PATHS["usage"], ["model", "project_id", "api_key_id", "service_tier", "batch"]),
    ):
        asked = fake.asked(path)
        assert len(asked) == 3
        first = asked[0]
        assert first.headers["Authorization"] == f"Bearer {OPENAI_KEY}"
        assert first.params["start_time"] == ["1793491200"]  # 2026-11-01T00:00:00Z
        assert first.params["end_time"] == ["1793923200"]  # 2026-11-06T00:00:00Z, exclusive
        assert first.params["bucket_width"] == ["1d"]
        assert first.params["group_by[]"] == groups
        assert first.params["limit"] == ["5"]
        assert "page" not in first.params
        assert [r.params["page"] for r in asked[1:]] == [["cGFnZV8y"], ["cGFnZV80"]]


def test_anthropic_stores_every_day_with_amounts_in_cents_read_as_dollars(
    fake: FakeBilling, acme: Project
) -> None:
    result = billing_import("anthropic", FIRST, LAST, sleep=no_sleep)

    assert result.days == DAYS
    assert result.rows == {"anthropic_cost_report": 15, "anthropic_usage": 5}
    costs = stored(day=DAYS[1], source="anthropic_cost_report")
    assert [(row[3], row[4], row[5], row[6], row[8], row[9]) for row in costs] == [
        (None, "Web Search", "wrkspc_a", acme.pk, None, Decimal("10")),
        ("claude-sonnet-4-5", "Claude Sonnet 4.5 Usage - Input Tokens", "wrkspc_a", acme.pk,
         "standard", Decimal("1.2345")),
        ("claude-sonnet-4-5", "Claude Sonnet 4.5 Usage - Output Tokens - Batch", None, None,
         "batch", Decimal("2.515")),
    ]  # fmt: skip
    (usage,) = stored(day=DAYS[3], source="anthropic_usage")
    assert usage[3:] == (
        "claude-sonnet-4-5", None, "wrkspc_a", acme.pk, "apikey_1", "standard", None,
        4000, 903, 700, 150, None,
    )  # fmt: skip
    # 5 × ($1.2345 + $10) + ($2.50 + $2.51 + … + $2.54) + 5 × $0.005
    assert total("cost_usd", provider="anthropic") == Decimal("56.1725") + Decimal(
        "12.6"
    ) + Decimal("0.025")

    for path, groups in (
        (ANTHROPIC_PATHS["costs"], ["workspace_id", "description"]),
        (ANTHROPIC_PATHS["usage"], ["model", "workspace_id", "api_key_id", "service_tier"]),
    ):
        asked = fake.asked(path)
        assert len(asked) == 3
        first = asked[0]
        assert first.headers["X-Api-Key"] == ANTHROPIC_KEY
        assert first.headers["Anthropic-Version"] == "2023-06-01"
        assert "Authorization" not in first.headers
        assert first.params["starting_at"] == ["2026-11-01T00:00:00Z"]
        assert first.params["ending_at"] == ["2026-11-06T00:00:00Z"]
        assert first.params["group_by[]"] == groups
        assert first.params["bucket_width"] == ["1d"]


def test_reimporting_changes_nothing(fake: FakeBilling, acme: Project) -> None:
    billing_import("openai", FIRST, LAST, sleep=no_sleep)
    billing_import("anthropic", FIRST, LAST, sleep=no_sleep)
    before = stored()
    billing_import("openai", FIRST, LAST, sleep=no_sleep)
    billing_import("anthropic", DAYS[1], DAYS[3], sleep=no_sleep)
    assert stored() == before
    assert BilledUsage.objects.count() == 45


def test_rows_sent_by_hand_survive_an_import_of_their_day(fake: FakeBilling, acme: Project) -> None:
    BilledUsage.objects.create(
        provider="openai", source="csv", day=DAYS[0], cost_usd=Decimal("9.99")
    )
    billing_import("openai", FIRST, FIRST, sleep=no_sleep)
    assert stored(source="csv")[0][9] == Decimal("9.99")


def test_amounts_are_read_as_decimal_from_the_json_text(fake: FakeBilling) -> None:
    """A 20-digit amount survives whole: no float on the way (the client, not the column);
    a line item's model is what precedes its first comma."""
    fake.results[OPENAI_PATHS["costs"]] = {
        FIRST: [
            {"amount": {"value": Number("0.12345678901234567891"), "currency": "usd"}},
            {
                "amount": {"value": "2.5", "currency": "USD"},
                "line_item": "gpt-4o-mini-2024-07-18, cached input, batch",
                "project_id": "proj_alpha",
            },
        ]
    }
    client = Client.configured("openai", sleep=no_sleep)
    [(day, [exact, batch])] = list(client.buckets(REPORTS["openai"][0], FIRST, FIRST))
    assert (day, exact.cost_usd, exact.model) == (FIRST, Decimal("0.12345678901234567891"), None)
    assert (batch.model, batch.cost_usd) == ("gpt-4o-mini-2024-07-18", Decimal("2.5"))


# --- retries -----------------------------------------------------------------------------------


def test_a_429_is_retried_after_its_retry_after(fake: FakeBilling, acme: Project) -> None:
    fake.fault(OPENAI_PATHS["costs"], Fault(429, headers={"Retry-After": "7"}))
    sleeps: list[float] = []
    result = billing_import("openai", FIRST, LAST, sleep=sleeps.append)
    assert sleeps == [7.0]
    assert result.rows == {"openai_costs": 15, "openai_usage": 10}
    assert len(fake.asked(OPENAI_PATHS["costs"])) == 4  # the refused one, then three pages


def test_a_5xx_is_retried_with_a_doubling_backoff(fake: FakeBilling, acme: Project) -> None:
    fake.fault(ANTHROPIC_PATHS["usage"], Fault(503, times=2))
    fake.fault(ANTHROPIC_PATHS["usage"], Fault(429))  # no Retry-After: backoff, doubling on
    sleeps: list[float] = []
    result = billing_import("anthropic", FIRST, LAST, sleep=sleeps.append)
    assert sleeps == [1.0, 2.0, 4.0]
    assert result.rows == {"anthropic_cost_report": 15, "anthropic_usage": 5}


@pytest.mark.parametrize("status", [200, 503])
def test_an_answer_cut_off_midway_is_retried_as_a_connection_failure(
    fake: FakeBilling, acme: Project, status: int
) -> None:
    # the connection closed before the body its Content-Length told: retried, not a traceback
    fake.fault(OPENAI_PATHS["usage"], Fault(status, body=b'{"data": [], "has_more": 0}', cut=True))
    sleeps: list[float] = []
    result = billing_import("openai", FIRST, LAST, sleep=sleeps.append)
    assert sleeps == [1.0]
    assert result.rows == {"openai_costs": 15, "openai_usage": 10}


def test_an_answer_always_cut_off_gives_up_naming_the_provider(
    fake: FakeBilling, acme: Project
) -> None:
    fake.fault(OPENAI_PATHS["costs"], Fault(200, cut=True, times=100))
    with pytest.raises(ImportFailed) as failed:
        billing_import("openai", FIRST, LAST, sleep=no_sleep)
    assert str(failed.value).startswith("openai: /v1/organization/costs: unreachable (")
    assert str(failed.value).endswith(f"gave up after {MAX_ATTEMPTS} attempts")
    assert BilledUsage.objects.count() == 0


def test_a_5xx_that_lasts_gives_up_naming_the_provider(fake: FakeBilling, acme: Project) -> None:
    fake.fault(OPENAI_PATHS["costs"], Fault(500, times=100))
    sleeps: list[float] = []
    with pytest.raises(ImportFailed) as failed:
        billing_import("openai", FIRST, LAST, sleep=sleeps.append)
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert len(fake.asked(OPENAI_PATHS["costs"])) == MAX_ATTEMPTS
    assert str(failed.value).startswith("openai: /v1/organization/costs: HTTP 500")
    assert failed.value.result.days == []
    assert BilledUsage.objects.count() == 0


def test_a_failure_keeps_the_days_before_it_and_stores_nothing_after(
    fake: FakeBilling, acme: Project
) -> None:
    billing_import("openai", FIRST, LAST, sleep=no_sleep)
    before = {day: stored(day=day) for day in DAYS}
    # new figures for every day; the usage API down for the windows from the third day on
    fake.results[OPENAI_PATHS["costs"]] = {day: openai_costs(n, 7) for n, day in enumerate(DAYS)}
    third = str(1793491200 + 2 * 86400)

    def from_the_third_day(params: Params) -> bool:
        return int(params["start_time"][0]) >= int(third)

    fake.fault(OPENAI_PATHS["usage"], Fault(502, times=100, when=from_the_third_day))
    with pytest.raises(ImportFailed) as failed:
        billing_import("openai", FIRST, LAST, sleep=no_sleep, window_days=2)

    assert failed.value.result.days == DAYS[:2], failed.value
    for n, day in enumerate(DAYS[:2]):  # the new figures, both sources, whole
        assert total("cost_usd", day=day, source="openai_costs") == Decimal(
            f"7.2{n}4567"
        ) + 3 + Decimal("0.5")
        assert len(stored(day=day, source="openai_usage")) == 2
    for day in DAYS[2:]:  # untouched: the figures of the import before
        assert stored(day=day) == before[day]


# --- garbage -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "path", "body", "field", "says"),
    [
        ("openai", OPENAI_PATHS["costs"], b"<html>bad gateway</html>", "/v1/organization/costs",
         "the answer is not JSON"),
        ("openai", OPENAI_PATHS["costs"],
         b'{"object": "page", "data": [{"start_time": 1793491200, "results": '
         b'[{"line_item": "x"}]}], "has_more": false, "next_page": null}',
         "data[0].results[0].amount", "missing"),
        ("openai", OPENAI_PATHS["usage"],
         b'{"data": [{"start_time": 1793491200, "results": [{"input_tokens": "12", '
         b'"output_tokens": 1}]}], "has_more": false}', "data[0].results[0].input_tokens",
         "whole number"),
        ("openai", OPENAI_PATHS["costs"], b'{"data": [], "has_more": "no"}', "has_more",
         "true or false"),
        ("anthropic", ANTHROPIC_PATHS["costs"],
         b'{"data": [{"starting_at": "2026-11-01T00:00:00Z", "results": [{"amount": "1.0", '
         b'"currency": "EUR"}]}], "has_more": false}', "data[0].results[0].currency", "only USD"),
        ("anthropic", ANTHROPIC_PATHS["usage"],
         b'{"data": [{"starting_at": "2026-11-01T00:00:00Z", "results": [{"output_tokens": 5}]}], '
         b'"has_more": false, "next_page": null}', "data[0].results[0].uncached_input_tokens",
         "missing"),
        ("anthropic", ANTHROPIC_PATHS["costs"], b'{"has_more": false}', "data", "missing"),
        # Decimal() would read fullwidth digits as 12: an amount is written in 0-9
        ("anthropic", ANTHROPIC_PATHS["costs"],
         '{"data": [{"starting_at": "2026-11-01T00:00:00Z", "results": [{"amount": "１２", '
         '"currency": "USD"}]}], "has_more": false}'.encode(), "data[0].results[0].amount",
         "has a digit that is not 0-9"),
    ],
)  # fmt: skip
def test_a_garbage_answer_is_refused_naming_provider_and_field(
    fake: FakeBilling, acme: Project, provider: str, path: str, body: bytes, field: str, says: str
) -> None:
    fake.fault(path, Fault(200, body=body))
    with pytest.raises(ImportFailed) as failed:
        billing_import(provider, FIRST, LAST, sleep=no_sleep)
    assert (failed.value.provider, failed.value.field) == (provider, field)
    assert says in failed.value.message
    assert str(failed.value).startswith(f"{provider}: {field}: ")
    assert BilledUsage.objects.count() == 0  # nothing of the window stored


def test_a_refused_key_names_its_variable(fake: FakeBilling, settings: Any) -> None:
    settings.COSTBOARD_OPENAI_ADMIN_KEY = "sk-not-admin"
    with pytest.raises(ImportFailed, match=r"HTTP 401 .*COSTBOARD_OPENAI_ADMIN_KEY"):
        billing_import("openai", FIRST, LAST, sleep=no_sleep)


def test_no_key_names_its_variable(settings: Any) -> None:
    settings.COSTBOARD_ANTHROPIC_ADMIN_KEY = ""
    with pytest.raises(ProviderError, match="COSTBOARD_ANTHROPIC_ADMIN_KEY: not set"):
        billing_import("anthropic", FIRST, LAST)


# --- the command, the daily job, the mapping -----------------------------------------------------


def test_the_command_imports_and_reports(fake: FakeBilling, acme: Project) -> None:
    out = io.StringIO()
    call_command(
        "billing_import", "--provider", "anthropic", "--since", "2026-11-01",
        "--until", "2026-11-05", stdout=out,
    )  # fmt: skip
    assert out.getvalue() == (
        "anthropic: 5 days stored (2026-11-01 to 2026-11-05): 15 anthropic_cost_report, "
        "5 anthropic_usage\n"
    )


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--provider", "mistral", "--since", "2026-11-01"], "--provider"),
        (["--provider", "openai", "--since", "2026-13-01"], "--since"),
        (["--provider", "openai", "--since", "2026-11-01", "--until", "yesterday"], "--until"),
        (["--provider", "openai", "--since", "2026-11-05", "--until", "2026-11-01"], "--until"),
        (["--provider", "openai"], "--since"),
    ],
)
def test_the_command_names_the_bad_flag(fake: FakeBilling, argv: list[str], flag: str) -> None:
    with pytest.raises(CommandError, match=flag):
        call_command("billing_import", *argv)
    assert fake.requests == []


def test_a_since_after_today_without_until_says_so_rather_than_swap(fake: FakeBilling) -> None:
    with (
        time_machine.travel("2026-11-03 12:00:00+00:00", tick=False),
        pytest.raises(CommandError) as refused,
    ):
        call_command("billing_import", "--provider", "openai", "--since", "2026-11-05")
    assert str(refused.value) == (
        "--since 2026-11-05 is after today (2026-11-03 UTC, the default --until): "
        "give a day up to today"
    )
    assert fake.requests == []


def test_the_command_fails_clearly_keeping_earlier_days(fake: FakeBilling, acme: Project) -> None:
    fake.fault(OPENAI_PATHS["costs"], Fault(200, body=b"nope"))
    with pytest.raises(
        CommandError, match="openai: /v1/organization/costs: the answer is not JSON"
    ):
        call_command("billing_import", "--provider", "openai", "--since", "2026-11-01")


def test_the_daily_job_imports_yesterday_and_today_for_each_provider_with_a_key(
    fake: FakeBilling, acme: Project, settings: Any
) -> None:
    settings.COSTBOARD_OPENAI_ADMIN_KEY = ""
    with time_machine.travel("2026-11-03 12:00:00+00:00", tick=True):
        assert timezone.now().date() == DAYS[2]
        lines = scheduled_import(sleep=no_sleep)
    assert lines == [
        "anthropic: 2 days stored (2026-11-02 to 2026-11-03): 6 anthropic_cost_report, "
        "2 anthropic_usage"
    ]
    assert {r.path for r in fake.requests} == set(ANTHROPIC_PATHS.values())
    assert sorted({row[2] for row in stored()}) == DAYS[1:3]


def test_the_daily_job_reports_a_failure_and_goes_on(fake: FakeBilling, acme: Project) -> None:
    fake.fault(OPENAI_PATHS["usage"], Fault(403, times=100))
    with time_machine.travel("2026-11-03 12:00:00+00:00", tick=True):
        lines = scheduled_import(sleep=no_sleep)
    assert lines[0].startswith("openai: billing import failed: openai: ")
    assert lines[1].startswith("anthropic: 2 days stored")


def test_guard_sweep_and_the_celery_task_run_the_daily_job(
    fake: FakeBilling, acme: Project, settings: Any
) -> None:
    from costboard.tasks import billing_import as task

    settings.COSTBOARD_ANTHROPIC_ADMIN_KEY = ""
    with time_machine.travel("2026-11-03 12:00:00+00:00", tick=True):
        out = io.StringIO()
        call_command("guard_sweep", stdout=out)
        assert "billing: openai: 2 days stored (2026-11-02 to 2026-11-03)" in out.getvalue()
        assert task.delay().get() == [
            "openai: 2 days stored (2026-11-02 to 2026-11-03): 6 openai_costs, 4 openai_usage"
        ]
    assert "billing-import" in settings.CELERY_BEAT_SCHEDULE


def test_a_mapping_moves_the_imported_rows_it_names(fake: FakeBilling, acme: Project) -> None:
    billing_import("openai", FIRST, LAST, sleep=no_sleep)
    beta = Project.objects.create(name="Beta", slug="beta")
    mapping = ProviderProject(provider="openai", external_id="proj_beta", project=beta)
    assert provider_project_save(mapping) == 10  # 5 days × (a cost row and a usage row)
    assert BilledUsage.objects.filter(project=beta).count() == 10
    mapping.external_id = "proj_gamma"  # renamed: proj_beta's rows lose their project
    assert provider_project_save(mapping) == 5 * 2
    assert BilledUsage.objects.filter(project=beta).count() == 0
    assert provider_project_delete(ProviderProject.objects.get(external_id="proj_alpha")) == 10
    assert BilledUsage.objects.filter(project__isnull=False).count() == 0


@pytest.mark.django_db(transaction=True)
def test_imports_of_the_same_days_at_once_store_each_row_once(
    fake: FakeBilling, acme: Project
) -> None:
    """The beat's import and a command's, say, at the same moment: each day's replacement
    waits for the other's commit, so no day ends up with both imports' rows."""

    def work(thread: int) -> None:
        billing_import("openai", FIRST, LAST, sleep=no_sleep, window_days=1 + thread)

    assert run_in_threads(4, work) == []
    assert BilledUsage.objects.count() == 25
    assert total("cost_usd") == Decimal("6.122835") + Decimal("17.5")
