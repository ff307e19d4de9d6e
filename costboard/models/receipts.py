"""What makes a replay change nothing: the event_ids of accepted session, turn and step
events, and the answer given to a batch sent with an Idempotency-Key."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from costboard.models.projects import Project


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
