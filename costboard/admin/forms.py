"""The admin's forms: decimals shown as written, a price's tiers and daily window checked
with the API's rules, a webhook's write-only secret, a project's alert channels and
write-only PagerDuty routing key, a new key's few fields, and a period budget checked as
POST /api/v1/budgets checks it."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from django import forms
from django.db import models
from django.forms.fields import InvalidJSONInput
from pydantic import ValidationError

from costboard.budgets.period_services import FIELDS as BUDGET_FIELDS
from costboard.budgets.period_services import BudgetFields, BudgetInputError, budget_check
from costboard.ingest.json_body import bad_text
from costboard.ingest.schemas import MAX_TOKENS, validation_errors
from costboard.input_limits import amount_fault
from costboard.models import (
    ALERT_KINDS,
    STANDARD_TIER,
    TIER_WORD,
    ApiKey,
    ModelPrice,
    PeriodBudget,
    Project,
    Session,
    WebhookEndpoint,
    service_tier_word,
)
from costboard.models.projects import ALERT_CHANNELS
from costboard.pricing import services as pricing_services
from costboard.pricing.services import RATE_FIELDS

MAX_RATE = Decimal(10**10)  # the rate columns' 20 digits, 10 after the point


class PlainDecimalField(forms.DecimalField):
    """A decimal as written, not as stored: 5, 0.3, 0 (the columns' 10 places read
    "5.0000000000" and "0E-10"); typed in the digits 0-9 (Decimal() reads "１２" as 12)."""

    def clean(self, value: Any) -> Any:
        fault = amount_fault(value) if isinstance(value, str) else None
        if fault is not None:
            raise forms.ValidationError(f"“{value.strip()[:40]}” {fault}", code="invalid")
        return super().clean(value)

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, Decimal):
            text = f"{value.normalize():f}"
            return "0" if text in ("-0", "") else text
        return value


class PlainIntegerField(forms.IntegerField):
    """A whole number typed in the digits 0-9 alone (int() reads "１２" as 12, "1_000" as
    1000)."""

    def clean(self, value: Any) -> Any:
        fault = amount_fault(value, example="200000") if isinstance(value, str) else None
        if fault is not None:
            raise forms.ValidationError(f"“{value.strip()[:40]}” {fault}", code="invalid")
        return super().clean(value)


# every decimal in the admin, in its forms and its list's editable cells, reads as written;
# every number, decimal or whole, is typed in the digits 0-9
DECIMAL_OVERRIDES: Mapping[type[models.Field[Any, Any]], Mapping[str, Any]] = {
    models.DecimalField: {
        "form_class": PlainDecimalField,
        # its width in static/costboard/admin.css: the CSP allows no style attribute
        "widget": forms.NumberInput(attrs={"size": 8, "class": "decimal-input"}),
    },
    # BigIntegerField too: the admin's own defaults name it apart (a widget of its own)
    models.IntegerField: {"form_class": PlainIntegerField},
    models.BigIntegerField: {"form_class": PlainIntegerField},
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
    fault = amount_fault(value, example='"6"') if isinstance(value, str) else None
    if fault is not None:
        return fault
    try:
        rate = Decimal(str(value).strip())
    except ArithmeticError:
        return 'must be a rate in USD per million tokens, e.g. "6"'
    if not rate.is_finite() or not 0 <= rate < MAX_RATE:
        return f"must be a rate from 0 to {MAX_RATE:,} USD per million tokens"
    return None


class PriceRatesForm(forms.ModelForm[ModelPrice]):
    """A price row's rates held to price_save's rule (0 or more), each fault on its field: the
    base of the price form and of the rate list's editable cells."""

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        for name in RATE_FIELDS:
            if name in cleaned:
                fault = pricing_services.price_rate_fault({name: cleaned[name]})
                if fault is not None:
                    self.add_error(fault.field, fault.message)
        if "window_start" not in self.fields and self.instance.pk is not None:
            # the list's cells: the row's window as stored, which price_save checks again
            fault = pricing_services.stored_window_fault(self.instance)
            if fault is not None:
                self.add_error(None, f"{fault.field}: {fault.message}")
        if "effective_from" not in self.fields and self.instance.pk is not None:
            # a row stored with a day out of range before price_day_fault: edit it in its form
            fault = pricing_services.price_day_fault(self.instance.effective_from)
            if fault is not None:
                self.add_error(None, f"{fault.field}: {fault.message}")
        return cleaned


class ModelPriceForm(PriceRatesForm):
    class Meta:
        model = ModelPrice
        field_classes = {"tiers": TiersField}
        fields = (
            "provider",
            "model",
            "service_tier",
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "service_tier" in self.fields:
            self.fields["service_tier"].required = False  # blank: standard

    def clean_service_tier(self) -> str:
        tier: str = (self.cleaned_data.get("service_tier") or "").strip()
        if not tier:
            return STANDARD_TIER
        if not TIER_WORD.fullmatch(tier):
            raise forms.ValidationError(
                "a service tier: standard, flex, priority, batch or the provider's word "
                "(letters, digits, _ . - :, at most 32 characters)"
            )
        return service_tier_word(tier)

    def clean_model_regex(self) -> str:
        pattern: str = self.cleaned_data["model_regex"]
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

    def clean_effective_from(self) -> datetime | None:
        effective_from: datetime | None = self.cleaned_data.get("effective_from")
        fault = pricing_services.price_day_fault(effective_from)  # the rule price_save holds
        if fault is not None:
            raise forms.ValidationError(fault.message)
        return effective_from

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
            service_tier=cleaned.get("service_tier") or STANDARD_TIER,
        )
        if fault is not None:
            self.add_error(fault.field, fault.message)
        return cleaned


class WebhookEndpointForm(forms.ModelForm[WebhookEndpoint]):
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


CHANNEL_CHOICES = [(channel, channel) for channel in ALERT_CHANNELS]

# a project's caps and a session's own (blank: inherited)
USD_CAP_FIELDS = ("cost_cap_usd", "system_cost_cap_usd")
TOKEN_CAP_FIELDS = ("token_cap", "system_token_cap")


def caps_check(form: forms.ModelForm[Any], cleaned: Mapping[str, Any]) -> None:
    """A USD cap below 0, or a token cap below 1, is an error on its field: the API's session
    event takes those (docs/api.md), and a cap under them would hold every session
    exhausted."""
    for name in USD_CAP_FIELDS:
        value = cleaned.get(name)
        if value is not None and value < 0:
            form.add_error(
                name,
                f"must be 0 or more USD, got {value.normalize():f}: a cap such as 5.00, or "
                "blank to inherit",
            )
    for name in TOKEN_CAP_FIELDS:
        value = cleaned.get(name)
        if value is not None and value < 1:
            form.add_error(
                name,
                f"must be 1 or more tokens, got {value}: a cap such as 200000, or blank to inherit",
            )


class SessionCapsForm(forms.ModelForm[Session]):
    """A session's own caps, as the admin edits them: a USD cap of 0 or more, a token cap of
    1 or more (caps_check)."""

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        caps_check(self, cleaned)
        return cleaned


class ProjectForm(forms.ModelForm[Project]):
    """The alert channels as checkboxes; the PagerDuty routing key write-only (never rendered
    back; blank keeps it, the checkbox below removes it). Project.clean_fields checks them."""

    alert_channels = forms.MultipleChoiceField(
        choices=CHANNEL_CHOICES,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Where alerts of budgets that choose no channels go, and session and "
        "billing alerts; PagerDuty is paged only when a budget or session is exhausted.",
    )
    slack_webhook_url = forms.URLField(
        label="Slack incoming-webhook URL",
        required=False,
        max_length=500,
        assume_scheme="https",
        help_text="https://hooks.slack.com/services/…: alerts as Slack messages; blank: no "
        "Slack. Checked as webhooks are (loopback, private and metadata addresses refused "
        "unless the host is in COSTBOARD_WEBHOOK_ALLOW_HOSTS).",
    )
    pagerduty_routing_key = forms.CharField(
        label="PagerDuty routing key",
        required=False,
        max_length=64,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="The Integration Key of a PagerDuty service's Events API v2 integration: an "
        "exhausted budget or session triggers an incident, resolved when the period rolls "
        "over, the limit is raised or the session is acknowledged. Not shown again; leave "
        "blank to keep the current one.",
    )
    pagerduty_routing_key_remove = forms.BooleanField(
        label="Remove the PagerDuty routing key", required=False
    )

    class Meta:
        model = Project
        # the admin's fieldsets name the rest
        fields = ("name", "slug", "alert_channels", "slack_webhook_url", "pagerduty_routing_key")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        key = self.instance.pagerduty_routing_key if self.instance.pk else ""
        field = self.fields.get("pagerduty_routing_key")
        if field is not None and key:
            field.help_text += f" Current: …{key[-4:]}."

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        caps_check(self, cleaned)
        if "pagerduty_routing_key" in self.fields:
            if cleaned.get("pagerduty_routing_key_remove"):
                cleaned["pagerduty_routing_key"] = ""
            elif not cleaned.get("pagerduty_routing_key") and self.instance.pk:
                cleaned["pagerduty_routing_key"] = self.instance.pagerduty_routing_key
        return cleaned


class ApiKeyForm(forms.ModelForm[ApiKey]):
    class Meta:
        model = ApiKey
        fields = ("project", "name", "role")


class PeriodBudgetForm(forms.ModelForm[PeriodBudget]):
    """A budget's fields typed as the API types them (BudgetFields: `budget_fields`, what the
    admin saves) and checked by the same `budget_check`."""

    budget_fields: BudgetFields | None = None
    channels = forms.MultipleChoiceField(
        choices=CHANNEL_CHOICES,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Where its alerts go; none ticked: the project's default channels. Slack "
        "and PagerDuty need the project's Slack URL and routing key (Projects).",
    )
    # the warn fractions as people type them: "0.5, 0.8, 0.95" (stored as a list)
    warn_at = forms.CharField(
        initial="0.8",
        required=False,
        max_length=200,
        help_text="the fractions of a limit that warn, ascending, comma-separated: "
        "0.5, 0.8, 0.95 (each crossing alerted once; the first also soft_warned)",
    )

    class Meta:
        model = PeriodBudget
        fields = ("project", *BUDGET_FIELDS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.initial["warn_at"] = ", ".join(str(f) for f in self.instance.warn_at or [])

    def clean_warn_at(self) -> list[str] | None:
        text = str(self.cleaned_data.get("warn_at") or "")
        fractions = [part.strip() for part in text.replace(";", ",").split(",") if part.strip()]
        for fraction in fractions:
            fault = amount_fault(fraction, example="0.8")  # Decimal() reads "０.８" as 0.8
            if fault is not None:
                raise forms.ValidationError(f"“{fraction[:20]}” {fault}")
        return fractions or None  # blank: the default, [0.8]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        # a stored budget's project is read-only in its form: checked against it all the same
        project = cleaned.get("project") or (self.instance.project if self.instance.pk else None)
        if project is None or self.errors:
            return cleaned
        try:
            typed = BudgetFields.model_validate(
                {
                    name: cleaned[name]
                    for name in BUDGET_FIELDS
                    if not (name == "warn_at" and cleaned[name] is None)
                }
            )
        except ValidationError as exc:
            for error in validation_errors(exc, BudgetFields):
                field = error["field"]
                self.add_error(field if field in self.fields else None, error["message"])
            return cleaned
        try:
            cleaned.update(budget_check(project, typed, stored=self.instance))
        except BudgetInputError as exc:
            self.add_error(exc.field if exc.field in self.fields else None, exc.message)
        else:
            self.budget_fields = typed
        return cleaned


class BillingCsvForm(forms.Form):
    """A CSV bill for the billed rows (costboard/billing/uploads.py reads it)."""

    file = forms.FileField(help_text="A CSV file, UTF-8, at most 5 MB.")
    project = forms.ModelChoiceField(
        queryset=Project.objects.order_by("slug"),
        required=False,
        help_text="The project of the rows whose project column is empty (blank: none).",
    )
