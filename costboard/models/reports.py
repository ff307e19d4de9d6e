"""The showback report's sent-log (docs/reports.md): one row per project, period and recipient,
so a report goes to each recipient once however often it is sent."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from costboard.models.projects import Project


class SpendReportDelivery(models.Model):
    """A project's spend report of one week or month, sent (or being sent) to one recipient: an
    email address, or the project's Slack webhook (target "slack": the URL is read from the
    project at each attempt, never stored here). Unique per project, period and target."""

    class Period(models.TextChoices):
        WEEK = "week"
        MONTH = "month"

    class Channel(models.TextChoices):
        EMAIL = "email"
        SLACK = "slack"

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    period = models.CharField(max_length=5, choices=Period.choices)
    period_start = models.DateField(help_text="The period's first day (a Monday, or the 1st).")
    tag_key = models.CharField(
        max_length=64, blank=True, help_text="The tag key the report groups by; blank: none."
    )
    channel = models.CharField(max_length=5, choices=Channel.choices)
    target = models.CharField(max_length=254, help_text='The email address, or "slack".')
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    response_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "spend report deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["project", "period", "period_start", "target"],
                name="spend_report_once",
            )
        ]

    def __str__(self) -> str:
        return f"{self.period} {self.period_start} {self.target} {self.status}"
