"""Memories the agents propose and people approve (docs/memory.md, "Review and permissions").

A Memory is a candidate (pending) until a person approves, edits or rejects it; every decision
is a MemoryEvent (the history). Lifecycle jobs never change an approved memory themselves:
they propose (evict, merge, compress) and a person decides. A rejected candidate keeps its
fingerprint, so the same sentence is not proposed again. Searches are logged (RetrievalLog)
and agents say whether a result helped (MemoryFeedback): the hit-rate figures.
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
        SUPERSEDED = "superseded"  # a newer, contradicting memory approved in its place

    class Source(models.TextChoices):
        USER_STATED = "user_stated", "stated by the user"
        AGENT_INFERRED = "agent_inferred", "inferred by the agent"
        TOOL_OUTPUT = "tool_output", "tool output"

    class Proposal(models.TextChoices):
        NEW = "new", "new memory"
        EVICT = "evict", "evict (MEMORY.md is over its cap)"
        MERGE = "merge", "merge duplicates"
        COMPRESS = "compress", "compress similar entries into one"
        # a reviewed memory proposed again with another type or more tags: a person decides
        UPDATE = "update", "update a reviewed memory's type and tags"

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
    # No database constraints: sessions and turns are keyed by (id, project_id) (docs/operations.md,
    # scale out); Django's collector nulls these when they are deleted.
    session = models.ForeignKey(
        Session,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_constraint=False,
    )
    turn = models.ForeignKey(
        Turn,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_constraint=False,
    )
    # normalized content's SHA-256 (text.fingerprint): exact duplicates and rejected
    # sentences are recognised by it
    fingerprint = models.CharField(max_length=64, blank=True, db_default="")
    # the hash of its frame, the words but for numbers, negations and opposites
    # (memory_ui.conflicts.frame_key): a proposal's duplicates and contradictions share it
    frame_key = models.CharField(max_length=64, blank=True, db_default="")
    evidence = models.TextField(
        blank=True, db_default="", help_text="The sentence it came from, as redacted."
    )
    redactions = models.JSONField(
        default=list, blank=True, help_text="What was redacted before storing: email, api_key…"
    )
    proposal = models.CharField(max_length=10, choices=Proposal.choices, default=Proposal.NEW)
    # what an evict/merge/compress proposal acts on
    targets = models.ManyToManyField("self", symmetrical=False, blank=True, related_name="+")
    merged_into = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="merged_from"
    )
    # live memories this candidate contradicts (memory_ui.conflicts), found when it was proposed
    conflicts_with = models.ManyToManyField(
        "self", symmetrical=False, blank=True, related_name="conflicted_by"
    )
    superseded_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="supersedes"
    )
    times_proposed = models.PositiveIntegerField(default=1)
    proposed_by = models.CharField(max_length=150, blank=True, db_default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        verbose_name_plural = "memories"
        permissions = [("review_memory", "Can approve, edit and reject memory candidates")]
        indexes = [
            # review queue: a project's pending candidates, newest first
            models.Index(fields=["project", "status", "-created_at"], name="memory_queue"),
            # duplicates and rejected sentences: by fingerprint
            models.Index(fields=["project", "fingerprint"], name="memory_fingerprint"),
            # duplicates and contradictions of a proposal: by frame, in its scope
            models.Index(fields=["project", "scope", "frame_key"], name="memory_frame"),
            # MEMORY.md and search: a scope's approved memories
            models.Index(fields=["project", "scope", "status"], name="memory_scope"),
        ]

    def __str__(self) -> str:
        return f"[{self.type}] {self.content}"


class MemoryEvent(models.Model):
    """One step in a memory's history: who proposed, approved, edited (before and after),
    rejected, expired or merged it."""

    class Action(models.TextChoices):
        PROPOSED = "proposed"
        REPROPOSED = "reproposed"
        APPROVED = "approved"
        EDITED = "edited"
        REJECTED = "rejected"
        EXPIRED = "expired"
        MERGED = "merged"
        EVICTED = "evicted"
        SUPERSEDED = "superseded"

    memory = models.ForeignKey(Memory, on_delete=models.CASCADE, related_name="events")
    action = models.CharField(max_length=12, choices=Action.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    note = models.CharField(max_length=300, blank=True)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["memory", "at"], name="memoryevent_memory")]

    def __str__(self) -> str:
        return f"{self.action} {self.memory_id}"


class RetrievalLog(models.Model):
    """One search: what was asked and how many results came back."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    query = models.CharField(max_length=500)
    scope = models.CharField(max_length=140, blank=True)
    k = models.PositiveIntegerField()
    results = models.PositiveIntegerField()
    memory_ids = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["project", "-created_at"], name="retrieval_recent")]

    def __str__(self) -> str:
        return self.query


class MemoryFeedback(models.Model):
    """Was a retrieved memory useful? (POST /api/v1/memory/feedback)"""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    memory = models.ForeignKey(Memory, on_delete=models.CASCADE, related_name="feedback")
    retrieval = models.ForeignKey(
        RetrievalLog, null=True, blank=True, on_delete=models.SET_NULL, related_name="feedback"
    )
    useful = models.BooleanField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["project", "-created_at"], name="feedback_recent")]

    def __str__(self) -> str:
        return f"{self.memory_id} {'useful' if self.useful else 'not useful'}"
