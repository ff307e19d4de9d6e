"""Writes of period budgets: made, changed and deleted through the API (admin keys) and the
admin, each checked the same way (`budget_check`) before anything is stored.

A budget's fields come typed, as `BudgetFields` (pydantic: types, choices and ranges, checked
once where the input arrives: the API's body, the admin's form, a Python caller's mapping);
`budget_check` adds the rules no single field holds — a name and a limit required, the
scope's value for its scope (a key prefix the project has), a timezone that exists, a USD
limit's range and decimals, the warn fractions (`warn_at`, or the older one-fraction
`warn_at_pct`), a rolling budget's window, a per-member or rolling budget that stays one, and
channels the project has set up (a Slack URL for slack, a routing key for pagerduty)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from itertools import pairwise
from typing import Annotated, Any, Literal

from django.db import transaction
from django.utils import timezone
from pydantic import BaseModel, ConfigDict, Field, StrictInt, WithJsonSchema, field_validator

from costboard.budgets.alerts import announce, incidents_resolve
from costboard.budgets.period_ledgers import period_budget_recheck
from costboard.budgets.periods import EVERY, per_member, rolling, zone
from costboard.input_limits import amount_fault
from costboard.models import ApiKey, PeriodBudget, Project, Step
from costboard.models.projects import ALERT_CHANNELS, channel_setup_fault
from costboard.sql_arrays import Dialect
from costboard.tag_values import TAG_KEY

FIELDS = (
    "name",
    "scope",
    "scope_value",
    "period",
    "window_hours",
    "timezone",
    "token_limit",
    "cost_limit_usd",
    "warn_at",
    "action",
    "channels",
)
MAX_THRESHOLDS = 10
MAX_WINDOW_HOURS = 720
_WARN_AT_EXAMPLE = "e.g. [0.5, 0.8, 0.95]"
MAX_TOKEN_LIMIT = 10**15
MAX_COST_LIMIT = Decimal("9999999999.9999")

_MONEY_SCHEMA = {
    "anyOf": [
        {"type": "number", "minimum": 0.0001, "maximum": 9999999999.9999},
        {"type": "string", "pattern": r"^\s*\+?[0-9]{1,10}(\.[0-9]{0,4})?\s*$"},
    ],
    "description": 'USD: a decimal string such as "50.00", or a JSON number; at most 4 decimals',
}


class BudgetFields(BaseModel):
    """A budget's fields as sent: all of them to make one (name and a limit at least), any
    of them to change one. What the types let through is checked by budget_check."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=100)] | None = None
    scope: Literal["project", "user", "api_key", "tag"] | None = Field(
        default=None, description="project (the default), user, api_key or tag"
    )
    scope_value: Annotated[str, Field(max_length=200)] | None = Field(
        default=None,
        description='the user_id, the key prefix ("cb_AbCdEfG") or the tag ("feature=search"); '
        "absent for the project",
    )
    period: Literal["day", "week", "month", "total", "rolling"] | None = Field(
        default=None,
        description="month (the default), day, week (from Monday), total, or rolling: the "
        "last window_hours hours",
    )
    window_hours: Annotated[StrictInt, Field(ge=1, le=MAX_WINDOW_HOURS)] | None = Field(
        default=None, description="a rolling budget's window: 1 to 720 hours (rolling only)"
    )
    timezone: Annotated[str, Field(max_length=64)] | None = Field(
        default=None, description='an IANA name where periods begin: "UTC" (the default)'
    )
    token_limit: Annotated[StrictInt, Field(ge=1, le=MAX_TOKEN_LIMIT)] | None = Field(
        default=None, description="input + output tokens in a period"
    )
    cost_limit_usd: Annotated[Decimal, WithJsonSchema(_MONEY_SCHEMA)] | None = None
    warn_at: Annotated[list[Decimal], Field(max_length=MAX_THRESHOLDS)] | None = Field(
        default=None,
        description="the fractions of a limit that warn, ascending, each 0.01 to 1: [0.8] "
        "(the default); each crossing is a `threshold` event, the first also `soft_warned`",
    )
    warn_at_pct: Annotated[Decimal, Field(ge=Decimal("0.01"), le=1)] | None = Field(
        default=None, description="the older one-fraction form of warn_at: 0.8 is [0.8]"
    )
    action: Literal["warn", "stop"] | None = Field(
        default=None, description="warn (the default) or stop: its sessions report exhausted"
    )
    channels: (
        Annotated[list[Literal["webhook", "email", "slack", "pagerduty"]], Field(max_length=4)]
        | None
    ) = Field(
        default=None,
        description="where its alerts go: any of webhook, email, slack, pagerduty; null or "
        "[] (the default): the project's default channels",
    )

    @field_validator("cost_limit_usd", "warn_at_pct", mode="before")
    @classmethod
    def _ascii_amount(cls, value: Any) -> Any:
        """An amount given as text in the digits 0-9 (Decimal() reads "５０" as 50)."""
        fault = amount_fault(value, example='"50.00"') if isinstance(value, str) else None
        if fault is not None:
            raise ValueError(fault)
        return value

    @field_validator("warn_at", mode="before")
    @classmethod
    def _ascii_fractions(cls, value: Any) -> Any:
        """Each warn fraction given as text in the digits 0-9, as the amounts."""
        for fraction in value if isinstance(value, list) else ():
            fault = amount_fault(fraction, example='"0.8"') if isinstance(fraction, str) else None
            if fault is not None:
                raise ValueError(fault)
        return value

    @classmethod
    def example(cls) -> str:
        return '{"name": "monthly", "period": "month", "cost_limit_usd": "50.00", "action": "stop"}'

    def given(self) -> dict[str, Any]:
        """The fields the input named (null included: a limit removed)."""
        return {name: getattr(self, name) for name in self.model_fields_set}


class BudgetInputError(ValueError):
    """A budget field that cannot be stored: which, and how to fix it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _typed(fields: BudgetFields | Mapping[str, Any]) -> BudgetFields:
    """Fields as BudgetFields: a mapping (a Python caller's: the demo, the benchmarks) is
    validated here, as the API validates its body (pydantic's ValidationError if it fails)."""
    return fields if isinstance(fields, BudgetFields) else BudgetFields.model_validate(fields)


def _chosen(fields: BudgetFields, field: str, default: str, choices: list[str]) -> str:
    """A choice, its default where the input does not name it; named as null, refused."""
    value = getattr(fields, field)
    if value is None and field in fields.model_fields_set:
        raise BudgetInputError(field, f"must be one of {', '.join(choices)}")
    return default if value is None else str(value)


def _scope_value(project: Project, scope: str, value: str | None) -> str:
    text = ("" if value is None else value).strip()
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
        if not equals or not TAG_KEY.fullmatch(key) or not tag or len(tag) > 128:
            raise BudgetInputError(
                "scope_value",
                'must be a tag as key=value, e.g. "feature=search", or key=* for each value '
                'on its own, e.g. "customer=*" (key: 1 to 64 of a-z 0-9 _ . -; value: 1 to '
                "128 characters)",
            )
    return text


def _cost_limit(amount: Decimal | None) -> Decimal | None:
    if amount is None:
        return None
    if (
        not amount.is_finite()
        or not Decimal("0.0001") <= amount <= MAX_COST_LIMIT
        or amount.as_tuple().exponent < -4  # type: ignore[operator]
    ):
        raise BudgetInputError(
            "cost_limit_usd", 'must be a USD amount from 0.0001, at most 4 decimals, e.g. "50.00"'
        )
    return amount


def _warn_at(fields: BudgetFields) -> list[str]:
    """The warn fractions as stored (decimal strings, ascending): `warn_at`, else
    `warn_at_pct` as a list of one, else [0.8]."""
    named = fields.model_fields_set
    if fields.warn_at_pct is None and "warn_at_pct" in named:
        raise BudgetInputError("warn_at_pct", "must be a fraction from 0.01 to 1, e.g. 0.8")
    if fields.warn_at_pct is not None:
        if fields.warn_at is not None and "warn_at" in named:
            raise BudgetInputError(
                "warn_at",
                "give warn_at or the older warn_at_pct, not both: warn_at, " + _WARN_AT_EXAMPLE,
            )
        fractions: list[Any] = [fields.warn_at_pct]
    elif fields.warn_at is None:
        if "warn_at" in named:
            raise BudgetInputError(
                "warn_at", f"must be a list of fractions from 0.01 to 1, {_WARN_AT_EXAMPLE}"
            )
        fractions = [Decimal("0.8")]
    else:
        fractions = list(fields.warn_at)
    if not 1 <= len(fractions) <= MAX_THRESHOLDS:
        raise BudgetInputError(
            "warn_at", f"give 1 to {MAX_THRESHOLDS} fractions from 0.01 to 1, {_WARN_AT_EXAMPLE}"
        )
    # a fault in the one fraction of warn_at_pct is named as sent: warn_at_pct, e.g. 0.8
    field, example = (
        ("warn_at_pct", "e.g. 0.8")
        if fields.warn_at_pct is not None
        else ("warn_at", _WARN_AT_EXAMPLE)
    )
    cleaned: list[Decimal] = []
    for fraction in fractions:
        value = Decimal(str(fraction))
        if (
            not value.is_finite()
            or not Decimal("0.01") <= value <= 1
            or value.as_tuple().exponent < -3  # type: ignore[operator]
        ):
            raise BudgetInputError(
                field,
                f"{str(fraction)[:20]} is not a fraction from 0.01 to 1 with at most 3 decimals: "
                f"0.8 warns at 80 %, {example}",
            )
        cleaned.append(value)
    if any(later <= earlier for earlier, later in pairwise(cleaned)):
        raise BudgetInputError(
            "warn_at", f"list each fraction once, smallest first, {_WARN_AT_EXAMPLE}"
        )
    return [format(value.normalize(), "f") for value in cleaned]


def _window(fields: BudgetFields, period: str) -> int | None:
    hours = fields.window_hours
    if period == PeriodBudget.Period.ROLLING:
        if hours is None:
            raise BudgetInputError(
                "window_hours",
                f'is required for period "rolling": 1 to {MAX_WINDOW_HOURS} hours, e.g. 24',
            )
        return hours
    if hours is not None:
        raise BudgetInputError(
            "window_hours",
            'is for period "rolling" only: remove it, or set period to "rolling"',
        )
    return None


def _channels(
    project: Project, fields: BudgetFields, stored: PeriodBudget | None
) -> list[str] | None:
    """The budget's own channels, each once in ALERT_CHANNELS' order; None (the project's
    defaults) for none. Slack and PagerDuty chosen need the project's URL and routing key
    (channels kept as stored are not refused for a setup removed since: the send skips)."""
    chosen = fields.channels
    if not chosen:
        return None
    if len(set(chosen)) != len(chosen):
        raise BudgetInputError("channels", "names a channel twice: list each once")
    kept = stored is not None and stored.pk is not None and stored.channels == list(chosen)
    found = None if kept else channel_setup_fault(project, chosen)
    if found is not None:
        raise BudgetInputError("channels", found[1])
    return [channel for channel in ALERT_CHANNELS if channel in chosen]


def budget_check(
    project: Project, fields: BudgetFields, *, stored: PeriodBudget | None = None
) -> dict[str, Any]:
    """Every field of a budget (all of them: a new one's, or a stored one's with the changes
    over them), typed by BudgetFields, checked for the rules no single field holds and
    cleaned; BudgetInputError at the first that cannot be stored. `stored`: the budget as it
    is, when these are changes to it."""
    name = fields.name
    if name is None or not name.strip():
        raise BudgetInputError("name", 'is required: 1 to 100 characters, e.g. "monthly"')
    scope = _chosen(fields, "scope", PeriodBudget.Scope.PROJECT, PeriodBudget.Scope.values)
    period = _chosen(fields, "period", PeriodBudget.Period.MONTH, PeriodBudget.Period.values)
    tz_name = fields.timezone or "UTC"
    try:
        zone(tz_name)
    except ValueError as exc:
        raise BudgetInputError("timezone", str(exc)) from None
    token_limit = fields.token_limit
    cost_limit = _cost_limit(fields.cost_limit_usd)
    if token_limit is None and cost_limit is None:
        raise BudgetInputError(
            "token_limit", "give a token_limit, a cost_limit_usd or both: a budget needs a limit"
        )
    scope_value = _scope_value(project, scope, fields.scope_value)
    window_hours = _window(fields, period)
    if stored is not None and stored.pk is not None:
        changed = PeriodBudget(scope=scope, scope_value=scope_value, period=period)
        if per_member(changed) != per_member(stored):
            # its ledgers are kept per member or not: they cannot be carried across
            raise BudgetInputError(
                "scope_value",
                'cannot change between "*" (each member on its own) and one value: make a '
                "new budget and delete this one",
            )
        kept = (("scope", scope, stored.scope), ("scope_value", scope_value, stored.scope_value))
        for field, value, was in kept:
            if value != was:
                # its ledgers hold the spend of its scope: under another, one who spent
                # nothing would read (and be stopped by) what the old scope spent
                raise BudgetInputError(
                    field,
                    f"cannot change from {was[:64]!r} to {value[:64]!r}: the spend counted so "
                    "far is its scope's; make a new budget with it and delete this one",
                )
        if rolling(changed) != rolling(stored):
            # a rolling budget's ledger holds its window, a calendar one's its periods
            raise BudgetInputError(
                "period",
                'cannot change between "rolling" and a calendar period: make a new budget '
                "and delete this one",
            )
        if not rolling(stored):
            # a calendar budget's ledgers sum its periods as they fell in its timezone: under
            # another period or timezone its spend so far would read 0 and its stop lift
            for field, value, was in (("period", period, stored.period),
                                     ("timezone", tz_name, stored.timezone or "UTC")):  # fmt: skip
                if value != was:
                    raise BudgetInputError(
                        field,
                        f"cannot change from {was!r} to {value!r}: the spend counted so far "
                        "is its periods' as they fell; make a new budget with it and delete "
                        "this one",
                    )
    return {
        "name": name.strip(),
        "scope": scope,
        "scope_value": scope_value,
        "period": period,
        "window_hours": window_hours,
        "timezone": tz_name,
        "token_limit": token_limit,
        "cost_limit_usd": cost_limit,
        "warn_at": _warn_at(fields),
        "action": _chosen(fields, "action", PeriodBudget.Action.WARN, PeriodBudget.Action.values),
        "channels": _channels(project, fields, stored),
    }


def period_budget_create(
    *, project: Project, fields: BudgetFields | Mapping[str, Any], now: datetime | None = None
) -> PeriodBudget:
    """Make a budget of these fields (scope `project`, period `month`, action `warn` and
    warning at [0.8] where they are not given)."""
    cleaned = budget_check(project, _typed(fields))
    now = now or timezone.now()
    return PeriodBudget.objects.create(
        project=project,
        created_at=now,
        updated_at=now,
        counts_from_step=_next_step_id(),
        **cleaned,
    )


def _next_step_id() -> int:
    """An id no step stored so far has, and below every step stored from now on (on
    PostgreSQL one taken from the steps' sequence: a batch in flight has its ids already)."""
    sql = Dialect()
    with sql.cursor() as cursor:
        return sql.ids_reserve(cursor, Step._meta.db_table, 1)[0]


@transaction.atomic
def period_budget_update(
    budget: PeriodBudget,
    *,
    changes: BudgetFields | Mapping[str, Any],
    now: datetime | None = None,
) -> PeriodBudget:
    """Change the fields `changes` names; the rest stay. The budget's row is locked while it
    changes, and its current period is decided again under the new limits
    (period_budget_recheck)."""
    given = _typed(changes).given()
    locked = PeriodBudget.objects.select_for_update().get(pk=budget.pk)
    # the stored fields were checked when stored: trusted, with the changes over them
    current = {name: getattr(locked, name) for name in FIELDS}
    if "warn_at_pct" in given and "warn_at" not in given:
        del current["warn_at"]  # the older one-fraction form replaces the stored list
    fields = BudgetFields.model_construct(**{**current, **given})
    cleaned = budget_check(locked.project, fields, stored=locked)
    for name, value in cleaned.items():
        setattr(locked, name, value)
    locked.updated_at = now or timezone.now()
    locked.save()
    # its current period under the new limits, in this transaction; crossings to the outbox
    announce(period_budget_recheck(locked, now=locked.updated_at))
    # a limit raised past the spend: its PagerDuty incidents resolved
    incidents_resolve(now=locked.updated_at, budget_id=locked.pk)
    return locked


def period_budget_delete(budget: PeriodBudget) -> None:
    """Delete it with its ledgers."""
    PeriodBudget.objects.filter(pk=budget.pk).delete()
