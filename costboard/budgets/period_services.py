"""Writes of period budgets: made, changed and deleted through the API (admin keys) and the
admin, each checked the same way (`budget_check`) before anything is stored."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import transaction
from django.utils import timezone

from costboard.budgets.alerts import announce
from costboard.budgets.period_ledgers import period_budget_recheck
from costboard.budgets.periods import EVERY, per_member, zone
from costboard.models import ApiKey, PeriodBudget, Project

FIELDS = (
    "name",
    "scope",
    "scope_value",
    "period",
    "timezone",
    "token_limit",
    "cost_limit_usd",
    "warn_at_pct",
    "action",
)
MAX_TOKEN_LIMIT = 10**15
MAX_COST_LIMIT = Decimal("9999999999.9999")
_TAG_KEY = re.compile(r"[a-z0-9_.-]{1,64}")


class BudgetInputError(ValueError):
    """A budget field that cannot be stored: which, and how to fix it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _choice(field: str, value: Any, choices: list[str]) -> str:
    if value not in choices:
        raise BudgetInputError(field, f"must be one of {', '.join(choices)}")
    return str(value)


def _scope_value(project: Project, scope: str, value: Any) -> str:
    text = "" if value is None else value
    if not isinstance(text, str):
        raise BudgetInputError("scope_value", "must be a string")
    text = text.strip()
    if scope == PeriodBudget.Scope.PROJECT:
        if text:
            raise BudgetInputError(
                "scope_value", 'must be absent for scope "project": the budget is the project\'s'
            )
        return ""
    if not text:
        examples = {
            "user": '"u-7" (a user_id), or "*" for each user on its own',
            "api_key": '"cb_AbCdEfG" (a key prefix), or "*" for each key on its own',
            "tag": '"feature=search" (a tag), or "customer=*" for each customer on its own',
        }
        raise BudgetInputError(
            "scope_value", f'is required for scope "{scope}": e.g. {examples[scope]}'
        )
    if scope == PeriodBudget.Scope.USER and len(text) > 128:
        raise BudgetInputError("scope_value", "a user_id is at most 128 characters")
    if (
        scope == PeriodBudget.Scope.API_KEY
        and text != EVERY
        and not ApiKey.objects.filter(project=project, prefix=text).exists()
    ):
        raise BudgetInputError(
            "scope_value",
            f"no key of project {project.slug} has the prefix {text[:20]!r}: use the first 10 "
            'characters of one of its keys (the admin\'s API keys page lists them), or "*" '
            "for each key on its own",
        )
    if scope == PeriodBudget.Scope.TAG:
        key, equals, tag = text.partition("=")
        if not equals or not _TAG_KEY.fullmatch(key) or not tag or len(tag) > 128:
            raise BudgetInputError(
                "scope_value",
                'must be a tag as key=value, e.g. "feature=search", or key=* for each value '
                'on its own, e.g. "customer=*" (key: 1 to 64 of a-z 0-9 _ . -; value: 1 to '
                "128 characters)",
            )
    return text


def _token_limit(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOKEN_LIMIT:
        raise BudgetInputError("token_limit", "must be a whole number of tokens from 1 to 10^15")
    return value


def _cost_limit(value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        amount = Decimal(str(value)) if not isinstance(value, bool) else Decimal(-1)
    except InvalidOperation:
        amount = Decimal(-1)
    if (
        not amount.is_finite()
        or not Decimal("0.0001") <= amount <= MAX_COST_LIMIT
        or amount.as_tuple().exponent < -4  # type: ignore[operator]
    ):
        raise BudgetInputError(
            "cost_limit_usd", 'must be a USD amount from 0.0001, at most 4 decimals, e.g. "50.00"'
        )
    return amount


def _warn_at(value: Any) -> Decimal:
    try:
        fraction = Decimal(str(value)) if not isinstance(value, bool) else Decimal(-1)
    except InvalidOperation:
        fraction = Decimal(-1)
    if not fraction.is_finite() or not Decimal("0.01") <= fraction <= 1:
        raise BudgetInputError("warn_at_pct", "must be a fraction from 0.01 to 1, e.g. 0.8")
    return fraction.quantize(Decimal("0.001"))


def budget_check(
    project: Project, fields: Mapping[str, Any], *, stored: PeriodBudget | None = None
) -> dict[str, Any]:
    """Every field of a budget (all of them: a new one's, or a stored one's with the changes
    over them), checked and cleaned; BudgetInputError at the first that cannot be stored.
    `stored`: the budget as it is, when these are changes to it."""
    name = fields.get("name")
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > 100:
        raise BudgetInputError("name", 'is required: 1 to 100 characters, e.g. "monthly"')
    scope = _choice("scope", fields.get("scope"), PeriodBudget.Scope.values)
    period = _choice("period", fields.get("period"), PeriodBudget.Period.values)
    tz_name = fields.get("timezone") or "UTC"
    if not isinstance(tz_name, str):
        raise BudgetInputError("timezone", "must be an IANA name such as UTC or Europe/Berlin")
    try:
        zone(tz_name)
    except ValueError as exc:
        raise BudgetInputError("timezone", str(exc)) from None
    token_limit = _token_limit(fields.get("token_limit"))
    cost_limit = _cost_limit(fields.get("cost_limit_usd"))
    if token_limit is None and cost_limit is None:
        raise BudgetInputError(
            "token_limit", "give a token_limit, a cost_limit_usd or both: a budget needs a limit"
        )
    scope_value = _scope_value(project, scope, fields.get("scope_value"))
    if stored is not None and stored.pk is not None:
        changed = PeriodBudget(scope=scope, scope_value=scope_value)
        if per_member(changed) != per_member(stored):
            # its ledgers are kept per member or not: they cannot be carried across
            raise BudgetInputError(
                "scope_value",
                'cannot change between "*" (each member on its own) and one value: make a '
                "new budget and delete this one",
            )
    return {
        "name": name.strip(),
        "scope": scope,
        "scope_value": scope_value,
        "period": period,
        "timezone": tz_name,
        "token_limit": token_limit,
        "cost_limit_usd": cost_limit,
        "warn_at_pct": _warn_at(fields.get("warn_at_pct", Decimal("0.8"))),
        "action": _choice("action", fields.get("action", "warn"), PeriodBudget.Action.values),
    }


def period_budget_create(
    *, project: Project, fields: Mapping[str, Any], now: datetime | None = None
) -> PeriodBudget:
    cleaned = budget_check(project, {"scope": "project", "period": "month", **fields})
    now = now or timezone.now()
    return PeriodBudget.objects.create(project=project, created_at=now, updated_at=now, **cleaned)


@transaction.atomic
def period_budget_update(
    budget: PeriodBudget, *, changes: Mapping[str, Any], now: datetime | None = None
) -> PeriodBudget:
    """Change some fields; the rest stay. The budget's row is locked while it changes, and
    its current period is decided again under the new limits (period_budget_recheck)."""
    unknown = set(changes) - set(FIELDS)
    if unknown:
        raise BudgetInputError(sorted(unknown)[0], "is not a field of a budget")
    locked = PeriodBudget.objects.select_for_update().get(pk=budget.pk)
    current = {name: getattr(locked, name) for name in FIELDS}
    cleaned = budget_check(locked.project, {**current, **changes}, stored=locked)
    for name, value in cleaned.items():
        setattr(locked, name, value)
    locked.updated_at = now or timezone.now()
    locked.save()
    # its current period under the new limits, in this transaction; crossings to the outbox
    announce(period_budget_recheck(locked, now=locked.updated_at))
    return locked


def period_budget_delete(budget: PeriodBudget) -> None:
    """Delete it with its ledgers."""
    PeriodBudget.objects.filter(pk=budget.pk).delete()
