"""The rate table in the admin: prices listed with their rates editable in place (and the
negotiated adjustment in force beside each), and the adjustments; every save or delete
through the pricing service, which reprices the steps the price or adjustment covers."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from costboard.admin.forms import DECIMAL_OVERRIDES, ModelPriceForm, PriceRatesForm
from costboard.models import ModelPrice, PriceAdjustment
from costboard.numbers import count_text
from costboard.pricing import services as pricing_services
from costboard.pricing.families import price_families
from costboard.pricing.rates import RateTable, rate_table
from costboard.pricing.services import RATE_FIELDS


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin[ModelPrice]):
    form = ModelPriceForm
    formfield_overrides = DECIMAL_OVERRIDES
    list_display = (
        "model",
        "provider",
        "service_tier",
        "effective",
        "daily_window",
        *RATE_FIELDS[:4],
        "negotiated",
        "window_tokens",
        "edited_by_admin",
    )  # the source is a filter beside the list
    list_editable = RATE_FIELDS[:4]
    list_filter = ("source", "service_tier", "edited_by_admin", "provider")
    search_fields = ("model", "external_id", "provider")
    readonly_fields = ("created_at", "updated_at")
    list_per_page = 50

    @admin.display(description="from", ordering="effective_from")
    def effective(self, obj: ModelPrice) -> str:
        moment = obj.effective_from
        return f"{moment:%Y-%m-%d}" if f"{moment:%H:%M}" == "00:00" else f"{moment:%Y-%m-%d %H:%M}"

    @admin.display(description="negotiated (now)")
    def negotiated(self, obj: ModelPrice) -> str:
        """The adjustment on this row's list price in force today for every project, and
        how many projects have their own (docs/pricing.md, "Negotiated rates")."""
        # the table the list read once for its page (get_changelist_instance), not per row
        table: RateTable | None = getattr(obj, "listed_rate_table", None)
        if table is None:
            table = rate_table()
        rate = table.by_id.get(obj.pk)
        if rate is None or not table.adjustments:
            return "—"
        family = price_families(table.rates, key=table).get(obj.pk, "")
        now = timezone.now()
        found = table.adjustment_at(-1, rate.provider, family, now)  # no project's own
        text = "—"
        if found is not None:
            text = f"{found.percent.normalize():+f} %"
        own = {
            a.project_id
            for a in table.adjustments
            if a.project_id is not None
            and a.provider == rate.provider
            and a.family in ("", family)
            and a.effective_from <= now
        }
        if own:
            text += f" ({len(own)} project{'s' if len(own) > 1 else ''} their own)"
        return text

    @admin.display(description="context window", ordering="context_window")
    def window_tokens(self, obj: ModelPrice) -> str:
        return count_text(obj.context_window) if obj.context_window else "—"

    @admin.display(description="window (UTC)", ordering="window_start")
    def daily_window(self, obj: ModelPrice) -> str:
        if obj.window_start is None or obj.window_end is None:
            return "all day"
        return f"{obj.window_start:%H:%M}–{obj.window_end:%H:%M}"

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The page's rows, each holding the rate table read once for the page: read per row
        (its version checked by a query each time), a page of 50 rows made 50 queries."""
        changelist = super().get_changelist_instance(request)
        table = rate_table()
        for price in changelist.result_list:  # the rows the page and its cells' forms show
            price.listed_rate_table = table
        return changelist

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        # the list's editable rates are checked as the price form checks them (Django
        # builds this form from a bare ModelForm, not from `form`)
        kwargs.setdefault("form", PriceRatesForm)
        return super().get_changelist_form(request, **kwargs)

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


class PriceAdjustmentForm(forms.ModelForm[PriceAdjustment]):
    class Meta:
        model = PriceAdjustment
        fields = ("provider", "family", "project", "percent", "effective_from", "note")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        percent, since = cleaned.get("percent"), cleaned.get("effective_from")
        if self.errors or percent is None or since is None:
            return cleaned  # the field's own error is shown
        candidate = PriceAdjustment(
            provider=cleaned.get("provider", ""),
            family=cleaned.get("family", ""),
            project=cleaned.get("project"),
            percent=percent,
            effective_from=since,
        )
        fault = pricing_services.adjustment_fault(candidate)  # the rule adjustment_save holds
        if fault is not None:
            self.add_error(fault.field, fault.message)
        return cleaned


@admin.register(PriceAdjustment)
class PriceAdjustmentAdmin(admin.ModelAdmin[PriceAdjustment]):
    """Negotiated rates: a percentage off (or on) list from a day, per provider, optionally
    per model family and project; the most specific in effect wins."""

    form = PriceAdjustmentForm
    formfield_overrides = DECIMAL_OVERRIDES  # the percent as written, in the digits 0-9
    list_display = ("provider", "family_shown", "project", "percent", "effective_from", "note")
    list_select_related = ("project",)  # a nullable key: Django's own select_related skips it
    list_filter = ("provider", "project")
    search_fields = ("provider", "family", "note")
    readonly_fields = ("created_at", "updated_at")

    @admin.display(description="family", ordering="family")
    def family_shown(self, obj: PriceAdjustment) -> str:
        return obj.family or "every model"

    def save_model(
        self, request: HttpRequest, obj: PriceAdjustment, form: Any, change: bool
    ) -> None:
        pricing_services.adjustment_save(adjustment=obj)
        messages.info(request, "Steps covered by this adjustment are being repriced.")

    def delete_model(self, request: HttpRequest, obj: PriceAdjustment) -> None:
        pricing_services.adjustments_delete(adjustments=[obj])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[PriceAdjustment]) -> None:
        pricing_services.adjustments_delete(adjustments=queryset)
