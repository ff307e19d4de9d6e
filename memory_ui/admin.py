from __future__ import annotations

from django.contrib import admin

from memory_ui.models import Memory


@admin.register(Memory)
class MemoryAdmin(admin.ModelAdmin):
    list_display = ("content", "type", "scope", "status", "importance", "project", "created_at")
    list_filter = ("status", "type", "project")
    search_fields = ("content",)
