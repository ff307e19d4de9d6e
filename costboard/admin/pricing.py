"""The rate table in the admin: prices listed with their rates editable in place, and every
save or delete through the pricing service, which reprices the steps the price covers."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from costboard.admin.forms import DECIMAL_OVERRIDES, RATE_FIELDS, ModelPriceForm
from costboard.models import ModelPrice
from costboard.numbers import count_text
from costboard.pricing import services as pricing_services


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin[ModelPrice]):
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
