"""Period budgets in the admin: saved through the same service as the API, their ledgers
shown read-only (written by the budget engine only)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from costboard.admin.forms import DECIMAL_OVERRIDES, PeriodBudgetForm
from costboard.budgets.period_services import period_budget_create, period_budget_update
from costboard.models import PeriodBudget, PeriodLedger
from costboard.numbers import count_text, usd_text


class PeriodLedgerInline(admin.TabularInline[PeriodLedger, PeriodBudget]):
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
class PeriodBudgetAdmin(admin.ModelAdmin[PeriodBudget]):
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
        fields = form.budget_fields  # typed and checked by the form (PeriodBudgetForm.clean)
        if change:
            saved = period_budget_update(obj, changes=fields)
        else:
            saved = period_budget_create(project=form.cleaned_data["project"], fields=fields)
        obj.pk = saved.pk
