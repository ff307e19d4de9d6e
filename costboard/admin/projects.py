"""Projects in the admin, with their members, keys and webhooks inline: caps saved through
the budget service (sessions rechecked), keys issued once and revoked, never edited; the
alert channels set up here, and tried with "Send a test alert"."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from costboard.admin.alerts import WebhookEndpointInline, url_note_show, view_only_fields
from costboard.admin.forms import DECIMAL_OVERRIDES, ApiKeyForm, ProjectForm
from costboard.budgets import services as budget_services
from costboard.budgets.alert_senders import channels_test
from costboard.budgets.services import PROJECT_CAP_FIELDS as CAP_FIELDS
from costboard.models import ApiKey, Membership, Project, WebhookEndpoint
from costboard.models.alerts import shown_target
from costboard.projects import api_keys_revoke


class ApiKeyInline(admin.TabularInline[ApiKey, Project]):
    model = ApiKey
    extra = 0
    fields = ("prefix", "name", "role", "created_at", "last_used_at", "revoked_at")
    # revoked on the key list's action only: cleared here, a revoked key would work again;
    # its role is the one it was issued with (another role: a new key)
    readonly_fields = ("prefix", "role", "created_at", "last_used_at", "revoked_at")
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # keys are made on the API key page, where the key is shown once

    def get_queryset(self, request: HttpRequest) -> QuerySet[ApiKey]:
        return super().get_queryset(request).select_related("project")  # each row's title


class MembershipInline(admin.TabularInline[Membership, Project]):
    model = Membership
    extra = 1
    autocomplete_fields = ("user",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Membership]:
        # each row's title names its user and project
        return super().get_queryset(request).select_related("user", "project")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin[Membership]):
    list_display = ("user", "project", "created_at")
    list_filter = ("project",)
    search_fields = ("user__username", "project__slug")
    autocomplete_fields = ("user",)


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin[Project]):
    form = ProjectForm
    formfield_overrides = DECIMAL_OVERRIDES
    actions = ["send_test_alert"]
    list_display = ("name", "slug", "token_cap", "cost_cap_usd", "warn_at_pct", "created_at")
    search_fields = ("name", "slug")
    prepopulated_fields = {"slug": ("name",)}
    inlines = [MembershipInline, ApiKeyInline, WebhookEndpointInline]
    fieldsets = [
        (None, {"fields": ("name", "slug")}),
        (
            "Session caps",
            {
                "description": "Per session; a session's own caps (sent at its start or set "
                "on its page here) come first, the environment's defaults last.",
                "fields": (
                    "token_cap",
                    "cost_cap_usd",
                    "warn_at_pct",
                    "system_token_cap",
                    "system_cost_cap_usd",
                ),
            },
        ),
        (
            "Runaway rules",
            {
                "description": "0 turns a rule off.",
                "fields": (
                    "runaway_failed_steps",
                    "runaway_repeated_steps",
                    "runaway_turn_steps",
                    "runaway_burn_window_minutes",
                    "runaway_burn_factor",
                    "runaway_burn_floor",
                    "runaway_overrun_minutes",
                    "runaway_max_hours",
                ),
            },
        ),
        (
            "Alerts and retention",
            {
                "description": "Webhooks are below; Slack and PagerDuty here. Try them "
                "with the list's action “Send a test alert to each channel”.",
                "fields": (
                    "alert_channels",
                    "alert_emails",
                    "slack_webhook_url",
                    "pagerduty_routing_key",
                    "pagerduty_routing_key_remove",
                    "reconciliation_drift_pct",
                    "retention_days",
                ),
            },
        ),
        (
            "Spend report",
            {
                "description": "The weekly and monthly showback by email (and to Slack when "
                "the project has a Slack webhook): docs/reports.md.",
                "fields": ("report_recipients", "report_tag_key"),
            },
        ),
        ("Spend anomalies", {"fields": ("anomaly_k", "anomaly_floor_usd")}),
        ("API", {"fields": ("api_rate_limit", "api_max_in_flight")}),
    ]

    # a user who may only view sees the alert channels' secrets as the delivery log shows them
    readonly_fields = ("pagerduty_key_shown", "slack_url_shown")
    VIEW_ONLY = {
        "pagerduty_routing_key": "pagerduty_key_shown",
        "pagerduty_routing_key_remove": None,
        "slack_webhook_url": "slack_url_shown",
    }

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or self.has_change_permission(request, obj):
            return fieldsets
        return [
            (name, {**options, "fields": view_only_fields(options["fields"], self.VIEW_ONLY)})
            for name, options in fieldsets
        ]

    @admin.display(description="PagerDuty routing key")
    def pagerduty_key_shown(self, obj: Project) -> str:
        key = obj.pagerduty_routing_key
        return shown_target("pagerduty", key) if key else "-"

    @admin.display(description="Slack incoming-webhook URL")
    def slack_url_shown(self, obj: Project) -> str:
        url = obj.slack_webhook_url
        return shown_target("slack", url) if url else "-"

    def save_model(self, request: HttpRequest, obj: Project, form: Any, change: bool) -> None:
        caps = {name: getattr(obj, name) for name in CAP_FIELDS if name in form.changed_data}
        if not change:
            super().save_model(request, obj, form, change)
            return
        # the caps through their service (old ones read under the project's lock, sessions
        # rechecked after commit); the other fields as the admin saves them
        budget_services.project_caps_set(project=obj, changes=caps)
        super().save_model(request, obj, form, change)
        if obj.slack_url_note:
            messages.warning(request, f"Slack URL: {obj.slack_url_note}.")
        if caps:
            messages.info(request, "Session budgets of this project are being rechecked.")

    @admin.action(description="Send a test alert to each channel", permissions=["change"])
    def send_test_alert(self, request: HttpRequest, queryset: QuerySet[Project]) -> None:
        """Now, in this request (a few seconds per channel at most): each set-up channel's
        answer shown, nothing recorded."""
        for project in queryset.order_by("slug"):
            sent = channels_test(project, now=timezone.now())
            if not sent:
                messages.warning(
                    request,
                    f"{project.slug}: no channel is set up (webhooks, alert emails, a Slack "
                    "URL, a PagerDuty routing key).",
                )
            for one in sent:
                attempt = one.attempt
                code = f" (HTTP {attempt.response_code})" if attempt.response_code else ""
                if attempt.ok:
                    messages.success(
                        request, f"{project.slug}: {one.channel} {one.target}: sent{code}."
                    )
                else:
                    messages.error(
                        request, f"{project.slug}: {one.channel} {one.target}: {attempt.error}."
                    )

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        super().save_formset(request, form, formset, change)
        if formset.model is WebhookEndpoint:
            for inline_form in formset.forms:
                if inline_form.has_changed():  # not every endpoint on every save of the page
                    url_note_show(request, inline_form.instance)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin[ApiKey]):
    list_display = (
        "prefix",
        "name",
        "role",
        "project",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    list_filter = ("project", "role", ("revoked_at", admin.EmptyFieldListFilter))
    readonly_fields = ("prefix", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """An issued key keeps its project and role (the agent holding it sends to that
        project with that right); another is a new key. Its name may change."""
        if obj is None:
            return self.readonly_fields
        return ("project", "role", *self.readonly_fields)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = ApiKeyForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ("project", "name", "role")
        return ("project", "name", "role", "prefix", "created_at", "last_used_at", "revoked_at")

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        key, raw_key = ApiKey.issue(project=obj.project, name=obj.name, role=obj.role)
        obj.pk = key.pk
        obj.prefix, obj.key_hash, obj.created_at = key.prefix, key.key_hash, key.created_at
        messages.warning(
            request,
            f"New key for {obj.project.slug}: {raw_key} — copy it now, it is not shown again.",
        )

    # a change: an action without permissions is offered to whoever may view the list
    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        n = api_keys_revoke(key_ids=list(queryset.values_list("pk", flat=True)), at=timezone.now())
        messages.success(request, f"Revoked {n} key(s).")
