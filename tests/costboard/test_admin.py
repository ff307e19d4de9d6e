"""The admin's lists: each model keeps its list (seventeen of Costboard's, and the login
lockouts' that replaces axes' own), and with a row in every list, the index, each list, each
row's page and each add page answer staff. Held across the admin's move into a package by
domain (issue 32), where a module left unimported would drop its lists without an error."""

from __future__ import annotations

from decimal import Decimal

import pytest
from axes.models import AccessAttempt
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from costboard.models import (
    AlertDelivery,
    ApiKey,
    BilledUsage,
    BillingDrift,
    BudgetEvent,
    Membership,
    OutboxItem,
    PeriodBudget,
    PriceAdjustment,
    ProviderProject,
    SpendAnomaly,
    SpendReportDelivery,
    WebhookEndpoint,
)
from tests.conftest import Agent, add_price, make_agent
from tests.costboard.test_admin_amounts import change_form, project_form

pytestmark = pytest.mark.django_db

LISTS = {
    "axes.AccessAttempt": "LoginLockoutAdmin",
    "costboard.AlertDelivery": "AlertDeliveryAdmin",
    "costboard.ApiKey": "ApiKeyAdmin",
    "costboard.BilledUsage": "BilledUsageAdmin",
    "costboard.BillingDrift": "BillingDriftAdmin",
    "costboard.DailyRollup": "DailyRollupAdmin",
    "costboard.Membership": "MembershipAdmin",
    "costboard.ModelPrice": "ModelPriceAdmin",
    "costboard.OutboxItem": "OutboxItemAdmin",
    "costboard.PeriodBudget": "PeriodBudgetAdmin",
    "costboard.PriceAdjustment": "PriceAdjustmentAdmin",
    "costboard.Project": "ProjectAdmin",
    "costboard.ProviderProject": "ProviderProjectAdmin",
    "costboard.Session": "SessionAdmin",
    "costboard.SpendReportDelivery": "SpendReportDeliveryAdmin",
    "costboard.SpendAnomaly": "SpendAnomalyAdmin",
    "costboard.Step": "StepAdmin",
    "costboard.Turn": "TurnAdmin",
    "costboard.WebhookEndpoint": "WebhookEndpointAdmin",
}


def test_each_model_keeps_its_list() -> None:
    registered = {
        model._meta.label: type(model_admin).__name__
        for model, model_admin in admin.site._registry.items()
        if model._meta.app_label == "costboard" or model is AccessAttempt
    }
    assert registered == LISTS


def a_row_in_every_list(agent: Agent) -> None:
    """Ingest writes the session, its turn and step, the rollup, the budget event (the cap is
    passed) and the period ledger; the rest is written as their services leave them."""
    project = agent.project
    project.token_cap = 100
    project.save()
    PeriodBudget.objects.create(project=project, name="monthly", token_limit=10_000)
    add_price("test-sonnet")
    PriceAdjustment.objects.create(
        provider="testco", percent=Decimal(-10), effective_from=timezone.now().date()
    )
    at = timezone.now().isoformat()
    step = {"session_id": "s1", "turn": 1, "step_type": "llm", "model": "test-sonnet"}
    agent.events({**step, "input_tokens": 500, "timestamp": at})
    event = BudgetEvent.objects.get(kind=BudgetEvent.Kind.EXHAUSTED)
    endpoint = WebhookEndpoint.objects.create(
        project=project, url="https://hooks.example.com/costboard", secret="s" * 32
    )
    AlertDelivery.objects.create(
        project=project,
        budget_event=event,
        channel=AlertDelivery.Channel.WEBHOOK,
        endpoint=endpoint,
        target=endpoint.url,
        status=AlertDelivery.Status.FAILED,
    )
    OutboxItem.objects.create(kind="alert_send", project=project, status="failed")
    ProviderProject.objects.create(provider="openai", external_id="proj_a", project=project)
    BilledUsage.objects.create(
        provider="openai", source="openai_costs", day=timezone.now().date(), project=project
    )
    BillingDrift.objects.create(
        project=project,
        provider="openai",
        day=timezone.now().date(),
        drift_pct=Decimal("10"),
        threshold_pct=Decimal("5"),
    )
    SpendReportDelivery.objects.create(
        project=project,
        period="week",
        period_start=timezone.now().date(),
        channel="email",
        target="ann@example.com",
    )
    SpendAnomaly.objects.create(
        project=project,
        day=timezone.now().date(),
        history_days=14,
        k=Decimal(3),
        floor_usd=Decimal(5),
        explanation="$41.20 today against $6.10 ± $2.30 over 14 days",
    )
    AccessAttempt.objects.create(
        username="someone", ip_address="192.0.2.1", failures_since_start=1, user_agent="x"
    )


def test_the_index_each_list_each_row_and_each_add_page_answer(staff: Client, agent: Agent) -> None:
    a_row_in_every_list(agent)
    Membership.objects.create(user=get_user_model().objects.get(), project=agent.project)
    assert staff.get("/admin/").status_code == 200
    for model, model_admin in admin.site._registry.items():
        if model._meta.label not in LISTS:
            continue
        base = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        listed = staff.get(base)
        assert listed.status_code == 200, base
        row = model._default_manager.order_by("pk").first()
        assert row is not None, base  # every list shows a row
        assert staff.get(f"{base}{row.pk}/change/").status_code == 200, base
        can_add = model_admin.has_add_permission(listed.wsgi_request)
        assert staff.get(f"{base}add/").status_code == (200 if can_add else 403), base


def staff_with(username: str, *codenames: str) -> Client:
    """A logged-in staff user, not a superuser, with only these model permissions."""
    user = get_user_model().objects.create_user(username, "", "pw-staff-123", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def test_a_staff_user_who_may_only_view_keys_cannot_revoke_one(agent: Agent) -> None:
    key = ApiKey.objects.get(project=agent.project)
    viewer = staff_with("viewer", "view_apikey")
    listed = viewer.get("/admin/costboard/apikey/")
    assert listed.status_code == 200 and "Revoke selected keys" not in listed.content.decode()
    viewer.post(
        "/admin/costboard/apikey/",
        {"action": "revoke", "_selected_action": [key.pk], "index": "0"},
    )
    key.refresh_from_db()
    assert key.revoked_at is None
    assert agent.budget("nothing").status_code == 404  # the key still answers (a 401 if not)
    changer = staff_with("changer", "view_apikey", "change_apikey")
    changer.post(
        "/admin/costboard/apikey/",
        {"action": "revoke", "_selected_action": [key.pk], "index": "0"},
    )
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert agent.budget("nothing").status_code == 401


def test_a_keys_project_and_role_stay_as_issued_when_its_page_is_saved(
    agent: Agent, staff: Client
) -> None:
    # the key's page let staff move an agent's ingest key to another project as an admin key:
    # the agent's usage went there, and the key read and changed that project's budgets
    key = ApiKey.objects.get(project=agent.project)
    other = make_agent("other")
    url = f"/admin/costboard/apikey/{key.pk}/change/"
    data = change_form(staff, url)
    data.update(project=[str(other.project.pk)], role=["admin"], name=["renamed"])
    assert staff.post(url, data).status_code == 302
    key.refresh_from_db()
    assert (key.project_id, key.role, key.name) == (agent.project.pk, "ingest", "renamed")
    assert agent.budget("nothing").status_code == 404  # the key still answers for acme
    budgets = agent.client.get("/api/v1/budgets", headers={"Authorization": f"Bearer {agent.key}"})
    assert budgets.status_code == 403  # still ingest: period budgets need admin
    # nor on its project's page, where the key is a row
    url, data = project_form(agent, staff)
    data["api_keys-0-role"] = ["admin"]  # the key's row, as the page rendered it before
    assert staff.post(url, data).status_code == 302
    key.refresh_from_db()
    assert key.role == "ingest"


def test_a_revoked_key_stays_revoked_when_its_project_is_saved(agent: Agent, staff: Client) -> None:
    # the project page's key rows let revoked_at be cleared: the revoked key worked again
    key = ApiKey.objects.get(project=agent.project)
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())
    url, data = project_form(agent, staff)
    data = {name: [""] if "revoked_at" in name else values for name, values in data.items()}
    assert staff.post(url, data).status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert agent.budget("nothing").status_code == 401


def test_a_staff_user_who_may_only_view_sees_no_secret_of_a_channel(agent: Agent) -> None:
    # a view-only page shows each field's stored value: the routing key, the Slack URL's
    # secret path and each webhook's secret were there in full
    project = agent.project
    project.pagerduty_routing_key = "R0UTINGKEY0123456789abcdefPD42"
    project.slack_webhook_url = "https://hooks.slack.com/services/T000/B000/SLACKSECRET"
    project.save()
    endpoint = WebhookEndpoint.objects.create(
        project=project, url="https://hooks.example.com/costboard", secret="HOOKSECRET" * 3 + "wh99"
    )
    viewer = staff_with("viewer", "view_project", "view_webhookendpoint")
    project_page = viewer.get(f"/admin/costboard/project/{project.pk}/change/")
    endpoint_page = viewer.get(f"/admin/costboard/webhookendpoint/{endpoint.pk}/change/")
    for page in (project_page, endpoint_page):
        assert page.status_code == 200
        html = page.content.decode()
        assert "R0UTINGKEY" not in html and "SLACKSECRET" not in html and "HOOKSECRET" not in html
        assert "••••wh99" in html  # the webhook's secret by its last characters
    html = project_page.content.decode()
    assert "routing key …PD42" in html and "https://hooks.slack.com/…" in html
    assert "Remove the PagerDuty routing key" not in html
