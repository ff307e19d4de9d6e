"""`manage.py spend_report --period week|month [--tag KEY] [--at PERIOD] [--project SLUG]
[--send]`: each project's showback report of its last complete ISO week or calendar month in
its budget timezone (or of a past one, --at), printed, or with --send emailed to its report
recipients (and posted to its Slack), once per recipient however often it is run
(docs/reports.md)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from costboard.models import Project
from costboard.outbox import outbox_dispatch_without_broker
from costboard.reports.messages import report_text
from costboard.reports.periods import KINDS, last_complete, period_parse, project_timezone
from costboard.reports.selectors import spend_report
from costboard.reports.services import spend_report_send
from costboard.tag_values import TAG_KEY


class Command(BaseCommand):
    help = (
        "The showback report of each project's last complete ISO week (Monday–Sunday) or "
        "calendar month in its budget timezone (UTC unless its project-wide period budget "
        "names one): spend by a tag key, by user and by model against the period before. "
        "Printed; with --send emailed to the project's report recipients (HTML, text and a "
        "CSV) and posted to its Slack webhook, once per recipient."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--period", required=True, choices=KINDS)
        parser.add_argument(
            "--tag",
            default=None,
            metavar="KEY",
            help="the tag key to group by (default: the project's report tag key)",
        )
        parser.add_argument(
            "--at",
            default=None,
            metavar="PERIOD",
            help="a past period instead of the last complete one: 2026-W47 or 2026-11",
        )
        parser.add_argument(
            "--project", default=None, metavar="SLUG", help="one project (default: every one)"
        )
        parser.add_argument(
            "--send",
            action="store_true",
            help="send to the report recipients instead of printing",
        )

    def handle(
        self,
        *args: Any,
        period: str,
        tag: str | None,
        at: str | None,
        project: str | None,
        send: bool,
        **_: Any,
    ) -> None:
        projects = Project.objects.order_by("slug")
        if project is not None:
            projects = projects.filter(slug=project)
            if not projects.exists():
                raise CommandError(f"--project {project!r}: no such project (use its slug)")
        if tag is not None and not TAG_KEY.fullmatch(tag.strip()):
            raise CommandError(
                f"--tag {tag[:70]!r} is not a tag key: up to 64 of a-z 0-9 _ . - (e.g. "
                "customer), or leave it out for each project's report tag key"
            )
        asked = None
        if at is not None:
            try:
                asked = period_parse(period, at.strip())
            except ValueError as exc:
                raise CommandError(f"--at: {exc}") from None
        now = timezone.now()
        for each in projects:
            which = last_complete(period, now=now, tz_name=project_timezone(each))
            if asked is not None:
                if asked.first > which.first:
                    raise CommandError(
                        f"--at {asked.label} is not over yet for {each.slug}: "
                        f"{which.label} or before"
                    )
                which = asked
            tag_key = each.report_tag_key if tag is None else tag.strip()
            if send:
                self.stdout.write(
                    str(spend_report_send(project=each, period=which, tag_key=tag_key))
                )
            else:
                self.stdout.write(
                    report_text(spend_report(project=each, period=which, tag_key=tag_key))
                )
        if send:
            dispatched = outbox_dispatch_without_broker()
            if dispatched is not None:
                self.stdout.write(str(dispatched))
