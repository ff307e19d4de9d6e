"""Usage in the admin: sessions (only their caps editable, deleted through the service that
keeps each project's count of sessions), and turns, steps and daily rollups to read."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from costboard.admin.forms import DECIMAL_OVERRIDES, SessionCapsForm
from costboard.admin.site import ReadOnlyAdmin
from costboard.budgets import services as budget_services
from costboard.models import BudgetEvent, DailyRollup, Session, Step, Turn
from costboard.pricing.explain import price_explanation
from costboard.projects import sessions_delete


class BudgetEventInline(admin.TabularInline[BudgetEvent, Session]):
    model = BudgetEvent
    extra = 0
    fields = ("kind", "at", "tokens_used", "cost_usd", "detail")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin[Session]):
    form = SessionCapsForm
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
    actions = ["acknowledge"]

    @admin.action(description="Acknowledge selected sessions", permissions=["change"])
    def acknowledge(self, request: HttpRequest, queryset: QuerySet[Session]) -> None:
        """As the flagged page's Acknowledge: each leaves the flagged list, a runaway held at
        exhausted may go on, its PagerDuty incident is resolved."""
        ids = list(queryset.order_by("pk").values_list("pk", flat=True))
        for session_id in ids:
            budget_services.session_acknowledge(
                session_id=session_id, by=request.user.get_username(), at=timezone.now()
            )
        messages.success(request, f"Acknowledged {len(ids)} session(s).")

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


@admin.register(Turn)
class TurnAdmin(ReadOnlyAdmin[Turn]):
    list_display = ("session", "number", "step_count", "cost_usd", "started_at")
    list_select_related = ("session",)
    search_fields = ("session__external_id",)


@admin.register(Step)
class StepAdmin(ReadOnlyAdmin[Step]):
    list_display = (
        "timestamp",
        "step_type",
        "model",
        "family",
        "provider",
        "service_tier",
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
    readonly_fields = ("price_explanation",)

    @admin.display(description="price explanation")
    def price_explanation(self, obj: Step) -> str:
        return price_explanation(obj)


@admin.register(DailyRollup)
class DailyRollupAdmin(ReadOnlyAdmin[DailyRollup]):
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
