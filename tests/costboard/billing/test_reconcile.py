"""Reconciliation with known figures: steps sent through the events API at known prices,
bills imported from the fake provider servers (tests/costboard/billing/fakes.py) or sent by
hand; the drift per day, provider and model equals the figures to the cent, a billed day with
no steps is uninstrumented, re-import changes nothing, a provider's day 10 % off alerts once
(however often re-imported) and a day within 5 % never does."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.core import mail
from django.test import Client

from costboard.billing.reconcile import Wanted, reconcile
from costboard.billing.services import billing_import, billing_rows_replace
from costboard.billing.uploads import rows_from_json
from costboard.models import (
    AlertDelivery,
    ApiKey,
    BillingDrift,
    OutboxItem,
    Project,
    ProviderProject,
    WebhookEndpoint,
)
from costboard.outbox import outbox_dispatch
from costboard.retention import retention_sweep
from tests.conftest import Agent, add_price, make_agent
from tests.costboard.billing.fakes import (
    ANTHROPIC_KEY,
    ANTHROPIC_PATHS,
    OPENAI_KEY,
    OPENAI_PATHS,
    FakeBilling,
    Number,
)
from tests.costboard.budgets.test_alerts import Receiver
from tests.costboard.budgets.test_alerts import receiver as receiver  # the fixture

pytestmark = pytest.mark.django_db

D1, D2, D3 = date(2026, 11, 1), date(2026, 11, 2), date(2026, 11, 3)
SECRET = "whsec-recon-0123456789"


def no_sleep(seconds: float) -> None:
    """The imports here meet no retry."""


def step(
    day: date, model: str, input_tokens: int, output_tokens: int, **extra: Any
) -> dict[str, Any]:
    return {
        "type": "step",
        "session_id": f"s-{day}",
        "step_type": "response",
        "model": model,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "timestamp": f"{day}T10:00:00Z",
        **extra,
    }


def openai_cost(model: str, kind: str, amount: str, project: str | None) -> dict[str, Any]:
    return {
        "amount": {"value": Number(amount), "currency": "usd"},
        "line_item": f"{model}, {kind}",
        "project_id": project,
    }


def openai_usage(model: str, input_tokens: int, project: str) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": 0,
        "input_cached_tokens": 0,
        "num_model_requests": 1,
        "project_id": project,
        "user_id": None,
        "api_key_id": "key_1",
        "model": model,
        "batch": False,
        "service_tier": "default",
    }


def anthropic_cost(model: str | None, cents: str, description: str) -> dict[str, Any]:
    return {
        "currency": "USD",
        "amount": cents,
        "workspace_id": "wrkspc_a",
        "description": description,
        "cost_type": "tokens" if model else "web_search",
        "context_window": "0-200k" if model else None,
        "model": model,
        "service_tier": "standard" if model else None,
        "token_type": "output_tokens" if model else None,
    }


def anthropic_usage(model: str, uncached: int) -> dict[str, Any]:
    return {
        "uncached_input_tokens": uncached,
        "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
        "cache_read_input_tokens": 0,
        "output_tokens": 0,
        "api_key_id": "apikey_1",
        "workspace_id": "wrkspc_a",
        "model": model,
        "service_tier": "standard",
        "context_window": "0-200k",
    }


# The figures. Prices: openai gpt-4o $2.50 / $10 per Mtok, anthropic claude-sonnet-4-5 $3 / $15.
# D1 openai: 2 steps of 1M in + 100k out = 2 × $3.50 = $7.00 estimated; billed $5.10 + $2.10
#   = $7.20 (drift $0.20, 2.78 %: within 5 %). proj_beta's $9 belongs to another project.
# D1 anthropic: 1 step of 1M in + 100k out = $4.50; billed 300 + 148.5 cents = $4.485
#   (drift −$0.015, −0.33 %).
# D2 openai: 1 step of 1.8M in = $4.50; billed $5.00 (drift $0.50, 10.00 %: alerts).
# D3 anthropic: billed 500 cents = $5.00 with no step (uninstrumented), and a web search
#   line of 120 cents with no model (uninstrumented too).
BILLS = {
    OPENAI_PATHS["costs"]: {
        D1: [
            openai_cost("gpt-4o-2024-08-06", "input", "5.10", "proj_alpha"),
            openai_cost("gpt-4o-2024-08-06", "output", "2.10", "proj_alpha"),
            openai_cost("gpt-4o-2024-08-06", "input", "9", "proj_beta"),
            openai_cost("gpt-4o-mini", "input", "4", None),
        ],
        D2: [openai_cost("gpt-4o-2024-08-06", "input", "5.00", "proj_alpha")],
    },
    OPENAI_PATHS["usage"]: {
        D1: [openai_usage("gpt-4o-2024-08-06", 2_000_000, "proj_alpha")],
        D2: [openai_usage("gpt-4o-2024-08-06", 1_800_000, "proj_alpha")],
    },
    ANTHROPIC_PATHS["costs"]: {
        D1: [
            anthropic_cost("claude-sonnet-4-5", "300", "Claude Sonnet 4.5 Usage - Input Tokens"),
            anthropic_cost("claude-sonnet-4-5", "148.5", "Claude Sonnet 4.5 Usage - Output"),
        ],
        D3: [
            anthropic_cost("claude-sonnet-4-5", "500", "Claude Sonnet 4.5 Usage - Input Tokens"),
            anthropic_cost(None, "120", "Web Search"),
        ],
    },
    ANTHROPIC_PATHS["usage"]: {
        D1: [anthropic_usage("claude-sonnet-4-5", 1_000_000)],
        D3: [anthropic_usage("claude-sonnet-4-5", 777)],
    },
}


@pytest.fixture
def fake(settings: Any) -> Iterator[FakeBilling]:
    server = FakeBilling(page_size=2).start()
    server.results = BILLS
    settings.COSTBOARD_OPENAI_ADMIN_KEY = OPENAI_KEY
    settings.COSTBOARD_ANTHROPIC_ADMIN_KEY = ANTHROPIC_KEY
    settings.COSTBOARD_OPENAI_API_BASE = server.base_url
    settings.COSTBOARD_ANTHROPIC_API_BASE = server.base_url
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def acme(db: None) -> Agent:
    add_price("gpt-4o", provider="openai", input_mtok=Decimal("2.5"), output_mtok=Decimal("10"))
    add_price("claude-sonnet-4-5", provider="anthropic")  # $3 / $15
    agent = make_agent("acme")
    other = make_agent("other")
    ProviderProject.objects.create(
        provider="openai", external_id="proj_alpha", project=agent.project
    )
    ProviderProject.objects.create(
        provider="openai", external_id="proj_beta", project=other.project
    )
    ProviderProject.objects.create(
        provider="anthropic", external_id="wrkspc_a", project=agent.project
    )
    agent.events(
        step(D1, "gpt-4o", 1_000_000, 100_000),
        step(D1, "gpt-4o", 1_000_000, 100_000),
        step(D1, "claude-sonnet-4-5-20250929", 1_000_000, 100_000),
        step(D2, "gpt-4o", 1_800_000, 0),
        step(D2, "search", 0, 0, step_type="tool") | {"model": "none"},
    )
    other.events(step(D1, "gpt-4o", 3_000_000, 0))  # $7.50 of proj_beta's $9
    return agent


def import_all() -> None:
    for provider in ("openai", "anthropic"):
        billing_import(provider, D1, D3, sleep=no_sleep)


def reader(agent: Agent) -> dict[str, str]:
    return {"Authorization": f"Bearer {ApiKey.issue(project=agent.project, role='read')[1]}"}


def reconciliation(agent: Agent, **params: str) -> Any:
    query = {"since": str(D1), "until": str(D3), **params}
    response = Client().get("/api/v1/reconciliation", query, headers=reader(agent))
    assert response.status_code == 200, response.content
    return response.json()


EXPECTED = [
    # day, provider, model, estimated, billed, drift, drift %, est. input, billed input, unin.
    (
        "2026-11-01",
        "anthropic",
        "claude-sonnet-4-5",
        "4.50",
        "4.485",
        "-0.015",
        "-0.33",
        1_000_000,
        1_000_000,
        False,
    ),
    (
        "2026-11-01",
        "openai",
        "gpt-4o-2024-08-06",
        "7.00",
        "7.20",
        "0.20",
        "2.78",
        2_000_000,
        2_000_000,
        False,
    ),
    (
        "2026-11-02",
        "openai",
        "gpt-4o-2024-08-06",
        "4.50",
        "5.00",
        "0.50",
        "10.00",
        1_800_000,
        1_800_000,
        False,
    ),
    (
        "2026-11-03",
        "anthropic",
        "claude-sonnet-4-5",
        "0.00",
        "5.00",
        "5.00",
        "100.00",
        0,
        777,
        True,
    ),
    ("2026-11-03", "anthropic", None, "0.00", "1.20", "1.20", "100.00", 0, None, True),
]


def as_tuples(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (
            r["day"],
            r["provider"],
            r["model"],
            r["estimated_cost_usd"],
            r["billed_cost_usd"],
            r["drift_usd"],
            r["drift_pct"],
            r["estimated_input_tokens"],
            r["billed_input_tokens"],
            r["uninstrumented"],
        )
        for r in rows
    ]


def test_drift_per_day_provider_and_model_equals_the_figures_to_the_cent(
    fake: FakeBilling, acme: Agent
) -> None:
    import_all()
    answer = reconciliation(acme)
    assert answer["group_by"] == ["day", "provider", "model"]
    assert as_tuples(answer["rows"]) == EXPECTED
    # the whole: estimated 4.50 + 7.00 + 4.50; billed 4.485 + 7.20 + 5.00 + 5.00 + 1.20
    total = answer["total"]
    assert total["estimated_cost_usd"] == "16.00"
    assert total["billed_cost_usd"] == "22.885"
    assert total["drift_usd"] == "6.885"
    assert total["drift_pct"] == str(
        (Decimal("6.885") / Decimal("22.885") * 100).quantize(Decimal("0.01"))
    )
    assert total["uninstrumented_cost_usd"] == "6.20"
    assert total["uninstrumented"] is False
    # grouped coarser, the sums of the same lines
    by_provider = reconciliation(acme, group_by="provider")["rows"]
    assert [
        (r["provider"], r["estimated_cost_usd"], r["billed_cost_usd"]) for r in by_provider
    ] == [
        ("anthropic", "4.50", "10.685"),
        ("openai", "11.50", "12.20"),
    ]
    by_day = reconciliation(acme, group_by="day")["rows"]
    assert [(r["day"], r["drift_usd"], r["uninstrumented"]) for r in by_day] == [
        ("2026-11-01", "0.185", False),
        ("2026-11-02", "0.50", False),
        ("2026-11-03", "6.20", True),
    ]


def test_a_billed_day_with_no_steps_is_uninstrumented(fake: FakeBilling, acme: Agent) -> None:
    import_all()
    d3 = [
        r for r in reconciliation(acme, group_by="day,provider")["rows"] if r["day"] == "2026-11-03"
    ]
    assert d3 == [
        {
            "day": "2026-11-03",
            "provider": "anthropic",
            "estimated_cost_usd": "0.00",
            "billed_cost_usd": "6.20",
            "drift_usd": "6.20",
            "drift_pct": "100.00",
            "estimated_input_tokens": 0,
            "billed_input_tokens": 777,
            "uninstrumented": True,
            "steps_removed": False,
        }
    ]


def test_other_projects_rows_are_never_shown(fake: FakeBilling, acme: Agent) -> None:
    import_all()
    other = Project.objects.get(slug="other")
    agent = Agent(project=other, key="", client=Client())
    rows = reconciliation(agent)["rows"]
    # proj_beta's $9 against other's $7.50; nothing of acme's, nothing unmapped (gpt-4o-mini)
    assert as_tuples(rows) == [
        (
            "2026-11-01",
            "openai",
            "gpt-4o-2024-08-06",
            "7.50",
            "9.00",
            "1.50",
            "16.67",
            3_000_000,
            None,
            False,
        ),
    ]


def test_reimport_changes_nothing(fake: FakeBilling, acme: Agent) -> None:
    import_all()
    first = reconciliation(acme)
    drifts = list(BillingDrift.objects.values_list("project__slug", "provider", "day"))
    items = OutboxItem.objects.count()
    import_all()
    assert reconciliation(acme) == first
    assert list(BillingDrift.objects.values_list("project__slug", "provider", "day")) == drifts
    assert OutboxItem.objects.count() == items


def test_a_day_10_pct_off_alerts_once_and_a_day_within_5_pct_never(
    fake: FakeBilling, acme: Agent, receiver: Receiver, settings: Any
) -> None:
    settings.COSTBOARD_BASE_URL = "https://costboard.example"
    project = acme.project
    project.alert_emails = "ops@example.com"
    project.save()
    WebhookEndpoint.objects.create(project=project, url=receiver.url("/hook"), secret=SECRET)
    import_all()
    # acme: openai D2 (10.00 %) and anthropic D3 (100 %, all uninstrumented); never openai D1
    # (2.78 %) nor anthropic D1 (−0.33 %); other: openai D1 (16.67 %)
    assert sorted(BillingDrift.objects.values_list("project__slug", "provider", "day")) == [
        ("acme", "anthropic", D3),
        ("acme", "openai", D2),
        ("other", "openai", D1),
    ]
    drift = BillingDrift.objects.get(project=project, provider="openai", day=D2)
    assert (drift.estimated_cost_usd, drift.billed_cost_usd, drift.drift_usd) == (
        Decimal("4.5"),
        Decimal("5"),
        Decimal("0.5"),
    )
    assert (drift.drift_pct, drift.threshold_pct) == (Decimal("10.00"), Decimal("5.00"))
    outbox_dispatch()
    for _ in range(2):  # imported again, twice: no second drift, no second alert
        import_all()
        outbox_dispatch()
    assert BillingDrift.objects.count() == 3
    # the sessions' own budget alerts go to the same places: the drifts are told apart
    hooks = [h for h in receiver.to("/hook") if h.headers["X-Costboard-Event"] == "billing_drift"]
    assert sorted((h.payload["provider"], h.payload["day"]) for h in hooks) == [
        ("anthropic", "2026-11-03"),
        ("openai", "2026-11-02"),
    ]
    sent = next(h for h in hooks if h.payload["provider"] == "openai")
    assert sent.headers["X-Costboard-Event"] == "billing_drift"
    assert {
        k: sent.payload[k]
        for k in (
            "kind",
            "project",
            "estimated_cost_usd",
            "billed_cost_usd",
            "drift_usd",
            "drift_pct",
            "threshold_pct",
            "reconciliation_url",
        )
    } == {
        "kind": "billing_drift",
        "project": "acme",
        "estimated_cost_usd": "4.50",
        "billed_cost_usd": "5.00",
        "drift_usd": "0.50",
        "drift_pct": "10.00",
        "threshold_pct": "5.00",
        "reconciliation_url": "https://costboard.example/reconciliation/?project=acme"
        "&provider=openai&day=2026-11-02&until=2026-11-02",
    }
    emails = sorted(m.subject for m in mail.outbox if " billed " in m.subject)
    assert emails == [
        "[Costboard] acme: anthropic billed 2026-11-03 100.00% more than estimated",
        "[Costboard] acme: openai billed 2026-11-02 10.00% more than estimated",
    ]
    assert AlertDelivery.objects.filter(billing_drift__isnull=False).count() == 4
    assert set(AlertDelivery.objects.values_list("status", flat=True)) == {"delivered"}


def test_a_project_threshold_decides_and_blank_turns_alerts_off(
    fake: FakeBilling, acme: Agent
) -> None:
    Project.objects.filter(slug="acme").update(reconciliation_drift_pct=Decimal("2.5"))
    Project.objects.filter(slug="other").update(reconciliation_drift_pct=None)
    import_all()
    assert sorted(BillingDrift.objects.values_list("project__slug", "provider", "day")) == [
        ("acme", "anthropic", D3),
        ("acme", "openai", D1),  # 2.78 % > 2.5 %
        ("acme", "openai", D2),
    ]


def test_today_is_not_judged_until_it_is_over(
    fake: FakeBilling, acme: Agent, settings: Any
) -> None:
    import time_machine

    with time_machine.travel("2026-11-02T12:00:00Z", tick=False):
        import_all()
    assert ("openai", D2) not in set(BillingDrift.objects.values_list("provider", "day"))
    with time_machine.travel("2026-11-03T06:00:00Z", tick=False):
        import_all()
    assert ("openai", D2) in set(BillingDrift.objects.values_list("provider", "day"))


# --- bills sent by hand --------------------------------------------------------------------------


def test_a_csv_bill_uploaded_in_the_admin_reconciles_the_same_way(
    acme: Agent, staff: Client
) -> None:
    add_price(
        "mistral-large", provider="mistral", input_mtok=Decimal("2"), output_mtok=Decimal("6")
    )
    acme.events(step(D1, "mistral-large", 1_000_000, 500_000))  # $2 + $3 = $5.00
    body = (
        "date,provider,model,project,cost_usd,input_tokens,output_tokens\n"
        "2026-11-01,mistral,mistral-large-latest,acme,5.60,1000000,500000\n"
        "2026-11-02,mistral,codestral-latest,acme,1.25,,\n"
    )
    upload = io.BytesIO(body.encode())
    upload.name = "bill.csv"
    response = staff.post(
        "/admin/costboard/billedusage/upload-csv/", {"file": upload, "project": ""}
    )
    assert response.status_code in (200, 302), response.content
    rows = as_tuples(reconciliation(acme, group_by="day,provider,model")["rows"])
    mistral = [r for r in rows if r[1] == "mistral"]
    assert mistral == [
        # matched by family: the bill's name
        (
            "2026-11-01",
            "mistral",
            "mistral-large-latest",
            "5.00",
            "5.60",
            "0.60",
            "10.71",
            1_000_000,
            1_000_000,
            False,
        ),
        (
            "2026-11-02",
            "mistral",
            "codestral-latest",
            "0.00",
            "1.25",
            "1.25",
            "100.00",
            0,
            None,
            True,
        ),
    ]
    assert set(BillingDrift.objects.values_list("provider", "day")) == {
        ("mistral", D1),
        ("mistral", D2),
    }


@pytest.mark.parametrize("tool", ["none", "None", "NONE"])
def test_a_tool_step_is_never_reconciled_however_its_model_is_spelt(acme: Agent, tool: str) -> None:
    acme.events(step(D1, "gpt-4o", 1_000_000, 0))
    bill = {"date": str(D1), "provider": "openai", "model": "gpt-4o", "cost_usd": "2.50"}
    billing_rows_replace(rows_from_json({"rows": [bill]}, default_project=acme.project),
                         source="api")  # fmt: skip
    before = reconciliation(acme, group_by="day,provider,model")
    # a tool step ($0, family none) of the same day and provider changes no line
    acme.events(step(D1, tool, 10, 0, step_type="tool", provider="openai"))
    after = reconciliation(acme, group_by="day,provider,model")
    assert after == before
    assert ("openai", "gpt-4o") in [(r["provider"], r["model"]) for r in after["rows"]]


def test_a_keys_bill_judges_its_own_projects_drift_alone(acme: Agent) -> None:
    other = Project.objects.get(slug="other")
    acme.events(step(D1, "gpt-4o", 1_000_000, 0))  # $2.50

    def send(project: Project, cost: str) -> None:
        _, key = ApiKey.issue(project=project, role="admin")
        answer = Client().post(
            "/api/v1/billing",
            json.dumps({"rows": [{"date": "2026-11-01", "provider": "openai", "cost_usd": cost}]}),
            content_type="application/json",
            headers={"Authorization": f"Bearer {key}"},
        )
        assert answer.status_code == 200, answer.content

    # other's bill of the day, sent while other asked for no drift alert: nothing judged
    Project.objects.filter(pk=other.pk).update(reconciliation_drift_pct=None)
    send(other, "9")
    Project.objects.filter(pk=other.pk).update(reconciliation_drift_pct=Decimal(5))
    queued = OutboxItem.objects.filter(project=other).count()
    # acme's bill of the same provider and day: acme's drift ($2.50 against $3) and no other's
    send(acme.project, "3")
    assert list(BillingDrift.objects.values_list("project__slug", "provider", "day")) == [
        ("acme", "openai", D1)
    ]
    assert OutboxItem.objects.filter(project=other).count() == queued
    # other's own next send judges other
    send(other, "9")
    assert BillingDrift.objects.filter(project=other, day=D1).exists()


def test_a_hand_sent_bill_replaces_the_imported_rows_of_its_provider_day(
    fake: FakeBilling, acme: Agent
) -> None:
    import_all()
    rows = rows_from_json(
        {
            "rows": [
                {"date": "2026-11-01", "provider": "openai", "model": "gpt-4o", "cost_usd": "7.00"}
            ]
        },
        default_project=acme.project,
    )
    billing_rows_replace(rows, source="api")
    d1 = [r for r in as_tuples(reconciliation(acme)["rows"]) if r[:2] == ("2026-11-01", "openai")]
    # the invoice's cost, matched exactly by name; the usage report's tokens stay (the
    # invoice gave none), joining the line of their family
    assert d1 == [
        (
            "2026-11-01",
            "openai",
            "gpt-4o",
            "7.00",
            "7.00",
            "0.00",
            "0.00",
            2_000_000,
            2_000_000,
            False,
        ),
    ]


def test_a_name_left_joins_the_line_of_its_family_matched_exactly(acme: Agent) -> None:
    # steps of both the alias and the snapshot; the bill names the snapshot only
    acme.events(step(D3, "gpt-4o", 1_000_000, 0), step(D3, "gpt-4o-2024-08-06", 1_000_000, 0))
    rows = rows_from_json(
        {
            "rows": [
                {
                    "date": str(D3),
                    "provider": "openai",
                    "model": "gpt-4o-2024-08-06",
                    "cost_usd": "5.25",
                }
            ]
        },
        default_project=acme.project,
    )
    billing_rows_replace(rows, source="api")
    [line] = reconcile(Wanted([acme.project.pk], D3, D3))
    assert (line.model, line.estimated_cost_usd, line.billed_cost_usd, line.steps) == (
        "gpt-4o-2024-08-06",
        Decimal("5.00"),
        Decimal("5.25"),
        2,
    )
    assert (line.drift_usd, line.drift_pct, line.uninstrumented) == (
        Decimal("0.25"),
        Decimal("4.76"),
        False,
    )


def test_the_selector_filters_by_model_and_provider(fake: FakeBilling, acme: Agent) -> None:
    import_all()
    lines = reconcile(
        Wanted([acme.project.pk], D1, D3, provider="openai", model="gpt-4o-2024-08-06")
    )
    assert [(line.day, line.drift_usd) for line in lines] == [
        (D1, Decimal("0.20")),
        (D2, Decimal("0.50")),
    ]


# --- the API's refusals ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"group_by": "hour"}, "group_by"),
        ({"group_by": "day,day"}, "group_by"),
        ({"group_by": ","}, "group_by"),
        ({"since": "2026-11-05", "until": "2026-11-01"}, "since"),
        ({"since": "2024-01-01", "until": "2026-11-01"}, "since"),
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-02-30"}, "until"),
        ({"bogus": "1"}, "bogus"),
    ],
)
def test_bad_parameters_are_422_naming_them(
    acme: Agent, params: dict[str, str], field: str
) -> None:
    response = Client().get("/api/v1/reconciliation", params, headers=reader(acme))
    assert response.status_code == 422, response.content
    assert [e["field"] for e in response.json()["errors"]] == [field]


def test_the_roles_of_spend_read_it(acme: Agent) -> None:
    path = "/api/v1/reconciliation"
    assert Client().get(path).status_code == 401
    ingest = {"Authorization": f"Bearer {acme.key}"}
    assert Client().get(path, headers=ingest).status_code == 403
    admin = {"Authorization": f"Bearer {ApiKey.issue(project=acme.project, role='admin')[1]}"}
    assert Client().get(path, headers=admin).status_code == 200


def test_csv_has_the_same_rows(fake: FakeBilling, acme: Agent) -> None:
    import_all()
    response = Client().get(
        "/api/v1/reconciliation",
        {"since": str(D1), "until": str(D3)},
        headers={**reader(acme), "Accept": "text/csv"},
    )
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    table = list(csv.reader(io.StringIO(response.content.decode())))
    assert table[0] == [
        "day",
        "provider",
        "model",
        "estimated_cost_usd",
        "billed_cost_usd",
        "drift_usd",
        "drift_pct",
        "estimated_input_tokens",
        "billed_input_tokens",
        "uninstrumented",
        "steps_removed",
    ]
    assert table[1] == [
        "2026-11-01",
        "anthropic",
        "claude-sonnet-4-5",
        "4.50",
        "4.485",
        "-0.015",
        "-0.33",
        "1000000",
        "1000000",
        "false",
        "false",
    ]
    assert table[-1] == [
        "2026-11-03",
        "anthropic",
        "",
        "0.00",
        "1.20",
        "1.20",
        "100.00",
        "0",
        "",
        "true",
        "false",
    ]
    assert len(table) == 1 + len(EXPECTED)
    assert json.loads(json.dumps(table))  # plain text cells


# --- retention ---------------------------------------------------------------------------------


def send_bill(agent: Agent, *rows: dict[str, str]) -> None:
    rows_sent = rows_from_json({"rows": list(rows)}, default_project=agent.project)
    billing_rows_replace(rows_sent, source="api")


def test_a_day_past_retention_is_estimated_from_its_daily_rollups(acme: Agent) -> None:
    # D1 openai: 2 steps of gpt-4o, $7.00; anthropic: 1 of claude-sonnet-4-5, $4.50; billed
    # $7.20 and $4.50. Retention (30 days, run 40 days later) deletes every step of D1.
    send_bill(
        acme,
        {"date": str(D1), "provider": "openai", "model": "gpt-4o-2024-08-06", "cost_usd": "7.20"},
        {"date": str(D1), "provider": "anthropic", "model": "claude-sonnet-4-5",
         "cost_usd": "4.50"},
    )  # fmt: skip
    before = reconciliation(acme, until=str(D1))
    Project.objects.filter(pk=acme.project.pk).update(retention_days=30)
    assert retention_sweep(datetime(2026, 12, 11, tzinfo=UTC)).steps_deleted == 5  # D1's, D2's
    after = reconciliation(acme, until=str(D1))
    # the same figures as while the steps were kept, not $0 against the bill (all
    # "uninstrumented"); each line says its steps were removed by retention
    assert as_tuples(after["rows"]) == as_tuples(before["rows"]) == [
        ("2026-11-01", "anthropic", "claude-sonnet-4-5", "4.50", "4.50", "0.00", "0.00",
         1_000_000, None, False),
        ("2026-11-01", "openai", "gpt-4o-2024-08-06", "7.00", "7.20", "0.20", "2.78",
         2_000_000, None, False),
    ]  # fmt: skip
    assert [r["steps_removed"] for r in before["rows"]] == [False, False]
    assert [r["steps_removed"] for r in after["rows"]] == [True, True]
    assert after["total"]["estimated_cost_usd"] == "11.50"
    assert after["total"]["uninstrumented_cost_usd"] == "0.00"
    assert after["total"]["steps_removed"] is True
    # as the spend API counts the day
    spend = (
        Client()
        .get("/api/v1/spend", {"since": str(D1), "until": str(D1)}, headers=reader(acme))
        .json()
    )
    assert spend["total"]["cost_usd"] == "11.50"
    # the bill sent again is judged by the same estimate: 2.78 %, no drift alert (not 100 %)
    send_bill(
        acme,
        {"date": str(D1), "provider": "openai", "model": "gpt-4o-2024-08-06", "cost_usd": "7.20"},
    )
    assert not BillingDrift.objects.exists()


def test_a_day_partly_past_retention_keeps_its_kept_steps_and_adds_the_rest(acme: Agent) -> None:
    # two more gpt-4o steps on D2 at 23:00 ($2.50 each with D2's 10:00 one of $4.50); the
    # cutoff falls at D2 12:00: the 10:00 step goes, the two at 23:00 stay
    acme.events(
        step(D2, "gpt-4o", 1_000_000, 0) | {"timestamp": f"{D2}T23:00:00Z"},
        step(D2, "gpt-4o", 1_000_000, 0) | {"timestamp": f"{D2}T23:00:00Z"},
    )
    send_bill(acme, {"date": str(D2), "provider": "openai", "model": "gpt-4o",
                     "cost_usd": "9.50"})  # fmt: skip
    Project.objects.filter(pk=acme.project.pk).update(retention_days=30)
    assert retention_sweep(datetime(2026, 12, 2, 12, tzinfo=UTC)).steps_deleted == 5
    rows = reconciliation(acme, since=str(D2), until=str(D2))["rows"]
    assert [
        (r["model"], r["estimated_cost_usd"], r["estimated_input_tokens"], r["uninstrumented"])
        for r in rows
    ] == [("gpt-4o", "9.50", 3_800_000, False)]
    assert [r["steps_removed"] for r in rows] == [True]


def test_a_removed_steps_provider_is_their_kept_siblings_else_the_bill_naming_their_family(
    acme: Agent,
) -> None:
    # acme-large is priced by zeta (the steps are sent with it) and by azure, which the rate
    # table would pick for the name alone: a rollup keeps no provider, the steps told zeta
    add_price("acme-large", provider="zeta", input_mtok=Decimal(1), output_mtok=Decimal(1))
    add_price("acme-large", provider="azure", input_mtok=Decimal(1), output_mtok=Decimal(1))
    acme.events(
        step(D1, "acme-large", 1_000_000, 0, provider="zeta", session_id="z1"),  # $1.00
        step(D2, "acme-large", 2_000_000, 0, provider="zeta", session_id="z2"),  # $2.00
    )
    send_bill(
        acme,
        {"date": str(D1), "provider": "zeta", "model": "acme-large-2026-01-01", "cost_usd": "1.10"},
        {"date": str(D2), "provider": "zeta", "model": "acme-large", "cost_usd": "2.00"},
    )
    Project.objects.filter(pk=acme.project.pk).update(retention_days=30)
    retention_sweep(datetime(2026, 12, 2, tzinfo=UTC))  # D1's steps go, D2's stay

    def zeta(since: date, until: date) -> list[tuple[Any, ...]]:
        rows = reconciliation(acme, since=str(since), until=str(until))["rows"]
        return [(r["day"], r["model"], r["estimated_cost_usd"], r["uninstrumented"],
                 r["steps_removed"]) for r in rows if r["provider"] == "zeta"]  # fmt: skip

    # D2's kept steps say zeta
    assert zeta(D1, D2) == [
        ("2026-11-01", "acme-large-2026-01-01", "1.00", False, True),
        ("2026-11-02", "acme-large", "2.00", False, False),
    ]
    # D1 alone, no step kept: zeta's bill names the family
    assert zeta(D1, D1) == [("2026-11-01", "acme-large-2026-01-01", "1.00", False, True)]


def test_an_azure_step_priced_by_openais_row_reconciles_with_azures_bill(acme: Agent) -> None:
    # Azure resells OpenAI's models at OpenAI's list: priced by the openai row, billed by Azure
    acme.events(step(D3, "gpt-4o", 1_000_000, 0, provider="azure"))  # $2.50
    rows = rows_from_json(
        {"rows": [{"date": str(D3), "provider": "azure", "model": "gpt-4o", "cost_usd": "2.60"}]},
        default_project=acme.project,
    )
    billing_rows_replace(rows, source="api")
    [line] = reconcile(Wanted([acme.project.pk], D3, D3))
    assert (line.provider, line.model, line.estimated_cost_usd, line.billed_cost_usd) == (
        "azure",
        "gpt-4o",
        Decimal("2.50"),
        Decimal("2.60"),
    )
    assert (line.steps, line.uninstrumented) == (1, False)
