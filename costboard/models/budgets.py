"""Budgets and their crossings: the environment's default session caps as last decided,
period budgets with a ledger per period (and per member) and a tally per day, and the budget
events recorded when a session or a ledger crosses a threshold."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from costboard.models.fields import money_field, usd
from costboard.models.projects import Project
from costboard.models.usage import Session


class EnvironmentCaps(models.Model):
    """The environment's default caps (COSTBOARD_SESSION_TOKEN_CAP, …) as the sessions were
    last decided with: one row. The sweep compares it with the settings, so a restart with new
    defaults decides again the sessions that inherit them."""

    token_cap = models.PositiveBigIntegerField()
    cost_cap_usd = models.DecimalField(max_digits=14, decimal_places=4)
    warn_at_pct = models.DecimalField(max_digits=4, decimal_places=3)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "environment caps"

    def __str__(self) -> str:
        return f"{self.token_cap} tokens, ${self.cost_cap_usd}, warn at {self.warn_at_pct}"


class BudgetEvent(models.Model):
    class Kind(models.TextChoices):
        SOFT_WARNED = "soft_warned"
        EXHAUSTED = "exhausted"
        RUNAWAY = "runaway"
        CAP_CHANGED = "cap_changed"
        # a period budget projected, at its recent daily rate, to pass its limit this period
        FORECAST = "forecast"
        # a period budget past one of its warn fractions (`threshold` names which)
        THRESHOLD = "threshold"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    # a session's crossing, or a period budget's (its ledger: the budget and the period)
    session = models.ForeignKey(
        Session,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="budget_events",
        db_constraint=False,
    )
    ledger = models.ForeignKey(
        "PeriodLedger",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="events",
        db_constraint=False,
    )
    kind = models.CharField(max_length=20, choices=Kind.choices)
    at = models.DateTimeField()
    tokens_used = models.BigIntegerField()
    cost_usd = money_field()
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # a `threshold` event's warn fraction, and a period budget's `soft_warned`'s (its first
    # fraction then): one event per fraction; 0 for the other kinds
    threshold = models.DecimalField(max_digits=4, decimal_places=3, default=0, db_default=0)
    # a rolling budget's episode (PeriodLedger.episode) it happened in; 0 for the others
    episode = models.PositiveIntegerField(default=0, db_default=0)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["session", "at"], name="budgetevent_session")]
        constraints = [
            models.CheckConstraint(
                condition=Q(session__isnull=False, ledger__isnull=True)
                | Q(session__isnull=True, ledger__isnull=False),
                name="budgetevent_session_or_ledger",
            ),
            # a period budget's crossing is recorded once per period (and member), warn
            # fraction and rolling episode, whatever races
            models.UniqueConstraint(
                fields=["ledger", "kind", "threshold", "episode", "project"],
                condition=Q(ledger__isnull=False),
                name="budgetevent_once_per_period",
            ),
        ]

    def __str__(self) -> str:
        owner = f"session {self.session_id}" if self.session_id else f"ledger {self.ledger_id}"
        return f"{self.kind} {owner} {self.at:%Y-%m-%d %H:%M}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "at": self.at.isoformat(),
            "tokens_used": self.tokens_used,
            "cost_usd": usd(self.cost_usd),
            "detail": self.detail,
        }


def default_warn_at() -> list[str]:
    return ["0.8"]


class PeriodBudget(models.Model):
    """A budget above the session (docs/budgets.md, "Period budgets"): a project's, an end user's,
    an API key's or a tag's spend in each day, week or month (in a timezone), in total, or in a
    rolling window of the last N hours, held to a token and/or USD limit. Every step whose scope
    matches counts toward it, in the period its timestamp falls in (a PeriodLedger each); `stop`
    tells the agents of its sessions to stop when it is exhausted, `warn` only warns. A
    `scope_value` of "*" (a tag's "key=*") makes it a per-member budget: each user, key or tag
    value held to the limits on its own, with a ledger of its own (`PeriodLedger.member`)."""

    class Scope(models.TextChoices):
        PROJECT = "project", "the whole project"
        USER = "user", "an end user (the sessions' user_id)"
        API_KEY = "api_key", "an API key (by its prefix)"
        TAG = "tag", "a tag (key=value)"

    class Period(models.TextChoices):
        DAY = "day"
        WEEK = "week", "week (from Monday)"
        MONTH = "month"
        TOTAL = "total", "total (never resets)"
        ROLLING = "rolling", "rolling (the last window_hours hours)"

    class Action(models.TextChoices):
        WARN = "warn", "warn: alert, never stop"
        STOP = "stop", "stop: the sessions it covers report exhausted"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="budgets")
    name = models.CharField(max_length=100)
    scope = models.CharField(max_length=8, choices=Scope.choices, default=Scope.PROJECT)
    scope_value = models.CharField(
        max_length=200,
        blank=True,
        help_text="the user_id, the key prefix (cb_…) or the tag as key=value; empty for the "
        'project; "*" (a tag\'s "key=*"): each user, key or tag value on its own',
    )
    period = models.CharField(max_length=8, choices=Period.choices, default=Period.MONTH)
    window_hours = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(720)],
        help_text="a rolling budget's window: the last 1 to 720 hours",
    )
    # (before `timezone`, which names a field from there on in this class)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # the first step id it may have counted: steps get their ids as they arrive, so a step
    # with a smaller id arrived before it was made and never counted (a repricing reads
    # this: docs/budgets.md, "Repricing"); None: made before it was kept
    counts_from_step = models.BigIntegerField(null=True, blank=True, editable=False)
    updated_at = models.DateTimeField(default=timezone.now, editable=False)
    timezone = models.CharField(
        max_length=64, default="UTC", help_text="where days, weeks and months begin"
    )
    token_limit = models.BigIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="input + output"
    )
    cost_limit_usd = models.DecimalField(
        max_digits=14,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0.0001"))],
    )
    # the fractions of a limit that warn, ascending, as decimal strings (["0.5", "0.8"]): each
    # crossing a `threshold` event, the first also `soft_warned`
    warn_at = models.JSONField(
        default=default_warn_at, help_text="the fractions of a limit that warn, e.g. 0.5, 0.8"
    )
    action = models.CharField(max_length=4, choices=Action.choices, default=Action.WARN)
    # where its alerts go (docs/budgets.md, "Alerts"): any of costboard.models.projects.
    # ALERT_CHANNELS; null: the project's default channels
    channels = models.JSONField(
        null=True,
        blank=True,
        default=None,
        help_text='any of "webhook", "email", "slack", "pagerduty"; none: the project\'s '
        "default channels",
    )

    class Meta:
        ordering = ["project", "name", "id"]
        indexes = [models.Index(fields=["project", "scope"], name="periodbudget_scope")]
        constraints = [
            models.CheckConstraint(
                condition=Q(token_limit__isnull=False) | Q(cost_limit_usd__isnull=False),
                name="periodbudget_has_a_limit",
            ),
            models.CheckConstraint(
                condition=Q(period="rolling", window_hours__isnull=False)
                | (~Q(period="rolling") & Q(window_hours__isnull=True)),
                name="periodbudget_window_if_rolling",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.project.slug})"

    @property
    def thresholds(self) -> tuple[Decimal, ...]:
        """The warn fractions, ascending (`warn_at` as Decimals)."""
        return tuple(Decimal(str(fraction)) for fraction in self.warn_at or ["0.8"])

    @property
    def warn_at_pct(self) -> Decimal:
        """The first warn fraction: the one `soft_warned` and the state `warning` mean."""
        return self.thresholds[0]


class PeriodLedger(models.Model):
    """A period budget in one period: what counted toward it, its state and its crossings
    (written only by the budget engine's outcomes, under this row's lock)."""

    # the budget's project, copied: the distribution column (docs/operations.md, "Scaling out")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    # no lone index: its unique key leads with it
    budget = models.ForeignKey(
        PeriodBudget,
        on_delete=models.CASCADE,
        related_name="ledgers",
        db_index=False,
        db_constraint=False,
    )
    period_start = models.DateTimeField()
    # a per-member budget's member (the user_id, key prefix or tag value); '' for the others
    member = models.CharField(max_length=128, blank=True, default="", db_default="")
    period_end = models.DateTimeField(null=True, blank=True)  # None: a total budget
    tokens_used = models.BigIntegerField(default=0)
    cost_usd = money_field()
    state = models.CharField(max_length=10, default="ok")
    warned_at = models.DateTimeField(null=True, blank=True)
    exhausted_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)
    # the highest warn fraction its totals reach (None: below every one)
    threshold_crossed = models.DecimalField(max_digits=4, decimal_places=3, null=True, blank=True)
    # a rolling budget's episode: one more each time its window falls back under the first
    # warn fraction after a crossing (its crossings may then be recorded again)
    episode = models.PositiveIntegerField(default=0, db_default=0)
    # a rolling ledger's window start (an hour) its totals count from (None: not rolling)
    window_start = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["budget", "period_start", "member", "project"], name="ledger_period"
            ),
        ]

    def __str__(self) -> str:
        member = f" {self.member}" if self.member else ""
        return f"{self.budget_id}{member} from {self.period_start:%Y-%m-%d}"


class BudgetDay(models.Model):
    """What counted toward a period budget on one day (in its timezone): the daily rate its
    forecast projects from. Kept by ingest with the ledgers, under their locks."""

    # the budget's project, copied: the distribution column (docs/operations.md, "Scaling out")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    # no lone index: its unique key leads with it
    budget = models.ForeignKey(
        PeriodBudget,
        on_delete=models.CASCADE,
        related_name="days",
        db_index=False,
        db_constraint=False,
    )
    day = models.DateField()
    # a per-member budget's member, as its ledgers': each member's forecast is its own
    member = models.CharField(max_length=128, blank=True, default="", db_default="")
    tokens_used = models.BigIntegerField(default=0)
    cost_usd = money_field()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["budget", "day", "member", "project"], name="budgetday_day"
            )
        ]

    def __str__(self) -> str:
        return f"{self.budget_id} {self.member} {self.day}".replace("  ", " ")


class BudgetHour(models.Model):
    """What counted toward a rolling budget in one hour (UTC; of one member, for a per-member
    budget): a rolling window's spend is the sum of its hours, never of its steps. Kept by
    ingest with the ledgers, under their locks; hours older than the window are pruned by the
    retention sweep."""

    # the budget's project, copied: the distribution column (docs/operations.md, "Scaling out")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    # no lone index: its unique key leads with it
    budget = models.ForeignKey(
        PeriodBudget,
        on_delete=models.CASCADE,
        related_name="hours",
        db_index=False,
        db_constraint=False,
    )
    member = models.CharField(max_length=128, blank=True, default="", db_default="")
    hour = models.DateTimeField()  # its start, on the hour, UTC
    tokens_used = models.BigIntegerField(default=0)
    cost_usd = money_field()

    class Meta:
        constraints = [
            # leads with (budget, member): a window's sum reads a member's hours in a range
            models.UniqueConstraint(
                fields=["budget", "member", "hour", "project"], name="budgethour_hour"
            )
        ]

    def __str__(self) -> str:
        return f"{self.budget_id} {self.member} {self.hour:%Y-%m-%d %H:00}".replace("  ", " ")
