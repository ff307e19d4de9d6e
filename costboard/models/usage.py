"""The three levels of usage as reported: a session holds turns, a turn holds steps (one LLM
or tool call each, priced at ingest). Sessions and turns keep their totals; steps are written
once per event and only repricing changes them."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db import models
from django.db.models import Q
from django.utils import timezone

from costboard.models.fields import cap_field, money_field
from costboard.models.pricing import MAX_TIER_LENGTH, STANDARD_TIER, ModelPrice
from costboard.models.projects import Project

SYSTEM_SESSION_ID = "system"

# The model of a step sent without one (a tool call, a retrieval): never priced, $0 by nature;
# also its family (costboard/pricing/families.py).
TOOL_MODEL = "none"
# The step type of a tool call, whichever way it arrives (OTLP's `execute_tool` is stored as
# this: costboard/ingest/otlp/mapping.py).
TOOL_STEP_TYPE = "tool"

# A turn whose prompt fills this much of its model's context window should be summarized.
CONTEXT_PRESSURE_AT = Decimal("0.8")

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
    # as reported, lower case (docs/pricing.md, "Service tiers"): picks its price row's tier
    service_tier = models.CharField(
        max_length=MAX_TIER_LENGTH, default=STANDARD_TIER, db_default=STANDARD_TIER
    )
    input_tokens = models.BigIntegerField(default=0, db_default=0)
    output_tokens = models.BigIntegerField(default=0, db_default=0)
    cache_read_input_tokens = models.BigIntegerField(default=0, db_default=0)
    cache_creation_input_tokens = models.BigIntegerField(default=0, db_default=0)
    # Of cache_creation_input_tokens, those written to Anthropic's 1-hour cache (dearer).
    cache_creation_1h_input_tokens = models.BigIntegerField(default=0, db_default=0)
    reasoning_tokens = models.BigIntegerField(default=0, db_default=0)
    # Audio tokens, each part of the count named after it (docs/api.md, "Audio tokens"):
    # of input_tokens, of cache_read_input_tokens, of output_tokens; priced at the row's
    # audio rates (docs/pricing.md, "Audio tokens"). NULL: none. A step without audio (nearly
    # every one) is stored with NULLs, which take no room in its row (0s would take 24 bytes).
    input_audio_tokens = models.BigIntegerField(null=True, blank=True)
    cache_audio_read_tokens = models.BigIntegerField(null=True, blank=True)
    output_audio_tokens = models.BigIntegerField(null=True, blank=True)
    duration_ms = models.IntegerField(null=True, blank=True)
    success = models.BooleanField(default=True, db_default=True)
    error = models.TextField(blank=True, db_default="")
    metadata = models.JSONField(null=True, blank=True)
    # its session's tags when it arrived, its own merged over them; None: no tags
    tags = models.JSONField(null=True, blank=True)
    # its session's end user when it arrived ("" none): the user its spend was rolled up
    # under, which a repricing moves; None: stored before 0042 (its session's user now)
    user_id = models.CharField(max_length=128, null=True, blank=True)
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
    def audio(self) -> tuple[int, int, int]:
        """Its audio tokens: (of its input, of its cache reads, of its output), 0 for none."""
        return (
            self.input_audio_tokens or 0,
            self.cache_audio_read_tokens or 0,
            self.output_audio_tokens or 0,
        )

    @property
    def is_tool(self) -> bool:
        """Sent without a model (a tool call, a retrieval): $0 by nature, never unpriced."""
        return self.model.strip().lower() == TOOL_MODEL
