from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand
from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from costboard.models import Project, Session
from costboard.templatetags.costboard_tags import usd

ACTIVE_WINDOW = timedelta(hours=24)


def _counts(sessions: QuerySet[Session], since: datetime) -> dict[str, int]:
    open_sessions = Q(ended_at__isnull=True)
    return sessions.aggregate(
        active=Count("id", filter=open_sessions & Q(last_active_at__gte=since)),
        near_cap=Count("id", filter=open_sessions & Q(state=Session.State.WARNING)),
        exhausted=Count("id", filter=open_sessions & Q(state=Session.State.EXHAUSTED)),
        runaway=Count("id", filter=open_sessions & Q(runaway_at__isnull=False)),
    )


class Command(BaseCommand):
    help = (
        "Print `sessions: N active, M near-cap, K exhausted`, then a line per project. "
        "Active: not ended and seen in the last 24 hours; near-cap and exhausted: not ended."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        since = timezone.now() - ACTIVE_WINDOW
        total = _counts(Session.objects.all(), since)
        self.stdout.write(
            f"sessions: {total['active']} active, {total['near_cap']} near-cap, "
            f"{total['exhausted']} exhausted"
        )
        for project in Project.objects.order_by("slug"):
            counts = _counts(Session.objects.filter(project=project), since)
            spend = Session.objects.filter(project=project).aggregate(s=Sum("cost_usd"))["s"]
            self.stdout.write(
                f"  {project.slug}: {counts['active']} active, {counts['near_cap']} near-cap, "
                f"{counts['exhausted']} exhausted, {counts['runaway']} runaway, "
                f"spent {usd(spend)}"
            )
