"""The showback report's sent-log in the admin: who was sent which week's or month's report,
and how the attempts went (read only: a report is sent by `manage.py spend_report --send` or
the schedule, docs/reports.md)."""

from __future__ import annotations

from django.contrib import admin

from costboard.admin.site import ReadOnlyAdmin
from costboard.models import SpendReportDelivery


@admin.register(SpendReportDelivery)
class SpendReportDeliveryAdmin(ReadOnlyAdmin[SpendReportDelivery]):
    list_display = (
        "project",
        "period",
        "period_start",
        "channel",
        "target",
        "status",
        "attempts",
        "error",
        "created_at",
        "delivered_at",
    )
    list_filter = ("status", "period", "channel", "project")
    search_fields = ("target", "project__slug")
    list_select_related = ("project",)
    date_hierarchy = "created_at"
