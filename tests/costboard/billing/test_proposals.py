"""From drift to a fix (docs/billing.md, "Proposed adjustments"): a steady percentage off the
estimate over at least 7 billed days proposes the negotiated rate that explains it; applying
it (staff only, from /reconciliation/) records the adjustment and reprices, and the drift then
reads ~0."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from costboard.billing.proposals import Proposal, drift_proposals
from costboard.billing.reconcile import Line
from costboard.billing.services import billing_rows_replace
from costboard.billing.uploads import rows_from_json
from costboard.models import ApiKey, PriceAdjustment, Step
from costboard.outbox import outbox_dispatch
from costboard.pricing.services import adjustment_set
from tests.conftest import Agent, add_price, make_agent

TODAY = timezone.now().date()
FIRST = TODAY - timedelta(days=10)
DAYS = [FIRST + timedelta(days=i) for i in range(8)]  # FIRST … TODAY − 3


# --- the pure function -------------------------------------------------------------------------


def line(day: date, estimated: str, billed: str, *, model: str = "claude-sonnet-4-5") -> Line:
    return Line(
        project_id=1,
        provider="anthropic",
        day=day,
        model=model,
        estimated_cost_usd=Decimal(estimated),
        billed_cost_usd=Decimal(billed),
        steps=3 if Decimal(estimated) else 0,
        billed_rows=1,
    )


def under(percents: list[str], days: list[date] = DAYS) -> list[Line]:
    """A $10 estimate a day billed `percent` under it."""
    return [
        line(day, "10", str(Decimal(10) * (1 - Decimal(p) / 100)))
        for day, p in zip(days, percents, strict=True)
    ]


def test_a_steady_twelve_percent_under_proposes_minus_twelve_from_the_first_day() -> None:
    [proposal] = drift_proposals(under(["12"] * 8))
    assert proposal == Proposal(
        project_id=1,
        provider="anthropic",
        family="claude-sonnet-4-5",
        since=DAYS[0],
        until=DAYS[-1],
        days=8,
        estimated_cost_usd=Decimal(80),
        billed_cost_usd=Decimal("70.40"),
        in_force=Decimal(0),
        percent=Decimal("-12.0000"),
    )
    assert proposal.text == (
        f"billed 12.0 % under list for claude-sonnet-4-5 since {DAYS[0]}: add −12 % from that date"
    )


def test_the_percent_is_the_aggregate_not_the_mean_and_is_kept_to_four_places() -> None:
    # within 1 point of drift_pct of each other; a larger day weighs more
    lines = under(["12", "12.5", "12", "12.5", "12", "12.5", "12"], DAYS[:7])
    lines.append(line(DAYS[7], "30", "26.31"))  # 12.3 % under
    [proposal] = drift_proposals(lines)
    # billed 61.60 − 0.05 × 3 + 26.31 = 87.76 … exactly: 7 days × 10 + 30 = 100 estimated
    billed = Decimal("8.8") * 4 + Decimal("8.75") * 3 + Decimal("26.31")
    assert proposal.billed_cost_usd == billed == Decimal("87.76")
    assert proposal.percent == Decimal("-12.2400")
    assert proposal.text.endswith("add −12.24 % from that date")


def test_a_series_that_is_not_steady_proposes_nothing() -> None:
    assert drift_proposals(under(["5", "15", "5", "15", "5", "15", "5", "15"])) == []


def test_the_run_is_the_latest_steady_one() -> None:
    # an early unsteady day is outside the run: the 7 steady days after it propose
    [proposal] = drift_proposals(under(["30", *["12"] * 7]))
    assert (proposal.since, proposal.days) == (DAYS[1], 7)
    # a latest day off the others ends the run there: nothing after it is steady for 7 days
    assert drift_proposals(under([*["12"] * 7, "20"])) == []


def test_fewer_than_seven_days_propose_nothing() -> None:
    assert drift_proposals(under(["12"] * 6, DAYS[:6])) == []


def test_a_day_without_a_line_is_skipped_and_an_uninstrumented_day_ends_the_run() -> None:
    # DAYS[3] has no line at all (no traffic): skipped, 7 billed days remain
    lines = [x for x in under(["12"] * 8) if x.day != DAYS[3]]
    [proposal] = drift_proposals(lines)
    assert (proposal.since, proposal.days) == (DAYS[0], 7)
    # DAYS[3] billed with no step: the run is the 4 days after it
    lines.append(line(DAYS[3], "0", "8.80"))
    assert drift_proposals(lines) == []


def test_an_adjustment_in_force_is_composed_and_one_that_explains_the_bill_proposes_nothing() -> (
    None
):
    # the estimate already carries −10 %; billed 2 % under that is 11.8 % under list
    [proposal] = drift_proposals(under(["2"] * 8), lambda *scope: Decimal(-10))
    assert (proposal.in_force, proposal.percent) == (Decimal(-10), Decimal("-11.8000"))
    # billed what the estimate says within 0.5 %: nothing to fix
    assert drift_proposals(under(["0.4"] * 8), lambda *scope: Decimal(-12)) == []


def test_snapshot_names_join_their_family() -> None:
    lines = under(["12"] * 4, DAYS[:4]) + [
        line(day, "10", "8.8", model="claude-sonnet-4-5-20250929") for day in DAYS[4:]
    ]
    [proposal] = drift_proposals(lines)
    assert (proposal.family, proposal.days) == ("claude-sonnet-4-5", 8)


# --- the page, the click and the repricing ------------------------------------------------------


def steps_and_bill(agent: Agent, percent_under: Decimal) -> None:
    """claude-sonnet-4-5 at $3 / $15 per Mtok: day i has (i + 1) M input and 100k output
    tokens, $3(i + 1) + $1.50 at list, billed `percent_under` % under list."""
    agent.events(
        *(
            {
                "session_id": f"s{i}",
                "step_type": "chat",
                "model": "claude-sonnet-4-5",
                "provider": "anthropic",
                "input_tokens": (i + 1) * 1_000_000,
                "output_tokens": 100_000,
                "timestamp": f"{day}T09:00:00Z",
            }
            for i, day in enumerate(DAYS)
        )
    )
    factor = 1 - percent_under / 100
    rows = [
        {
            "date": str(day),
            "provider": "anthropic",
            "model": "claude-sonnet-4-5-20250929",
            "cost_usd": str((Decimal(3 * (i + 1)) + Decimal("1.50")) * factor),
        }
        for i, day in enumerate(DAYS)
    ]
    billing_rows_replace(
        rows_from_json({"rows": rows}, default_project=agent.project), source="api"
    )


@pytest.fixture
def acme(db: None) -> Agent:
    add_price(
        "claude-sonnet-4-5", provider="anthropic", input_mtok=Decimal(3), output_mtok=Decimal(15)
    )
    agent = make_agent("acme")
    steps_and_bill(agent, Decimal(12))
    return agent


def at_list(i: int) -> Decimal:
    """Day i's list cost: (i + 1) M input tokens at $3, 100k output at $15."""
    return Decimal(3 * (i + 1)) + Decimal("1.50")


def money(text: str) -> Decimal:
    """An API figure, checked to be written to the cent at least."""
    assert "." in text and len(text.split(".")[1]) >= 2, text
    return Decimal(text)


def api_rows(agent: Agent) -> list[dict[str, Any]]:
    key = ApiKey.issue(project=agent.project, role="read")[1]
    response = Client().get(
        "/api/v1/reconciliation",
        {"since": str(DAYS[0]), "until": str(DAYS[-1]), "group_by": "day,provider,model"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 200, response.content
    rows: list[dict[str, Any]] = response.json()["rows"]
    return rows


def page(client: Client) -> Any:
    response = client.get("/reconciliation/", {"project": "acme", "since": str(DAYS[0])})
    assert response.status_code == 200
    return response


def apply(client: Client, proposal: Proposal, **change: str) -> Any:
    return client.post(
        "/reconciliation/adjust/?project=acme",
        {
            "adjust_project": "acme",
            "provider": proposal.provider,
            "family": proposal.family,
            "percent": str(proposal.percent),
            "since": str(proposal.since),
            "note": proposal.text,
            **change,
        },
    )


def test_only_a_repricing_of_its_own_steps_holds_a_projects_proposals_back(
    acme: Agent, staff: Client
) -> None:
    other = make_agent("other").project
    # another project's negotiated rate, queued: acme's estimate is not changed by it
    adjustment_set(provider="anthropic", family="claude-sonnet-4-5", project_id=other.pk,
                   percent=Decimal(-5), effective_from=DAYS[0])  # fmt: skip
    shown = page(staff)
    assert shown.context["repricing_pending"] is False
    assert [p.percent for p in shown.context["proposals"]] == [Decimal(-12)]
    # one for every project is acme's too: nothing proposed until it is carried out
    adjustment_set(provider="anthropic", family="claude-sonnet-4-5", project_id=None,
                   percent=Decimal(-1), effective_from=DAYS[0])  # fmt: skip
    held = page(staff)
    assert (held.context["repricing_pending"], held.context["proposals"]) == (True, [])
    assert outbox_dispatch().kinds["prices.reprice_adjusted"] == 2
    assert page(staff).context["repricing_pending"] is False


def test_applying_the_proposal_reprices_and_the_drift_reads_zero(
    acme: Agent, staff: Client
) -> None:
    before = api_rows(acme)
    assert [
        (r["day"], money(r["estimated_cost_usd"]), money(r["billed_cost_usd"])) for r in before
    ] == [(str(day), at_list(i), at_list(i) * Decimal("0.88")) for i, day in enumerate(DAYS)]
    assert {r["drift_pct"] for r in before} == {"-13.64"}  # −12 % of list is −13.64 % of billed

    response = page(staff)
    [proposal] = response.context["proposals"]
    assert (proposal.provider, proposal.family, proposal.since) == (
        "anthropic",
        "claude-sonnet-4-5",
        DAYS[0],
    )
    assert proposal.percent == Decimal(-12)
    html = response.content.decode()
    assert f"billed 12.0 % under list for claude-sonnet-4-5 since {DAYS[0]}" in html
    assert "add −12 % from that date" in html
    assert f"Add −12 % from {DAYS[0]}</button>" in html
    assert 'name="csrfmiddlewaretoken"' in html

    applied = apply(staff, proposal)
    assert applied.status_code == 303
    assert applied["Location"] == "/reconciliation/?project=acme"
    adjustment = PriceAdjustment.objects.get()
    assert (
        adjustment.provider,
        adjustment.family,
        adjustment.project_id,
        adjustment.percent,
        adjustment.effective_from,
    ) == ("anthropic", "claude-sonnet-4-5", acme.project.pk, Decimal(-12), DAYS[0])
    # queued, not yet carried out: the page proposes nothing until the estimate is repriced
    waiting = page(staff)
    assert waiting.context["repricing_pending"] is True
    assert waiting.context["proposals"] == []

    assert outbox_dispatch().kinds["prices.reprice_adjusted"] == 1
    # each step at 88 % of list, exactly
    assert sorted(Step.objects.values_list("cost_usd", flat=True)) == [
        at_list(i) * Decimal("0.88") for i in range(8)
    ]
    after = api_rows(acme)
    assert [(r["day"], money(r["estimated_cost_usd"]), money(r["drift_usd"])) for r in after] == [
        (str(day), at_list(i) * Decimal("0.88"), Decimal(0)) for i, day in enumerate(DAYS)
    ]
    assert all(abs(Decimal(r["drift_pct"])) < Decimal("0.5") for r in after)
    # the adjustment in force explains the bill: nothing more to propose
    assert page(staff).context["proposals"] == []


def test_a_non_staff_user_sees_no_button_and_cannot_apply(acme: Agent) -> None:
    member = get_user_model().objects.create_user("ann", "", "pw-ann-12345")
    acme.project.memberships.create(user=member)
    client = Client()
    client.force_login(member)
    response = page(client)
    [proposal] = response.context["proposals"]  # seen, as the drift is
    html = response.content.decode()
    assert proposal.text in html and "data-apply" not in html
    assert apply(client, proposal).status_code == 403
    # staff without the right to add price adjustments are refused too
    staffer = get_user_model().objects.create_user("bob", "", "pw-bob-12345", is_staff=True)
    client.force_login(staffer)
    assert "data-apply" not in page(client).content.decode()
    assert apply(client, proposal).status_code == 403
    staffer.user_permissions.add(
        *Permission.objects.filter(codename__in=["add_priceadjustment", "change_priceadjustment"])
    )
    client.force_login(get_user_model().objects.get(pk=staffer.pk))
    assert "data-apply" in page(client).content.decode()
    assert apply(client, proposal).status_code == 303
    assert PriceAdjustment.objects.count() == 1


def test_the_post_needs_a_csrf_token_and_a_valid_percent(acme: Agent, staff: Client) -> None:
    user = get_user_model().objects.get(username="root")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    [proposal] = page(staff).context["proposals"]
    assert apply(strict, proposal).status_code == 403
    bad = staff.post(
        "/reconciliation/adjust/?project=acme",
        {
            "adjust_project": "acme",
            "provider": "anthropic",
            "family": "claude-sonnet-4-5",
            "percent": "-12.00001",
            "since": str(DAYS[0]),
        },
    )
    assert bad.status_code == 422
    assert "percent: at most 4 decimal places" in bad.content.decode()
    assert PriceAdjustment.objects.count() == 0


@pytest.mark.parametrize("percent", ["-１２", "-١٢"])
def test_a_percent_in_digits_other_than_0_9_is_refused(
    acme: Agent, staff: Client, percent: str
) -> None:
    """Decimal() reads "-１２" (fullwidth) and "-١٢" (Arabic-Indic) as -12: refused instead."""
    [proposal] = page(staff).context["proposals"]
    refused = apply(staff, proposal, percent=percent)
    assert refused.status_code == 422
    html = refused.content.decode()
    assert "percent: has a digit that is not 0-9" in html
    assert "write the amount in ASCII digits, e.g. -12" in html
    assert PriceAdjustment.objects.count() == 0


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"family": "claude-sonnet-4-5\x00"}, "family: must not contain NUL"),
        ({"provider": "anthro\x00pic"}, "provider: must not contain NUL"),
        ({"note": "contract\x00"}, "note: must not contain NUL"),
        ({"family": "f" * 201}, "family: at most 200 characters, got 201"),
        ({"provider": "p" * 65}, "provider: at most 64 characters, got 65"),
        ({"since": "0001-01-01"}, "since: 0001-01-01 is outside the years 1970–2999"),
        ({"since": "9999-12-31"}, "since: 9999-12-31 is outside the years 1970–2999"),
    ],
)
def test_an_adjustment_the_database_cannot_hold_is_refused_naming_the_field(
    acme: Agent, staff: Client, change: dict[str, str], says: str
) -> None:
    [proposal] = page(staff).context["proposals"]
    refused = apply(staff, proposal, **change)
    assert refused.status_code == 422
    html = refused.content.decode()
    assert f"Not applied — {says}" in html
    assert PriceAdjustment.objects.count() == 0
    assert outbox_dispatch().kinds.get("prices.reprice_adjusted", 0) == 0


def test_the_page_proposes_nothing_for_a_bill_that_is_not_steady(db: None, staff: Client) -> None:
    add_price(
        "claude-sonnet-4-5", provider="anthropic", input_mtok=Decimal(3), output_mtok=Decimal(15)
    )
    agent = make_agent("acme")
    steps_and_bill(agent, Decimal(12))
    # re-bill alternate days 5 % and 15 % under
    rows = [
        {
            "date": str(day),
            "provider": "anthropic",
            "model": "claude-sonnet-4-5",
            "cost_usd": str(
                (Decimal(3 * (i + 1)) + Decimal("1.50")) * Decimal("0.95" if i % 2 else "0.85")
            ),
        }
        for i, day in enumerate(DAYS)
    ]
    billing_rows_replace(
        rows_from_json({"rows": rows}, default_project=agent.project), source="api"
    )
    response = page(staff)
    assert len(response.context["gaps"]) == 8
    assert response.context["proposals"] == []
    assert 'id="proposals"' not in response.content.decode()


def test_a_day_of_nothing_on_both_sides_is_skipped() -> None:
    lines = under(["12"] * 8)
    lines.append(line(DAYS[-1] + timedelta(days=1), "0", "0"))  # steps that cost $0, billed $0
    [proposal] = drift_proposals(lines)
    assert (proposal.until, proposal.days) == (DAYS[-1], 8)
