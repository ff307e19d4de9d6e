"""Memories in the Django admin: to look, and to decide through the review services. No form
writes a row here (no add, change or delete): every change to a memory is a service that
writes its history, so the admin offers the queue's two decisions as actions."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from memory_ui.models import Memory
from memory_ui.writes import decisions


@admin.register(Memory)
class MemoryAdmin(admin.ModelAdmin[Memory]):
    list_display = ("content", "type", "scope", "status", "importance", "project", "created_at")
    list_filter = ("status", "type", "project")
    search_fields = ("content",)
    actions = ["approve_selected", "reject_selected"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Memory | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Memory | None = None) -> bool:
        return False

    def has_review_permission(self, request: HttpRequest) -> bool:
        """As on /memory/review/: staff, or the Reviewers group."""
        user = request.user
        return bool(user.is_staff or user.has_perm("memory_ui.review_memory"))

    @admin.action(description="Approve selected pending memories", permissions=["review"])
    def approve_selected(self, request: HttpRequest, queryset: QuerySet[Memory]) -> None:
        self._decide(request, queryset, "approve")

    @admin.action(description="Reject selected pending memories", permissions=["review"])
    def reject_selected(self, request: HttpRequest, queryset: QuerySet[Memory]) -> None:
        self._decide(request, queryset, "reject")

    def _decide(self, request: HttpRequest, queryset: QuerySet[Memory], decision: str) -> None:
        result = decisions.candidates_decide(
            ids=list(queryset.values_list("pk", flat=True)), decision=decision, by=request.user
        )
        past = "approved" if decision == "approve" else "rejected"
        self.message_user(request, f"{len(result.decided)} {past}.", messages.SUCCESS)
        if result.skipped:
            self.message_user(
                request,
                f"{len(result.skipped)} skipped: not pending (decide only pending memories).",
                messages.WARNING,
            )
