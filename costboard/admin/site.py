"""The admin site itself: its titles, and the base of the lists nobody edits there (rows
that ingest, the budget engine or the outbox write)."""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

admin.site.site_header = "Costboard administration"
admin.site.site_title = "Costboard admin"
admin.site.index_title = "Rates, caps, keys and projects"
# the rate list's editable columns need the width at 1366 px; the index and breadcrumbs lead
admin.site.enable_nav_sidebar = False


_M = TypeVar("_M", bound=Model)


class ReadOnlyAdmin(admin.ModelAdmin[_M]):
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
