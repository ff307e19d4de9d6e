"""What goes out in the admin: webhook endpoints (secrets masked, the URL check's note
shown), the delivery log and the outbox, their failed rows retried from the list, and the
spend anomalies alerted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from costboard.admin.forms import WebhookEndpointForm
from costboard.admin.site import ReadOnlyAdmin
from costboard.budgets.alerts import alert_deliveries_retry
from costboard.models import AlertDelivery, OutboxItem, Project, SpendAnomaly, WebhookEndpoint
from costboard.outbox import outbox_retry


def url_note_show(request: HttpRequest, endpoint: WebhookEndpoint) -> None:
    """What the URL check at save found worth telling (WebhookEndpoint.clean_fields)."""
    if endpoint.url_note:
        messages.warning(request, f"Webhook {endpoint}: {endpoint.url_note}.")


def _masked_secret(endpoint: WebhookEndpoint) -> str:
    return f"••••{endpoint.secret[-4:]}" if len(endpoint.secret) >= 12 else "••••"


def view_only_fields(fields: Sequence[Any], shown: Mapping[str, str | None]) -> list[Any]:
    """A page's fields for a user who may only view it: Django shows each field's stored
    value there, so a secret's field becomes its masked display (`shown`; None: left out).
    A group of fields on one line is a tuple of names."""
    kept: list[Any] = []
    for field in fields:
        if isinstance(field, str):
            name = shown.get(field, field)
            if name is not None:
                kept.append(name)
        else:
            kept.append(tuple(view_only_fields(field, shown)))
    return kept


class WebhookEndpointInline(admin.StackedInline[WebhookEndpoint, Project]):
    model = WebhookEndpoint
    form = WebhookEndpointForm
    extra = 0
    fields = ("name", "url", "secret", "secret_hint", "kinds", "active")
    readonly_fields = ("secret_hint",)

    @admin.display(description="current secret")
    def secret_hint(self, obj: WebhookEndpoint | None) -> str:
        return _masked_secret(obj) if obj is not None and obj.pk else "-"

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = super().get_fields(request, obj)
        if self.has_change_permission(request, obj):
            return fields
        return view_only_fields(fields, {"secret": None})  # the current secret's hint stays


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin[WebhookEndpoint]):
    form = WebhookEndpointForm
    list_display = ("project", "name", "url", "kinds", "active", "secret_hint", "created_at")
    list_filter = ("active", "project")
    search_fields = ("name", "url", "project__slug")
    list_select_related = ("project",)
    readonly_fields = ("secret_hint", "created_at")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = ["project", "name", "url", "secret", "kinds", "active"]
        if obj is None:
            return fields
        if not self.has_change_permission(request, obj):
            fields = view_only_fields(fields, {"secret": None})
        return [*fields, "secret_hint", "created_at"]

    @admin.display(description="secret")
    def secret_hint(self, obj: WebhookEndpoint) -> str:
        return _masked_secret(obj)

    def save_model(
        self, request: HttpRequest, obj: WebhookEndpoint, form: Any, change: bool
    ) -> None:
        super().save_model(request, obj, form, change)
        url_note_show(request, obj)


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(ReadOnlyAdmin[AlertDelivery]):
    """The delivery log: one row per budget event, channel and target, with its last attempt."""

    list_display = (
        "created_at",
        "project",
        "channel",
        "action",
        "target_shown",
        "event_kind",
        "event_session",
        "status",
        "attempts",
        "response_code",
        "delivered_at",
    )
    list_filter = ("status", "channel", "action", "project")
    search_fields = ("target",)
    list_select_related = ("project", "budget_event__session", "billing_drift", "spend_anomaly")
    date_hierarchy = "created_at"
    fields = (
        "project",
        "budget_event",
        "billing_drift",
        "spend_anomaly",
        "channel",
        "action",
        "endpoint",
        "target_shown",
        "status",
        "attempts",
        "response_code",
        "error",
        "created_at",
        "last_attempt_at",
        "delivered_at",
    )
    readonly_fields = fields
    actions = ["retry_deliveries"]

    @admin.display(description="target", ordering="target")
    def target_shown(self, obj: AlertDelivery) -> str:
        """A routing key by its last characters, a Slack URL without its secret path."""
        return obj.target_shown

    @admin.display(description="event", ordering="budget_event__kind")
    def event_kind(self, obj: AlertDelivery) -> str:
        return obj.kind

    @admin.display(description="session", ordering="budget_event__session__external_id")
    def event_session(self, obj: AlertDelivery) -> str:
        if obj.billing_drift is not None:
            return f"{obj.billing_drift.provider} {obj.billing_drift.day}"
        if obj.spend_anomaly is not None:
            return f"{obj.spend_anomaly.subject} {obj.spend_anomaly.day}"
        session = obj.budget_event.session if obj.budget_event is not None else None
        return session.external_id if session is not None else "—"

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("costboard.change_alertdelivery")

    @admin.action(description="Retry selected deliveries", permissions=["retry"])
    def retry_deliveries(self, request: HttpRequest, queryset: QuerySet[AlertDelivery]) -> None:
        chosen = list(queryset.values_list("pk", flat=True))
        queued = alert_deliveries_retry(delivery_ids=chosen)
        skipped = len(chosen) - queued
        note = f"; {skipped} not failed, left as they are" if skipped else ""
        messages.success(request, f"Queued {queued} delivery(ies) again{note}.")


@admin.register(SpendAnomaly)
class SpendAnomalyAdmin(ReadOnlyAdmin[SpendAnomaly]):
    """Days whose spend rose far above their trailing 14 days, each alerted once
    (docs/budgets.md, "Spend anomalies")."""

    list_display = ("day", "project", "subject", "explanation", "at")
    list_filter = ("project",)
    list_select_related = ("project",)
    search_fields = ("tag_value", "explanation")
    date_hierarchy = "day"


@admin.register(OutboxItem)
class OutboxItemAdmin(ReadOnlyAdmin[OutboxItem]):
    """The outbox: side effects waiting to go out (the backlog) and those given up on, with
    their last error. Done items are deleted, so an empty list means all went out."""

    list_display = (
        "created_at",
        "kind",
        "project",
        "status",
        "attempts",
        "next_attempt_at",
        "claimed_until",
        "last_error",
    )
    list_filter = ("status", "kind", "project")
    list_select_related = ("project",)
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    fields = (
        "kind",
        "project",
        "payload",
        "status",
        "attempts",
        "next_attempt_at",
        "claimed_until",
        "last_error",
        "created_at",
    )
    readonly_fields = fields
    actions = ["retry_items"]

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("costboard.change_outboxitem")

    @admin.action(description="Retry selected failed items", permissions=["retry"])
    def retry_items(self, request: HttpRequest, queryset: QuerySet[OutboxItem]) -> None:
        chosen = list(queryset.values_list("pk", flat=True))
        queued = outbox_retry(item_ids=chosen)
        skipped = len(chosen) - queued
        note = f"; {skipped} not failed, left as they are" if skipped else ""
        messages.success(request, f"Queued {queued} item(s) again{note}.")
