"""Costboard's data: who reports (Project, ApiKey), what a token costs (ModelPrice), and the
three levels of usage (Session → Turn → Step) with their rollups (DailyRollup) and the budget
crossings recorded on the way (BudgetEvent).

Money is numeric(…, 12) in USD: exact for every rate with up to six decimals per million
tokens (PostgreSQL numeric; SQLite keeps 15 significant digits, enough for the demo).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Collection
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from costboard.egress import webhook_url_check


def money_field(**options: Any) -> models.DecimalField:
    """USD: a step's cost is tokens × rate / 1e6, exact at 12 places for rates with ≤ 6
    decimals per million tokens."""
    return models.DecimalField(
        max_digits=24, decimal_places=12, default=Decimal(0), db_default=Decimal(0), **options
    )


def rate_field(**options: Any) -> models.DecimalField:
    """USD per million tokens; genai-prices has a few rates with 18 decimals, rounded to 10."""
    return models.DecimalField(max_digits=20, decimal_places=10, **options)


def cap_field(**options: Any) -> models.DecimalField:
    """A cap in USD; blank means "inherit"."""
    return models.DecimalField(max_digits=14, decimal_places=4, null=True, blank=True, **options)


# A built-in price without a start date applies since this instant ("always").
PRICE_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)

SYSTEM_SESSION_ID = "system"

# The model of a step sent without one (a tool call, a retrieval): never priced, $0 by nature;
# also its family (costboard/pricing/families.py).
TOOL_MODEL = "none"
# The step type of a tool call, whichever way it arrives (OTLP's `execute_tool` is stored as
# this: costboard/ingest/otlp.py).
TOOL_STEP_TYPE = "tool"

# A turn whose prompt fills this much of its model's context window should be summarized.
CONTEXT_PRESSURE_AT = Decimal("0.8")


def usd(amount: Decimal | None) -> str | None:
    """A USD amount as a JSON string: every significant digit, at least cents."""
    if amount is None:
        return None
    text = format(amount.normalize(), "f")
    whole, _, fraction = text.partition(".")
    return f"{whole}.{fraction.ljust(2, '0')}"


class Project(models.Model):
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    token_cap = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Per-session token cap; blank: the environment default."
    )
    cost_cap_usd = cap_field(help_text="Per-session USD cap; blank: the environment default.")
    warn_at_pct = models.DecimalField(
        max_digits=4,
        decimal_places=3,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0.001")), MaxValueValidator(Decimal(1))],
        help_text="Soft warning as a fraction of the cap (0.8 = 80%); blank: the default.",
    )
    # The `system` session (steps sent without a session_id) has caps of its own.
    system_token_cap = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Token cap of the `system` session; blank: as above."
    )
    system_cost_cap_usd = cap_field(help_text="USD cap of the `system` session; blank: as above.")
    # Runaway rules (0 turns a rule off). The per-turn ones run inside ingest, the window
    # ones in the sweep every minute.
    runaway_failed_steps = models.PositiveIntegerField(
        default=5, help_text="Retry loop: this many consecutive failed steps in one turn."
    )
    runaway_repeated_steps = models.PositiveIntegerField(
        default=8,
        help_text="Retry loop: the same step (type, model, prompt size) this many times in a "
        "row in one turn.",
    )
    runaway_turn_steps = models.PositiveIntegerField(
        default=50, help_text="A turn with more than this many steps (a correction cycle)."
    )
    runaway_burn_window_minutes = models.PositiveIntegerField(
        default=10, help_text="Burn rate and projected overrun: the sliding window, in minutes."
    )
    runaway_burn_factor = models.DecimalField(
        max_digits=8,
        decimal_places=2,
        default=Decimal(10),
        validators=[MinValueValidator(Decimal(0))],
        help_text="Burn rate: tokens per minute over the window above this many times the "
        "project's normal rate.",
    )
    runaway_burn_floor = models.PositiveIntegerField(
        default=20_000,
        help_text="Burn rate: never flagged below this many tokens per minute.",
    )
    runaway_overrun_minutes = models.PositiveIntegerField(
        default=30,
        help_text="Projected overrun: at the window's rate the session reaches a cap within "
        "this many minutes.",
    )
    runaway_max_hours = models.PositiveIntegerField(
        default=8, help_text="A session still active this many hours after it started."
    )
    runaway_stops = models.BooleanField(
        default=True,
        help_text="A runaway session is told to stop: its state becomes exhausted (what "
        "clients stop on) until someone acknowledges it on the flagged page.",
    )
    retention_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Steps older than this are deleted (rollups stay), and ended sessions' "
        "budget events after it; blank: keep all.",
    )
    alert_emails = models.TextField(
        blank=True,
        help_text="Budget alerts (soft warned, exhausted, runaway) by email too: addresses, "
        "one per line or comma-separated.",
    )
    api_rate_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="API requests per second per key (beyond it: 429); 0 turns the limit off; "
        "blank: COSTBOARD_API_RATE_LIMIT.",
    )
    api_max_in_flight = models.PositiveIntegerField(
        "API requests in flight",
        null=True,
        blank=True,
        help_text="API requests per key being answered at once (beyond it: 429); 0 turns the "
        "limit off; blank: COSTBOARD_API_MAX_IN_FLIGHT.",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


def _key_hash(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


class ApiKey(models.Model):
    """An API key of a project. Only its SHA-256 is stored; the key itself is shown once.

    Its role says what it may do: `ingest` (the default) sends usage and reads what an agent
    reads (budgets, context, memory); `read` only reads (the spend export among them);
    `admin` does everything, budgets' edits too (docs/api.md, "Keys and roles")."""

    PREFIX = "cb_"

    class Role(models.TextChoices):
        INGEST = "ingest", "ingest: send usage, read what an agent reads"
        READ = "read", "read: reads only (spend export)"
        ADMIN = "admin", "admin: everything, budget edits too"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    role = models.CharField(
        max_length=8, choices=Role.choices, default=Role.INGEST, db_default=Role.INGEST
    )
    prefix = models.CharField(max_length=12, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.project.slug})"

    @classmethod
    def issue(
        cls, *, project: Project, name: str = "", role: str = Role.INGEST
    ) -> tuple[ApiKey, str]:
        raw_key = cls.PREFIX + secrets.token_urlsafe(32)
        key = cls.objects.create(
            project=project,
            name=name,
            role=role,
            prefix=raw_key[:10],
            key_hash=_key_hash(raw_key),
        )
        return key, raw_key

    @classmethod
    def hash_of(cls, raw_key: str) -> str:
        return _key_hash(raw_key)

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class ModelPrice(models.Model):
    """USD per million tokens for one model at one provider, from `effective_from` on.

    A step is priced by the row of its (provider, model) series with the latest
    `effective_from` at or before the step's time; of rows with the same `effective_from`, one
    whose daily UTC window (`window_start`–`window_end`) holds the step's time of day beats the
    all-day row, and one whose window does not hold it is ignored (see pricing/rates.py).
    """

    class Source(models.TextChoices):
        BUILTIN = "builtin", "built-in (genai-prices)"
        MANUAL = "manual", "manual"

    provider = models.CharField(max_length=64, blank=True, db_index=True)
    model = models.CharField(max_length=200, help_text="The model name steps report.")
    model_regex = models.CharField(
        max_length=2000,
        blank=True,
        help_text="Optional: other model names this price covers (Python regex, matched "
        "against the lower-cased name).",
    )
    input_mtok = rate_field(default=Decimal(0))
    output_mtok = rate_field(default=Decimal(0))
    cache_read_mtok = rate_field(
        null=True, blank=True, help_text="Blank: cache reads at the input rate."
    )
    cache_write_mtok = rate_field(
        null=True, blank=True, help_text="Blank: cache writes at the input rate."
    )
    cache_write_1h_mtok = rate_field(
        null=True,
        blank=True,
        help_text="1-hour cache writes (Anthropic); blank: the cache write rate.",
    )
    tiers = models.JSONField(
        default=list,
        blank=True,
        help_text='Long-context tiers: [{"start": 200000, "input_mtok": "6", …}]; above '
        "`start` input tokens (cache included) every token of the call is at the tier rate.",
    )
    context_window = models.PositiveIntegerField(null=True, blank=True)
    effective_from = models.DateTimeField(default=PRICE_EPOCH)
    window_start = models.TimeField(
        null=True,
        blank=True,
        help_text="Optional, with window end: a daily UTC window (peak hours, say) in which "
        "this price beats the all-day price of the same date. Both blank: all day.",
    )
    window_end = models.TimeField(
        null=True,
        blank=True,
        help_text="End of the daily window (UTC, not included); earlier than the start, the "
        "window wraps midnight (22:00–06:00).",
    )
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.MANUAL)
    edited_by_admin = models.BooleanField(
        default=False, help_text="sync_prices never overwrites a row an admin edited."
    )
    external_id = models.CharField(max_length=200, blank=True, help_text="genai-prices model id")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["provider", "model", "effective_from"]
        constraints = [
            # one all-day row per series and date, and one row per window start beside it
            models.UniqueConstraint(
                fields=["provider", "model", "effective_from"],
                condition=Q(window_start__isnull=True),
                name="modelprice_series_from",
            ),
            models.UniqueConstraint(
                fields=["provider", "model", "effective_from", "window_start"],
                condition=Q(window_start__isnull=False),
                name="modelprice_series_window",
            ),
            models.CheckConstraint(
                condition=(
                    Q(window_start__isnull=True, window_end__isnull=True)
                    | (
                        Q(window_start__isnull=False, window_end__isnull=False)
                        & ~Q(window_start=F("window_end"))
                    )
                ),
                name="modelprice_window_both_or_neither",
                violation_error_message="A daily window needs a start and an end that differ, "
                "or neither (all day).",
            ),
        ]

    def __str__(self) -> str:
        who = f"{self.provider}/" if self.provider else ""
        hours = ""
        if self.window_start is not None and self.window_end is not None:
            hours = f" {self.window_start:%H:%M}–{self.window_end:%H:%M} UTC"
        return f"{who}{self.model} from {self.effective_from:%Y-%m-%d}{hours}"


TOKEN_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
)
COST_FIELDS = (
    "cost_input_usd",
    "cost_output_usd",
    "cost_cache_read_usd",
    "cost_cache_write_usd",
    "cost_usd",
)


class UsageTotals(models.Model):
    """Token and cost totals shared by turns, sessions and daily rollups."""

    input_tokens = models.BigIntegerField(default=0, db_default=0)
    output_tokens = models.BigIntegerField(default=0, db_default=0)
    cache_read_input_tokens = models.BigIntegerField(default=0, db_default=0)
    cache_creation_input_tokens = models.BigIntegerField(default=0, db_default=0)
    reasoning_tokens = models.BigIntegerField(default=0, db_default=0)
    cost_input_usd = money_field()
    cost_output_usd = money_field()
    cost_cache_read_usd = money_field()
    cost_cache_write_usd = money_field()
    cost_usd = money_field()

    class Meta:
        abstract = True

    @property
    def tokens_used(self) -> int:
        return self.input_tokens + self.output_tokens


class Session(UsageTotals):
    class State(models.TextChoices):
        OK = "ok"
        WARNING = "warning"
        EXHAUSTED = "exhausted"

    # No lone project index: session_external_id and session_recent lead with it, and each
    # index is one more write for every session a batch touches.
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="sessions", db_index=False
    )
    external_id = models.CharField(max_length=128)
    user_id = models.CharField(max_length=128, blank=True, db_default="")
    # No database constraint on this or any foreign key between ingest's tables: each is
    # keyed by (id, project_id), as a table distributed by project must be
    # (docs/operations.md, "Scaling out"), and deletes go through Django's collector.
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="forks",
        db_constraint=False,
        db_index=False,  # session_parent: only the forks
    )
    token_cap = models.PositiveBigIntegerField(null=True, blank=True)
    cost_cap_usd = cap_field()
    turn_count = models.IntegerField(default=0, db_default=0)
    step_count = models.IntegerField(default=0, db_default=0)
    error_count = models.IntegerField(default=0, db_default=0)
    state = models.CharField(
        max_length=10, choices=State.choices, default=State.OK, db_default=State.OK
    )
    warned_at = models.DateTimeField(null=True, blank=True)
    exhausted_at = models.DateTimeField(null=True, blank=True)
    runaway_at = models.DateTimeField(null=True, blank=True)
    runaway_reason = models.CharField(max_length=200, blank=True, db_default="")
    started_at = models.DateTimeField(default=timezone.now)
    last_active_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    # A person saw its flags up to this time (the flagged page); a later flag shows it again.
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True, db_default="")
    metadata = models.JSONField(default=dict, blank=True)
    # attribution (docs/api.md, "Tags"): merged key by key from session events; steps carry them
    tags = models.JSONField(default=dict, blank=True, db_default={})
    # The model families of its steps, as the keys of an object ({"gpt-4o": true}): the
    # families of its SessionModelUsage rows, kept beside them. The sessions list's model
    # filter tests it on the rows its period reads (a semi-join of the model mix read ten
    # times as much with ten times the history). Written only when a family is new to it.
    families = models.JSONField(default=dict, blank=True, db_default={})

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "external_id"], name="session_external_id")
        ]
        indexes = [
            # sessions list and overview: a project's latest sessions. With the user and the
            # id beside each entry, the list's user prefix and id search over a period read
            # only the index (a month of a long history lies scattered over the table: a
            # page read per session). Ingest writes an entry each time it updates a session
            # anyway (its last_active_at moves): they make the entry longer, not one more.
            models.Index(
                fields=["project", "-last_active_at"],
                include=["user_id", "external_id"],
                name="session_recent",
            ),
            # a session's forks. Partial: ingest rewrites every touched session each batch, and
            # an index of every session (nearly all without a parent) took an entry each time.
            models.Index(
                fields=["parent"], name="session_parent", condition=Q(parent__isnull=False)
            ),
            # flagged panel: sessions not ok
            models.Index(
                fields=["project", "state"], name="session_flagged", condition=~Q(state="ok")
            ),
            # the sessions list sorted by cost, either way: its first page without sorting a
            # whole history (each session a batch updates takes an entry here: its cost moved)
            models.Index(fields=["project", "cost_usd", "id"], name="session_cost"),
            # overview's flagged panel and the list's state=flagged: near-cap, exhausted or runaway
            models.Index(
                fields=["project", "-last_active_at"],
                include=["ended_at"],
                name="session_flagged_recent",
                condition=Q(state__in=["warning", "exhausted"]) | Q(runaway_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.external_id

    @property
    def runaway(self) -> bool:
        return self.runaway_at is not None

    @property
    def flagged_at(self) -> datetime | None:
        """When the most serious of its flags was raised."""
        return self.runaway_at or self.exhausted_at or self.warned_at

    @property
    def latest_flag_at(self) -> datetime | None:
        times = [t for t in (self.runaway_at, self.exhausted_at, self.warned_at) if t]
        return max(times) if times else None

    @property
    def acknowledged(self) -> bool:
        """Acknowledged, and nothing flagged since."""
        latest = self.latest_flag_at
        return self.acknowledged_at is not None and (
            latest is None or latest <= self.acknowledged_at
        )

    @property
    def is_system(self) -> bool:
        return self.external_id == SYSTEM_SESSION_ID


class Turn(UsageTotals):
    # The session's project, copied: the steps page reads a period's turns of some projects
    # (its cost-per-turn distribution) from one covering index, without joining sessions.
    # No lone indexes: turn_project_time leads with project, turn_session_number with session.
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    session = models.ForeignKey(
        Session, on_delete=models.CASCADE, related_name="turns", db_index=False, db_constraint=False
    )
    number = models.PositiveIntegerField()
    user_message = models.TextField(blank=True, db_default="")
    assistant_response = models.TextField(blank=True, db_default="")
    context = models.JSONField(null=True, blank=True)
    step_count = models.IntegerField(default=0, db_default=0)
    error_count = models.IntegerField(default=0, db_default=0)
    # Context pressure: the largest prompt of the turn (input + cache reads + cache writes)
    # and the context window of that step's model (from the rate table), if known.
    context_tokens = models.BigIntegerField(default=0, db_default=0)
    context_window = models.PositiveIntegerField(null=True, blank=True)
    # Retry-loop evidence, kept at ingest: the failed steps in a row at the turn's end and
    # the longest such run; the same for identical steps (`repeat_sig` is the last step's).
    fail_streak = models.IntegerField(default=0, db_default=0)
    fail_peak = models.IntegerField(default=0, db_default=0)
    repeat_sig = models.BigIntegerField(null=True, blank=True)
    repeat_streak = models.IntegerField(default=0, db_default=0)
    repeat_peak = models.IntegerField(default=0, db_default=0)
    started_at = models.DateTimeField(default=timezone.now)
    last_active_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["session", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["session", "number", "project"], name="turn_session_number"
            )
        ]
        indexes = [
            # steps page: the cost-per-turn distribution of some projects over a period
            models.Index(
                fields=["project", "started_at"], include=["cost_usd"], name="turn_project_time"
            )
        ]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.number}"

    @property
    def context_pressure(self) -> Decimal | None:
        """The turn's largest prompt as a fraction of its model's context window."""
        if not self.context_window:
            return None
        return Decimal(self.context_tokens) / Decimal(self.context_window)

    @property
    def should_summarize(self) -> bool:
        pressure = self.context_pressure
        return pressure is not None and pressure >= CONTEXT_PRESSURE_AT


class Step(models.Model):
    """One LLM call (or tool call) as reported, with its price. Never updated except repricing."""

    # Steps are the one table written per event, so its foreign keys carry no database
    # constraint: each would run a per-row check at commit, a quarter of ingest's database
    # time. Ingest writes ids it has just upserted and locked in the same transaction, and
    # deletes cascade through Django. Lone project and session indexes are left out: the
    # composite indexes below lead with those columns.
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="+", db_constraint=False, db_index=False
    )
    session = models.ForeignKey(
        Session,
        on_delete=models.CASCADE,
        related_name="steps",
        db_constraint=False,
        db_index=False,
    )
    turn = models.ForeignKey(
        Turn,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="steps",
        db_constraint=False,
    )
    event_id = models.CharField(max_length=128, null=True, blank=True)
    timestamp = models.DateTimeField()
    step_type = models.CharField(max_length=64)
    # As sent; `family` is what pages group it under (its price row's model, else its own
    # name, without provider prefix or date suffix: costboard/pricing/families.py). Kept on
    # the step so a repricing that changes it knows which rollups hold the step.
    model = models.CharField(max_length=200)
    family = models.CharField(max_length=200, default="", db_default="")
    provider = models.CharField(max_length=64, blank=True, db_default="")
    input_tokens = models.BigIntegerField(default=0, db_default=0)
    output_tokens = models.BigIntegerField(default=0, db_default=0)
    cache_read_input_tokens = models.BigIntegerField(default=0, db_default=0)
    cache_creation_input_tokens = models.BigIntegerField(default=0, db_default=0)
    # Of cache_creation_input_tokens, those written to Anthropic's 1-hour cache (dearer).
    cache_creation_1h_input_tokens = models.BigIntegerField(default=0, db_default=0)
    reasoning_tokens = models.BigIntegerField(default=0, db_default=0)
    duration_ms = models.IntegerField(null=True, blank=True)
    success = models.BooleanField(default=True, db_default=True)
    error = models.TextField(blank=True, db_default="")
    metadata = models.JSONField(null=True, blank=True)
    # its session's tags when it arrived, its own merged over them; None: no tags
    tags = models.JSONField(null=True, blank=True)
    # The price row used. Deleting a price leaves this pointing at it until the repricing
    # that follows clears it (it needs to know which steps were priced), hence no constraint;
    # nothing looks steps up by price, hence no index.
    price = models.ForeignKey(
        ModelPrice,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    cost_input_usd = money_field()
    cost_output_usd = money_field()
    cost_cache_read_usd = money_field()
    cost_cache_write_usd = money_field()
    cost_usd = money_field()

    class Meta:
        constraints = [
            # a replayed event_id is a duplicate within its project: StepReceipt holds that
            # in every month. On PostgreSQL the table is partitioned by month (migration
            # 0022) and this index is each partition's own (costboard/partitions.py).
            models.UniqueConstraint(
                fields=["project", "event_id"],
                name="step_event_id",
                condition=Q(event_id__isnull=False),
            )
        ]
        indexes = [
            # session page: a session's steps in time order
            models.Index(fields=["session", "timestamp"], name="step_session_time"),
            # repricing and retention: a project's steps of one model over time
            models.Index(fields=["project", "model", "timestamp"], name="step_model_time"),
        ]

    def __str__(self) -> str:
        return f"{self.step_type} {self.model}"

    @property
    def tokens_used(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def is_tool(self) -> bool:
        """Sent without a model (a tool call, a retrieval): $0 by nature, never unpriced."""
        return self.model.strip().lower() == TOOL_MODEL


class DailyRollup(UsageTotals):
    """A project's usage per UTC day, model family, exact model and step type, kept current
    at ingest. Pages group by `family`; the exact names are one level down."""

    # no lone index: its unique key leads with it
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="rollups", db_index=False
    )
    day = models.DateField()
    family = models.CharField(max_length=200, default="", db_default="")
    model = models.CharField(max_length=200)
    step_type = models.CharField(max_length=64)
    calls = models.BigIntegerField(default=0, db_default=0)
    errors = models.BigIntegerField(default=0, db_default=0)
    # Calls of a model no price covers (tool steps, model `none`, never count: $0 by nature).
    unpriced_calls = models.BigIntegerField(default=0, db_default=0)
    duration_ms = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        constraints = [
            # also the pages' index: a period of some projects, grouped by family
            models.UniqueConstraint(
                fields=["project", "day", "family", "model", "step_type"], name="rollup_key"
            )
        ]
        indexes = [models.Index(fields=["day"], name="rollup_day")]

    def __str__(self) -> str:
        return f"{self.project_id} {self.day} {self.model} {self.step_type}"


class UserDailyRollup(UsageTotals):
    """A project's usage per UTC day and end user (the session's user_id when the step
    arrived; "" for steps of sessions without one), kept current at ingest: `/users/` and the
    spend export read it, never the steps."""

    # no lone index: its unique key leads with it
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    day = models.DateField()
    user_id = models.CharField(max_length=128)
    calls = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "day", "user_id"], name="user_rollup_key")
        ]

    def __str__(self) -> str:
        return f"{self.project_id} {self.day} {self.user_id}"


class TagDailyRollup(UsageTotals):
    """A project's usage per UTC day and tag (key and value: a step with three tags counts
    under each), kept current at ingest for the tag breakdowns and the spend export."""

    # no lone index: its unique key leads with it
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    day = models.DateField()
    key = models.CharField(max_length=64)
    value = models.CharField(max_length=128)
    calls = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "day", "key", "value"], name="tag_rollup_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.project_id} {self.day} {self.key}={self.value}"


class BudgetEvent(models.Model):
    class Kind(models.TextChoices):
        SOFT_WARNED = "soft_warned"
        EXHAUSTED = "exhausted"
        RUNAWAY = "runaway"
        CAP_CHANGED = "cap_changed"
        # a period budget projected, at its recent daily rate, to pass its limit this period
        FORECAST = "forecast"

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

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["session", "at"], name="budgetevent_session")]
        constraints = [
            models.CheckConstraint(
                condition=Q(session__isnull=False, ledger__isnull=True)
                | Q(session__isnull=True, ledger__isnull=False),
                name="budgetevent_session_or_ledger",
            ),
            # a period budget's crossing is recorded once per period, whatever races
            models.UniqueConstraint(
                fields=["ledger", "kind", "project"],
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


class PeriodBudget(models.Model):
    """A budget above the session (docs/budgets.md, "Period budgets"): a project's, an end user's,
    an API key's or a tag's spend in each day, week or month (in a timezone), or in total, held to a
    token and/or USD limit. Every step whose scope matches counts toward it, in the period its
    timestamp falls in (a PeriodLedger each); `stop` tells the agents of its sessions to stop when
    it is exhausted, `warn` only warns. A `scope_value` of "*" (a tag's "key=*") makes it a
    per-member budget: each user, key or tag value held to the limits on its own, with a
    ledger of its own (`PeriodLedger.member`)."""

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
    period = models.CharField(max_length=5, choices=Period.choices, default=Period.MONTH)
    # (before `timezone`, which names a field from there on in this class)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
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
    warn_at_pct = models.DecimalField(
        max_digits=4,
        decimal_places=3,
        default=Decimal("0.8"),
        validators=[MinValueValidator(Decimal("0.01")), MaxValueValidator(Decimal(1))],
        help_text="the fraction of a limit that warns (0.8: at 80 %)",
    )
    action = models.CharField(max_length=4, choices=Action.choices, default=Action.WARN)

    class Meta:
        ordering = ["project", "name", "id"]
        indexes = [models.Index(fields=["project", "scope"], name="periodbudget_scope")]
        constraints = [
            models.CheckConstraint(
                condition=Q(token_limit__isnull=False) | Q(cost_limit_usd__isnull=False),
                name="periodbudget_has_a_limit",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.project.slug})"


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


class EventReceipt(models.Model):
    """The event_id of an accepted session or turn event, so a replay changes nothing.

    (A step's event_id lives on the step itself.)
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    event_id = models.CharField(max_length=128)
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "event_id"], name="receipt_event_id")
        ]

    def __str__(self) -> str:
        return self.event_id


class StepReceipt(models.Model):
    """The event_id of a stored step, kept beside the month-partitioned steps so that a replay
    is a duplicate in its project whatever month its timestamp falls in (a step's own unique
    index is its partition's: a duplicate within its month). `timestamp` is the step's, so
    retention deletes a receipt with its step (costboard/budgets/retention.py)."""

    # the unique key is the primary key: no id column, no second index to write per step
    pk = models.CompositePrimaryKey("project_id", "event_id")
    project = models.ForeignKey(
        Project, on_delete=models.CASCADE, related_name="+", db_constraint=False, db_index=False
    )
    event_id = models.CharField(max_length=128)
    timestamp = models.DateTimeField()

    # No index on timestamp: one more index written per step for an hourly delete, which
    # finds a project's receipts by the primary key's leading column instead.

    def __str__(self) -> str:
        return self.event_id


class Membership(models.Model):
    """Who may see a project's pages. Staff see every project."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "project"], name="membership_user_project")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project}"


class SessionModelUsage(models.Model):
    """A session's calls per model family and exact model, kept at ingest: the model mix shown
    beside each session and the model filter of the sessions list, without reading steps."""

    # the session's project, copied: the distribution column (docs/operations.md, "Scaling out")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    # No lone session index: session_model_key leads with it.
    session = models.ForeignKey(
        Session,
        on_delete=models.CASCADE,
        related_name="model_usage",
        db_index=False,
        db_constraint=False,
    )
    family = models.CharField(max_length=200, default="", db_default="")
    model = models.CharField(max_length=200)
    calls = models.BigIntegerField(default=0, db_default=0)
    tokens_used = models.BigIntegerField(default=0, db_default=0)
    cost_usd = money_field()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["session", "family", "model", "project"], name="session_model_key"
            )
        ]
        indexes = [
            # sessions list filtered by an exact model name: the sessions that called it
            models.Index(fields=["model", "session"], name="session_model_by_model"),
            # sessions list filtered by model (a family): the sessions that called it
            models.Index(fields=["family", "session"], name="session_model_by_family"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} {self.family} {self.model}"


LATENCY_BUCKETS_PER_DECADE = 20  # each bucket ~12% wide: p50/p95 read to within ~6%


class LatencyRollup(models.Model):
    """A latency histogram per project, UTC day and step type, kept at ingest: bucket b counts
    calls of duration in [10^((b-1)/20), 10^(b/20)) ms (bucket 0: under 1 ms)."""

    # no lone index: its unique key leads with it
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    day = models.DateField()
    step_type = models.CharField(max_length=64)
    bucket = models.SmallIntegerField()
    calls = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "day", "step_type", "bucket"], name="latency_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.step_type} b{self.bucket}"


class IngestTally(models.Model):
    """Events a project sent per UTC day: accepted, duplicates, refused (the /metrics
    counters, kept in the database so every worker's count is in one place), and the sessions
    made and deleted that day: their sums are the project's count of sessions, which the
    all-time sessions list shows without counting a whole history (sessions_total)."""

    # no lone index: its unique key leads with it
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+", db_index=False)
    day = models.DateField()
    accepted = models.BigIntegerField(default=0, db_default=0)
    duplicates = models.BigIntegerField(default=0, db_default=0)
    refused = models.BigIntegerField(default=0, db_default=0)
    # ingest makes every session (in the batch that first names it, counted by the same
    # statement as its events); the admin deletes them (sessions_delete)
    sessions_made = models.BigIntegerField(default=0, db_default=0)
    sessions_deleted = models.BigIntegerField(default=0, db_default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "day"], name="tally_key")]

    def __str__(self) -> str:
        return f"{self.project_id} {self.day}"


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


# forecast: a period budget projected to pass its USD limit this period (once per period)
ALERT_KINDS = ["soft_warned", "exhausted", "runaway", "forecast"]


def _alert_kinds() -> list[str]:
    return list(ALERT_KINDS)


class WebhookEndpoint(models.Model):
    """Where a project's budget alerts are POSTed, signed with HMAC-SHA256 of the secret."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="webhooks")
    name = models.CharField(max_length=100, blank=True)
    url = models.URLField(max_length=500)
    secret = models.CharField(
        max_length=200, help_text="Shared secret: the X-Costboard-Signature is HMAC-SHA256."
    )
    kinds = models.JSONField(
        default=_alert_kinds,
        blank=True,
        help_text='Which budget events to send: any of "soft_warned", "exhausted", "runaway", '
        '"forecast".',
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    # Not stored: what validation found worth telling whoever saves (a host that does not
    # resolve from here), for the admin to show.
    url_note = ""

    def __str__(self) -> str:
        return self.name or self.url

    def clean_fields(self, exclude: Collection[str] | None = None) -> None:
        """Also refuse a URL webhooks may not go to (costboard/egress.py), once the
        URL is a valid one: every ModelForm, the admin's too, shows it on the url field."""
        errors: dict[str, list[ValidationError]] = {}
        try:
            super().clean_fields(exclude)
        except ValidationError as exc:
            errors = exc.update_error_dict(errors)
        if "url" not in errors and "url" not in (exclude or ()):
            check = webhook_url_check(self.url)
            self.url_note = check.note
            if check.refusal:
                errors["url"] = [
                    ValidationError(
                        "This URL is refused: %(reason)s.",
                        code="egress",
                        params={"reason": check.refusal},
                    )
                ]
        if errors:
            raise ValidationError(errors)


class AlertDelivery(models.Model):
    """One budget event sent (or being sent) through one channel to one target: the
    delivery log. Unique per event and target, so an event never goes out twice."""

    class Channel(models.TextChoices):
        WEBHOOK = "webhook"
        EMAIL = "email"

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    # no database constraint: budget events are keyed by (id, project_id) (docs/operations.md,
    # "Scaling out")
    budget_event = models.ForeignKey(
        BudgetEvent, on_delete=models.CASCADE, related_name="deliveries", db_constraint=False
    )
    channel = models.CharField(max_length=10, choices=Channel.choices)
    endpoint = models.ForeignKey(
        WebhookEndpoint,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="deliveries",
    )
    target = models.CharField(max_length=500, help_text="The URL or email address.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    response_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "alert deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["budget_event", "channel", "target"], name="delivery_once"
            )
        ]
        indexes = [models.Index(fields=["project", "-created_at"], name="delivery_recent")]

    def __str__(self) -> str:
        return f"{self.channel} {self.target} {self.status}"


class OutboxItem(models.Model):
    """A side effect (an alert to send, turns to read for memories, steps to reprice, …)
    written in the transaction that causes it and carried out after the commit by the
    dispatcher (costboard/outbox.py). Deleted once done; a failed one stays for the admin."""

    class Status(models.TextChoices):
        PENDING = "pending"
        FAILED = "failed"

    kind = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    # A dispatcher holds the item until then; past it, the item is taken to have died with it.
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="outbox_due",
                condition=models.Q(status="pending"),
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} {self.status}"


class IdempotentRequest(models.Model):
    """A batch sent with an Idempotency-Key header: the body's hash and the answer given,
    so the same key and body get the same answer (kept at least 24 hours)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    body_sha256 = models.CharField(max_length=64)
    status_code = models.PositiveSmallIntegerField()
    response = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "key"], name="idempotency_key_once")
        ]
        indexes = [models.Index(fields=["created_at"], name="idempotency_age")]

    def __str__(self) -> str:
        return self.key
