"""Memories the agents propose and people approve (CONTRACT §3 Memory).

The review queue, detection and ranking are built on this model by the memory issue; the spine
only needs candidates to exist so the demo has a queue to show.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from costboard.models import Project, Session, Turn

MAX_CONTENT = 150


class Memory(models.Model):
    class Type(models.TextChoices):
        USER = "user"
        FEEDBACK = "feedback"
        PROJECT = "project"
        REFERENCE = "reference"

    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        EXPIRED = "expired"
        MERGED = "merged"

    class Source(models.TextChoices):
        USER_STATED = "user_stated", "stated by the user"
        AGENT_INFERRED = "agent_inferred", "inferred by the agent"
        TOOL_OUTPUT = "tool_output", "tool output"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memories")
    type = models.CharField(max_length=10, choices=Type.choices)
    content = models.CharField(max_length=MAX_CONTENT)
    scope = models.CharField(max_length=140, default="project")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    importance = models.DecimalField(
        max_digits=4,
        decimal_places=3,
        default=Decimal("0.5"),
        validators=[MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(1))],
    )
    source = models.CharField(max_length=20, choices=Source.choices, default=Source.AGENT_INFERRED)
    tags = models.JSONField(default=list, blank=True)
    ttl_days = models.PositiveIntegerField(null=True, blank=True)
    session = models.ForeignKey(
        Session, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    turn = models.ForeignKey(
        Turn, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        verbose_name_plural = "memories"
        indexes = [
            # review queue: a project's pending candidates, newest first
            models.Index(fields=["project", "status", "-created_at"], name="memory_queue"),
        ]

    def __str__(self) -> str:
        return f"[{self.type}] {self.content}"
