from __future__ import annotations

import json
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.forms.fields import InvalidJSONInput
from django.http import HttpRequest
from django.utils import timezone

from costboard.budgets import services as budget_services
from costboard.budgets.alerts import alert_deliveries_retry
from costboard.budgets.period_services import (
    FIELDS as BUDGET_FIELDS,
)
from costboard.budgets.period_services import (
    BudgetInputError,
    budget_check,
    period_budget_create,
    period_budget_update,
)
from costboard.budgets.services import PROJECT_CAP_FIELDS as CAP_FIELDS
from costboard.ingest.schemas import MAX_TOKENS, bad_text
from costboard.lockout_admin import LoginLockoutAdmin  # noqa: F401  (axes' list, replaced)
from costboard.models import (
    ALERT_KINDS,
    AlertDelivery,
    ApiKey,
    BudgetEvent,
    DailyRollup,
    Membership,
    ModelPrice,
    OutboxItem,
    PeriodBudget,
    PeriodLedger,
    Project,
    Session,
    Step,
    Turn,
    WebhookEndpoint,
)
from costboard.numbers import count_text, usd_text
from costboard.outbox import outbox_retry
from costboard.pricing import services as pricing_services
from costboard.projects import api_keys_revoke, sessions_delete

RATE_FIELDS = (
    "input_mtok",
    "output_mtok",
    "cache_read_mtok",
    "cache_write_mtok",
    "cache_write_1h_mtok",
)


admin.site.site_header = "Costboard administration"
admin.site.site_title = "Costboard admin"
admin.site.index_title = "Rates, caps, keys and projects"
# the rate list's editable columns need the width at 1366 px; the index and breadcrumbs lead
admin.site.enable_nav_sidebar = False

MAX_RATE = Decimal(10**10)  # the rate columns' 20 digits, 10 after the point


class PlainDecimalField(forms.DecimalField):
    """A decimal as written, not as stored: 5, 0.3, 0 (the columns' 10 places read
    "5.0000000000" and "0E-10")."""

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, Decimal):
            text = f"{value.normalize():f}"
            return "0" if text in ("-0", "") else text
        return value


# every decimal in the admin, in its forms and its list's editable cells, reads as written
DECIMAL_OVERRIDES: Mapping[type[models.Field[Any, Any]], Mapping[str, Any]] = {
    models.DecimalField: {
        "form_class": PlainDecimalField,
        # its width in static/costboard/admin.css: the CSP allows no style attribute
        "widget": forms.NumberInput(attrs={"size": 8, "class": "decimal-input"}),
    }
}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON: write a number or a decimal string")


class TiersField(forms.JSONField):
    """The tiers as JSON read with the API's rules: NaN and Infinity are not JSON (PostgreSQL's
    jsonb refuses them), and JSON nested past what Python parses is refused, not a 500."""

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and value.strip():
            try:
                json.loads(value, parse_constant=_no_constant)
            except RecursionError:
                raise forms.ValidationError("nests too deep: a list of flat objects") from None
            except ValueError as exc:
                raise forms.ValidationError(f"not valid JSON: {exc}") from None
        return super().to_python(value)

    def bound_data(self, data: Any, initial: Any) -> Any:
        # A refused value is shown back as typed: Django would parse it again (and fail on
        # depth) or print what it holds (a lone surrogate cannot be written as UTF-8).
        try:
            value = super().bound_data(data, initial)
        except (ValueError, RecursionError):
            return InvalidJSONInput(data)
        return InvalidJSONInput(data) if bad_text(value) is not None else value


def _tier_rate_fault(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return 'must be a rate in USD per million tokens, e.g. "6"'
    try:
        rate = Decimal(str(value).strip())
    except ArithmeticError:
        return 'must be a rate in USD per million tokens, e.g. "6"'
    if not rate.is_finite() or not 0 <= rate < MAX_RATE:
        return f"must be a rate from 0 to {MAX_RATE:,} USD per million tokens"
    return None


class ModelPriceForm(forms.ModelForm):
    class Meta:
        model = ModelPrice
        field_classes = {"tiers": TiersField}
        fields = (
            "provider",
            "model",
            "model_regex",
            *RATE_FIELDS,
            "tiers",
            "context_window",
            "effective_from",
            "window_start",
            "window_end",
            "source",
            "edited_by_admin",
            "external_id",
        )

    def clean_model_regex(self) -> str:
        pattern = self.cleaned_data["model_regex"]
        if pattern:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise forms.ValidationError(f"not a valid regular expression: {exc}") from None
        return pattern

    def clean_tiers(self) -> list[dict[str, Any]]:
        tiers = self.cleaned_data["tiers"] or []
        if not isinstance(tiers, list):
            raise forms.ValidationError('a list like [{"start": 200000, "input_mtok": "6"}]')
        for tier in tiers:
            if not isinstance(tier, dict):
                raise forms.ValidationError('each tier is an object like {"start": 200000, …}')
            # NUL or a lone surrogate ("\u0000", "\ud800" in the JSON): PostgreSQL refuses them
            found = bad_text(tier)
            if found is not None:
                raise forms.ValidationError(f"tier {found[0]}: {found[1]}")
            unknown = set(tier) - {"start", *RATE_FIELDS}
            if unknown:
                raise forms.ValidationError(f"unknown tier keys: {', '.join(sorted(unknown))}")
            start = tier.get("start")
            if isinstance(start, bool) or not isinstance(start, int):
                raise forms.ValidationError('each tier needs an integer "start"')
            if not 0 <= start <= MAX_TOKENS:
                raise forms.ValidationError(f'a tier\'s "start" is from 0 to {MAX_TOKENS:,} tokens')
            for name in RATE_FIELDS:
                fault = _tier_rate_fault(tier.get(name))
                if fault is not None:
                    raise forms.ValidationError(f"tier {name}: {fault}")
        return tiers

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if "window_start" in self.errors or "window_end" in self.errors:
            return cleaned
        fault = pricing_services.price_window_fault(  # the rule price_save holds
            provider=cleaned.get("provider", ""),
            model=cleaned.get("model", ""),
            effective_from=cleaned.get("effective_from"),
            window_start=cleaned.get("window_start"),
            window_end=cleaned.get("window_end"),
            pk=self.instance.pk,
        )
        if fault is not None:
            self.add_error(fault.field, fault.message)
        return cleaned


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    form = ModelPriceForm
    formfield_overrides = DECIMAL_OVERRIDES
    list_display = (
        "model",
        "provider",
        "effective",
        "daily_window",
        *RATE_FIELDS[:4],
        "window_tokens",
        "edited_by_admin",
    )  # the source is a filter beside the list
    list_editable = RATE_FIELDS[:4]
    list_filter = ("source", "edited_by_admin", "provider")
    search_fields = ("model", "external_id", "provider")
    readonly_fields = ("created_at", "updated_at")
    list_per_page = 50

    @admin.display(description="from", ordering="effective_from")
    def effective(self, obj: ModelPrice) -> str:
        moment = obj.effective_from
        return f"{moment:%Y-%m-%d}" if f"{moment:%H:%M}" == "00:00" else f"{moment:%Y-%m-%d %H:%M}"

    @admin.display(description="context window", ordering="context_window")
    def window_tokens(self, obj: ModelPrice) -> str:
        return count_text(obj.context_window) if obj.context_window else "—"

    @admin.display(description="window (UTC)", ordering="window_start")
    def daily_window(self, obj: ModelPrice) -> str:
        if obj.window_start is None or obj.window_end is None:
            return "all day"
        return f"{obj.window_start:%H:%M}–{obj.window_end:%H:%M}"

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        # "Add price" links from the unpriced-models list carry ?model=…
        return {"source": ModelPrice.Source.MANUAL, **super().get_changeform_initial_data(request)}

    def save_model(self, request: HttpRequest, obj: ModelPrice, form: Any, change: bool) -> None:
        pricing_services.price_save(price=obj, by_admin=change)
        messages.info(request, "Steps covered by this price are being repriced.")

    def delete_model(self, request: HttpRequest, obj: ModelPrice) -> None:
        pricing_services.prices_delete(prices=[obj])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ModelPrice]) -> None:
        pricing_services.prices_delete(prices=queryset)


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    fields = ("prefix", "name", "role", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "created_at", "last_used_at")
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # keys are made on the API key page, where the key is shown once


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ("user",)


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "project", "created_at")
    list_filter = ("project",)
    search_fields = ("user__username", "project__slug")
    autocomplete_fields = ("user",)


class WebhookEndpointForm(forms.ModelForm):
    """The secret is write-only: never rendered back; left blank on an edit, it is kept."""

    # a URL typed without a scheme is https (Django 6's default; 5.2 warns without it)
    url = forms.URLField(
        max_length=500,
        assume_scheme="https",
        help_text="A public http(s) receiver: loopback, private, link-local and metadata "
        "addresses are refused here and at every send unless the host is in "
        "COSTBOARD_WEBHOOK_ALLOW_HOSTS.",
    )
    secret = forms.CharField(
        required=False,
        max_length=200,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Shared secret of the X-Costboard-Signature (HMAC-SHA256), e.g. from "
        "`python -c 'import secrets; print(secrets.token_hex(32))'`. Not shown again; leave "
        "blank to keep the current one.",
    )
    kinds = forms.MultipleChoiceField(
        choices=[(kind, kind) for kind in ALERT_KINDS],
        widget=forms.CheckboxSelectMultiple,
        help_text="The budget events sent to this URL.",
    )

    class Meta:
        model = WebhookEndpoint
        fields = ("project", "name", "url", "secret", "kinds", "active")

    def clean_secret(self) -> str:
        secret: str = self.cleaned_data["secret"]
        if secret:
            return secret
        if self.instance.pk and self.instance.secret:
            return self.instance.secret
        raise forms.ValidationError(
            "Enter a shared secret; the receiver checks signatures with it."
        )


def _url_note_show(request: HttpRequest, endpoint: WebhookEndpoint) -> None:
    """What the URL check at save found worth telling (WebhookEndpoint.clean_fields)."""
    if endpoint.url_note:
        messages.warning(request, f"Webhook {endpoint}: {endpoint.url_note}.")


def _masked_secret(endpoint: WebhookEndpoint) -> str:
    return f"••••{endpoint.secret[-4:]}" if len(endpoint.secret) >= 12 else "••••"


class WebhookEndpointInline(admin.StackedInline):
    model = WebhookEndpoint
    form = WebhookEndpointForm
    extra = 0
    fields = ("name", "url", "secret", "secret_hint", "kinds", "active")
    readonly_fields = ("secret_hint",)

    @admin.display(description="current secret")
    def secret_hint(self, obj: WebhookEndpoint | None) -> str:
        return _masked_secret(obj) if obj is not None and obj.pk else "-"


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    formfield_overrides = DECIMAL_OVERRIDES
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
        ("Alerts and retention", {"fields": ("alert_emails", "retention_days")}),
        ("API", {"fields": ("api_rate_limit", "api_max_in_flight")}),
    ]

    def save_model(self, request: HttpRequest, obj: Project, form: Any, change: bool) -> None:
        caps = {name: getattr(obj, name) for name in CAP_FIELDS if name in form.changed_data}
        if not change:
            super().save_model(request, obj, form, change)
            return
        # the caps through their service (old ones read under the project's lock, sessions
        # rechecked after commit); the other fields as the admin saves them
        budget_services.project_caps_set(project=obj, changes=caps)
        super().save_model(request, obj, form, change)
        if caps:
            messages.info(request, "Session budgets of this project are being rechecked.")

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        super().save_formset(request, form, formset, change)
        if formset.model is WebhookEndpoint:
            for inline_form in formset.forms:
                if inline_form.has_changed():  # not every endpoint on every save of the page
                    _url_note_show(request, inline_form.instance)


class ApiKeyForm(forms.ModelForm):
    class Meta:
        model = ApiKey
        fields = ("project", "name", "role")


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
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

    @admin.action(description="Revoke selected keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        n = api_keys_revoke(key_ids=list(queryset.values_list("pk", flat=True)), at=timezone.now())
        messages.success(request, f"Revoked {n} key(s).")


class BudgetEventInline(admin.TabularInline):
    model = BudgetEvent
    extra = 0
    fields = ("kind", "at", "tokens_used", "cost_usd", "detail")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    formfield_overrides = DECIMAL_OVERRIDES
    list_display = (
        "external_id",
        "project",
        "state",
        "tokens_used",
        "cost_usd",
        "turn_count",
        "step_count",
        "last_active_at",
    )
    list_filter = ("project", "state")
    search_fields = ("external_id", "user_id")
    list_select_related = ("project",)
    fields = (
        "project",
        "external_id",
        "user_id",
        "parent",
        "token_cap",
        "cost_cap_usd",
        "state",
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "reasoning_tokens",
        "cost_usd",
        "turn_count",
        "step_count",
        "error_count",
        "warned_at",
        "exhausted_at",
        "runaway_at",
        "runaway_reason",
        "acknowledged_at",
        "acknowledged_by",
        "started_at",
        "last_active_at",
        "ended_at",
        "metadata",
    )
    readonly_fields = tuple(f for f in fields if f not in {"token_cap", "cost_cap_usd"})
    inlines = [BudgetEventInline]
    date_hierarchy = "last_active_at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # sessions come from agents

    # deleted through the service: each project's count of sessions goes down with them
    def delete_model(self, request: HttpRequest, obj: Session) -> None:
        sessions_delete(session_ids=[obj.pk])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        sessions_delete(session_ids=list(queryset.values_list("pk", flat=True)))

    def save_model(self, request: HttpRequest, obj: Session, form: Any, change: bool) -> None:
        # only the caps are editable here: set under the session's lock, state decided again
        changed = set(form.changed_data)
        budget_services.session_caps_set(
            session_id=obj.pk,
            at=timezone.now(),
            token_cap=obj.token_cap if "token_cap" in changed else budget_services.KEEP,
            cost_cap_usd=obj.cost_cap_usd if "cost_cap_usd" in changed else budget_services.KEEP,
        )


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Turn)
class TurnAdmin(ReadOnlyAdmin):
    list_display = ("session", "number", "step_count", "cost_usd", "started_at")
    list_select_related = ("session",)
    search_fields = ("session__external_id",)


@admin.register(Step)
class StepAdmin(ReadOnlyAdmin):
    list_display = (
        "timestamp",
        "step_type",
        "model",
        "family",
        "provider",
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "cost_usd",
        "success",
    )
    list_filter = ("step_type", "success", ("price", admin.EmptyFieldListFilter))
    search_fields = ("model", "event_id")
    show_full_result_count = False


@admin.register(DailyRollup)
class DailyRollupAdmin(ReadOnlyAdmin):
    list_display = (
        "day",
        "project",
        "family",
        "model",
        "step_type",
        "calls",
        "cost_usd",
        "unpriced_calls",
    )
    list_filter = ("project", "step_type")
    search_fields = ("family", "model")
    date_hierarchy = "day"


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = WebhookEndpointForm
    list_display = ("project", "name", "url", "kinds", "active", "secret_hint", "created_at")
    list_filter = ("active", "project")
    search_fields = ("name", "url", "project__slug")
    list_select_related = ("project",)
    readonly_fields = ("secret_hint", "created_at")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = ["project", "name", "url", "secret", "kinds", "active"]
        return [*fields, "secret_hint", "created_at"] if obj is not None else fields

    @admin.display(description="secret")
    def secret_hint(self, obj: WebhookEndpoint) -> str:
        return _masked_secret(obj)

    def save_model(
        self, request: HttpRequest, obj: WebhookEndpoint, form: Any, change: bool
    ) -> None:
        super().save_model(request, obj, form, change)
        _url_note_show(request, obj)


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(ReadOnlyAdmin):
    """The delivery log: one row per budget event, channel and target, with its last attempt."""

    list_display = (
        "created_at",
        "project",
        "channel",
        "target",
        "event_kind",
        "event_session",
        "status",
        "attempts",
        "response_code",
        "delivered_at",
    )
    list_filter = ("status", "channel", "project")
    search_fields = ("target",)
    list_select_related = ("project", "budget_event__session")
    date_hierarchy = "created_at"
    fields = (
        "project",
        "budget_event",
        "channel",
        "endpoint",
        "target",
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

    @admin.display(description="event", ordering="budget_event__kind")
    def event_kind(self, obj: AlertDelivery) -> str:
        return obj.budget_event.kind

    @admin.display(description="session", ordering="budget_event__session__external_id")
    def event_session(self, obj: AlertDelivery) -> str:
        session = obj.budget_event.session
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


@admin.register(OutboxItem)
class OutboxItemAdmin(ReadOnlyAdmin):
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


class PeriodBudgetForm(forms.ModelForm):
    class Meta:
        model = PeriodBudget
        fields = ("project", *BUDGET_FIELDS)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        # a stored budget's project is read-only in its form: checked against it all the same
        project = cleaned.get("project") or (self.instance.project if self.instance.pk else None)
        if project is not None and not self.errors:
            try:
                cleaned.update(budget_check(project, cleaned, stored=self.instance))
            except BudgetInputError as exc:
                self.add_error(exc.field if exc.field in self.fields else None, exc.message)
        return cleaned


class PeriodLedgerInline(admin.TabularInline):
    model = PeriodLedger
    extra = 0
    fields = ("period_start", "period_end", "member", "state", "tokens", "spent", "warned_at")
    readonly_fields = fields
    can_delete = False
    ordering = ("-period_start", "member")
    max_num = 0  # written by the budget engine only

    @admin.display(description="tokens used")
    def tokens(self, obj: PeriodLedger) -> str:
        return count_text(obj.tokens_used)

    @admin.display(description="spent")
    def spent(self, obj: PeriodLedger) -> str:
        return usd_text(obj.cost_usd)


@admin.register(PeriodBudget)
class PeriodBudgetAdmin(admin.ModelAdmin):
    formfield_overrides = DECIMAL_OVERRIDES
    """Budgets above the session: a project's, a user's, a key's or a tag's spend per day,
    week, month or in total (the same checks as POST /api/v1/budgets)."""

    form = PeriodBudgetForm
    list_display = (
        "name",
        "project",
        "scope",
        "scope_value",
        "period",
        "tokens",
        "cost_limit",
        "action",
    )
    list_filter = ("project", "scope", "period", "action")
    search_fields = ("name", "scope_value")
    inlines = [PeriodLedgerInline]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return ("project",) if obj is not None else ()

    # money as the pages show it ($1.00; below a cent, three significant digits)
    @admin.display(description="USD limit", ordering="cost_limit_usd")
    def cost_limit(self, obj: PeriodBudget) -> str:
        return usd_text(obj.cost_limit_usd)

    @admin.display(description="token limit", ordering="token_limit")
    def tokens(self, obj: PeriodBudget) -> str:
        return count_text(obj.token_limit)

    def save_model(self, request: HttpRequest, obj: PeriodBudget, form: Any, change: bool) -> None:
        fields = {name: form.cleaned_data[name] for name in BUDGET_FIELDS}
        if change:
            saved = period_budget_update(obj, changes=fields)
        else:
            saved = period_budget_create(project=form.cleaned_data["project"], fields=fields)
        obj.pk = saved.pk
