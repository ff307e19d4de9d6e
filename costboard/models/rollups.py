"""What ingest keeps current beside the steps, so pages and exports never read them: usage
per day (by model, by user, by tag), a session's model mix, latency histograms, and the
per-day tally of events accepted, replayed and refused."""

from __future__ import annotations

from django.db import models

from costboard.models.fields import money_field
from costboard.models.projects import Project
from costboard.models.usage import Session, UsageTotals


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
