"""/reconciliation/: the estimate beside the bill per day, provider and model, the largest gap
first, the drill-down filters checked (422 naming a bad one), uninstrumented spend shown
apart, and only the projects the user may see."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from decimal import Decimal

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from costboard.billing.services import billing_rows_replace
from costboard.billing.uploads import rows_from_json
from costboard.budgets.alert_messages import alert_payload
from costboard.models import AlertDelivery, BillingDrift, Membership, Project
from costboard.retention import retention_sweep
from tests.conftest import Agent, add_price, make_agent

pytestmark = pytest.mark.django_db

TODAY = timezone.now().date()
D1, D2 = TODAY - timedelta(days=3), TODAY - timedelta(days=2)


def bill(agent: Agent, *rows: dict[str, str]) -> None:
    billing_rows_replace(
        rows_from_json({"rows": list(rows)}, default_project=agent.project), source="api"
    )


@pytest.fixture
def acme(db: None) -> Agent:
    """acme: mistral-large $2 / $6 per Mtok. D1 estimated $5.00, billed $5.60; D2 estimated
    $2.00, billed $2.10, and codestral billed $1.25 with no step (uninstrumented)."""
    add_price("mistral-large", provider="mistral", input_mtok=Decimal(2), output_mtok=Decimal(6))
    agent = make_agent("acme")
    steps = [
        (D1, 1_000_000, 500_000),
        (D2, 1_000_000, 0),
    ]
    agent.events(
        *(
            {
                "session_id": "s",
                "step_type": "chat",
                "model": "mistral-large",
                "input_tokens": i,
                "output_tokens": o,
                "timestamp": f"{day}T09:00:00Z",
            }
            for day, i, o in steps
        )
    )
    bill(
        agent,
        {"date": str(D1), "provider": "mistral", "model": "mistral-large", "cost_usd": "5.60"},
        {"date": str(D2), "provider": "mistral", "model": "mistral-large", "cost_usd": "2.10"},
        {"date": str(D2), "provider": "mistral", "model": "codestral-latest", "cost_usd": "1.25"},
    )
    return agent


def test_the_page_shows_the_largest_gap_first_and_the_uninstrumented_apart(
    acme: Agent, staff: Client
) -> None:
    response = staff.get("/reconciliation/", {"project": "acme"})
    assert response.status_code == 200
    html = response.content.decode()
    gaps = response.context["gaps"]
    assert [(g.day, g.model, g.drift_usd) for g in gaps] == [
        (D2, "codestral-latest", Decimal("1.25")),
        (D1, "mistral-large", Decimal("0.60")),
        (D2, "mistral-large", Decimal("0.10")),
    ]
    assert [line.model for line in response.context["uninstrumented"]] == ["codestral-latest"]
    whole = response.context["whole"]
    assert (whole.estimated_cost_usd, whole.billed_cost_usd) == (Decimal(7), Decimal("8.95"))
    assert 'id="uninstrumented"' in html and "$1.25 billed with no step" in html
    assert 'href="/reconciliation/?project=acme"' in html  # in the navigation
    figure = response.context["figures"]["daily"]
    [estimated, billed] = figure["data"]
    assert (estimated["x"], estimated["y"], billed["y"]) == (
        [str(D1), str(D2)],
        [5.0, 2.0],
        [5.6, 3.35],
    )


def test_a_day_whose_steps_retention_deleted_keeps_its_estimate_and_says_so(
    acme: Agent, staff: Client
) -> None:
    Project.objects.filter(slug="acme").update(retention_days=30)
    # 30 days after D2 began: D1's step is deleted, D2's kept
    assert (
        retention_sweep(datetime.combine(D2, time(), UTC) + timedelta(days=30)).steps_deleted == 1
    )
    response = staff.get("/reconciliation/", {"project": "acme"})
    gaps = response.context["gaps"]
    # D1 still $5.00 estimated (from its daily rollup), not $0 and $5.60 uninstrumented
    assert [(g.day, g.model, g.estimated_cost_usd, g.uninstrumented, g.steps_removed)
            for g in gaps] == [
        (D2, "codestral-latest", Decimal(0), True, 0),
        (D1, "mistral-large", Decimal(5), False, 1),
        (D2, "mistral-large", Decimal(2), False, 0),
    ]  # fmt: skip
    html = response.content.decode()
    assert html.count("data-steps-removed ") == 1  # D1's line
    assert "data-steps-removed-note" in html


def test_the_drill_down_narrows_to_a_day_and_a_model(acme: Agent, staff: Client) -> None:
    day = staff.get("/reconciliation/", {"project": "acme", "day": str(D2)})
    assert [(g.day, g.model) for g in day.context["gaps"]] == [
        (D2, "codestral-latest"),
        (D2, "mistral-large"),
    ]
    model = staff.get(
        "/reconciliation/", {"project": "acme", "provider": "mistral", "model": "mistral-large"}
    )
    assert [(g.day, g.drift_pct) for g in model.context["gaps"]] == [
        (D1, Decimal("10.71")),
        (D2, Decimal("4.76")),
    ]
    assert model.context["uninstrumented"] == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"provider": "nobody"}, "provider"),
        ({"model": "gpt-9"}, "model"),
        ({"day": "someday"}, "day"),
        ({"day": "2026-02-30"}, "day"),
        ({"day": "1999-01-01"}, "day"),
        ({"since": "yesterday"}, "since"),
        ({"since": str(TODAY - timedelta(days=400))}, "since"),
    ],
)
def test_a_bad_parameter_is_422_naming_it(
    acme: Agent, staff: Client, params: dict[str, str], field: str
) -> None:
    response = staff.get("/reconciliation/", params)
    assert response.status_code == 422
    assert list(response.context["filter_errors"]) == [field]
    assert f'data-error="{field}"' in response.content.decode()


def test_a_member_sees_only_their_projects(acme: Agent) -> None:
    user = get_user_model().objects.create_user("ann", "", "pw-ann-12345")
    other = make_agent("other")
    Membership.objects.create(user=user, project=other.project)
    client = Client()
    client.force_login(user)
    response = client.get("/reconciliation/")
    assert response.status_code == 200
    assert response.context["gaps"] == []
    assert client.get("/reconciliation/", {"project": "acme"}).status_code == 404


def test_login_is_required(db: None) -> None:
    response = Client().get("/reconciliation/")
    assert response.status_code == 302
    assert "/accounts/login/" in response["Location"]


def test_a_drift_alerts_link_shows_its_day_a_month_later(acme: Agent, staff: Client) -> None:
    """The link in a billing-drift alert (docs/billing.md, "Drift alerts") opens the drifted
    day however long after the alert it is followed, not a 422 naming the day outside the
    default 30 days."""
    drift = BillingDrift.objects.get(project=acme.project, provider="mistral", day=D1)
    delivery = AlertDelivery.objects.create(
        project=acme.project, billing_drift=drift, channel="email", target="ops@example.com"
    )
    link = alert_payload(delivery)["reconciliation_url"]
    with time_machine.travel(datetime.combine(D1 + timedelta(days=45), time(12), UTC)):
        staff.force_login(get_user_model().objects.get(username="root"))  # signed in again
        response = staff.get(link)
    assert response.status_code == 200, response.content.decode()[-3000:]
    assert [(g.day, g.provider, g.model, g.drift_usd) for g in response.context["gaps"]] == [
        (D1, "mistral", "mistral-large", Decimal("0.60"))
    ]
