"""Spend anomalies (docs/budgets.md, "Spend anomalies"): a project's UTC day, or one tag
value's, whose spend rose more than k standard deviations above its trailing 14 days' mean and
above the project's floor. Recorded once per project, tag value (none: the whole project) and
day however often or concurrently the sweep looks, and alerted (`anomaly`) through the outbox
like a billing drift."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from costboard.models.fields import money_field
from costboard.models.projects import Project


class SpendAnomaly(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    # "" and "": the whole project's spend; else one tag value's (its TagDailyRollup rows)
    tag_key = models.CharField(max_length=64, blank=True, default="")
    tag_value = models.CharField(max_length=128, blank=True, default="")
    day = models.DateField(help_text="The UTC day judged (the day so far when it was raised).")
    spend_usd = money_field(help_text="The day's spend when it was raised.")
    mean_usd = money_field(help_text="The mean daily spend of the days it was judged against.")
    stddev_usd = money_field(help_text="Their standard deviation (sample, n − 1).")
    history_days = models.PositiveSmallIntegerField(help_text="How many days that was.")
    k = models.DecimalField(max_digits=6, decimal_places=2)
    floor_usd = models.DecimalField(max_digits=14, decimal_places=4)
    # The tag value with the largest share of the day's spend among those that rose most
    # ("customer=acme"; "" when the day's spend carried no tag), and that share (0–1).
    top_tag = models.CharField(max_length=200, blank=True, default="")
    top_share = models.DecimalField(max_digits=5, decimal_places=4, null=True, blank=True)
    explanation = models.CharField(max_length=400)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "spend anomaly"
        verbose_name_plural = "spend anomalies"
        ordering = ["-at"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "tag_key", "tag_value", "day"], name="anomaly_once"
            )
        ]
        # the overview's recent anomalies of some projects
        indexes = [models.Index(fields=["project", "-at"], name="anomaly_recent")]

    def __str__(self) -> str:
        return f"{self.day} {self.subject}: {self.explanation}"

    @property
    def subject(self) -> str:
        """What spent: "customer=acme", or "the project"."""
        return f"{self.tag_key}={self.tag_value}" if self.tag_key else "the project"
