"""Sending the showback report (docs/reports.md, "Sending"): one SpendReportDelivery per
project, period and recipient — each address of `Project.report_recipients`, and the project's
Slack webhook when it has one — made once however often the report is sent (the unique
constraint `spend_report_once`), each with one outbox item `reports.deliver` that makes the
attempts: a mail server or Slack that fails is retried after COSTBOARD_ALERT_RETRY_SECONDS × 2ⁿ
until COSTBOARD_ALERT_MAX_ATTEMPTS, as alerts are; Slack through the egress rules
(costboard/egress.py). A project without report recipients gets nothing.

The figures are read when the attempt is made, from the rollups (costboard/reports/spend.py).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from costboard.budgets.alert_senders import alert_addresses, describe, message_id, post_json
from costboard.models import Project, SpendReportDelivery
from costboard.outbox import Attempt, Item, outbox_add_many, outbox_handler
from costboard.reports.messages import (
    report_csv,
    report_csv_name,
    report_html,
    report_slack,
    report_subject,
    report_text,
)
from costboard.reports.periods import (
    KINDS,
    ReportPeriod,
    ended_at,
    last_complete,
    period_of,
    project_timezone,
)
from costboard.reports.selectors import spend_report

log = logging.getLogger(__name__)

DELIVER = "reports.deliver"  # outbox kind
SLACK = "slack"  # the target of a Slack delivery
# The scheduled run sends a period this soon after it ended, or later only to a project sent
# the period before, so a project given recipients (or a sweep started) mid-month is not sent
# last month's report out of the blue, and one whose report was due while the schedule was
# down is sent it late.
SCHEDULE_GRACE = timedelta(days=1)
_ERROR_CHARS = 2000


@dataclass(frozen=True, slots=True)
class Queued:
    """What sending one project's report did: deliveries queued now, and those made before."""

    project: Project
    period: ReportPeriod
    queued: int
    already: int

    def __str__(self) -> str:
        line = f"{self.project.slug}: {self.period.title}: {self.queued} queued"
        return line + (f", {self.already} sent before" if self.already else "")


def report_targets(project: Project) -> list[tuple[str, str]]:
    """(channel, target) of each recipient: the valid addresses of report_recipients, and
    Slack when the project has a webhook; none without report recipients."""
    addresses = alert_addresses(project.report_recipients)
    if not addresses:
        return []
    targets = [(SpendReportDelivery.Channel.EMAIL.value, a) for a in addresses]
    if project.slack_webhook_url:
        targets.append((SpendReportDelivery.Channel.SLACK.value, SLACK))
    return targets


def spend_report_send(*, project: Project, period: ReportPeriod, tag_key: str) -> Queued:
    """Queue the report of `period` to each of the project's recipients not sent it before
    (a racing run makes no second delivery)."""
    targets = report_targets(project)
    if not targets:
        return Queued(project, period, 0, 0)
    made: list[int] = []
    already = 0
    with transaction.atomic():
        for channel, target in targets:
            try:  # one row at a time: a racing run's row is an IntegrityError here, not ours
                with transaction.atomic():
                    row = SpendReportDelivery.objects.create(
                        project=project,
                        period=period.kind,
                        period_start=period.first,
                        tag_key=tag_key,
                        channel=channel,
                        target=target,
                    )
            except IntegrityError:
                already += 1
                continue
            made.append(row.pk)
        outbox_add_many(Item(DELIVER, {"delivery_id": pk}, project.pk) for pk in made)
    return Queued(project, period, len(made), already)


def _sent_before_not_since(project: Project, period: ReportPeriod) -> bool:
    """The project was sent the period before `period` and nothing of `period` yet: a run
    that missed the end of `period` (the schedule down) sends it late (one query)."""
    starts = set(
        SpendReportDelivery.objects.filter(
            project=project,
            period=period.kind,
            period_start__in=[period.previous.first, period.first],
        ).values_list("period_start", flat=True)
    )
    return starts == {period.previous.first}


def spend_reports_due(*, now: datetime) -> list[Queued]:
    """The scheduled run (beat, or guard_sweep without a broker): each project with report
    recipients is sent its last complete week and month, once, within SCHEDULE_GRACE of the
    period's end in its budget timezone, or later if the project was sent the period before
    (the schedule was down at the end) — safe to run as often as wanted."""
    done = []
    for project in Project.objects.exclude(report_recipients="").order_by("pk"):
        if not report_targets(project):
            continue
        tz_name = project_timezone(project)
        for kind in KINDS:
            period = last_complete(kind, now=now, tz_name=tz_name)
            if now - ended_at(period, tz_name) < SCHEDULE_GRACE or _sent_before_not_since(
                project, period
            ):
                queued = spend_report_send(
                    project=project, period=period, tag_key=project.report_tag_key
                )
                if queued.queued:
                    done.append(queued)
    return done


# --- delivering: one attempt per outbox run ---------------------------------------------------


class ReportNotSent(Exception):
    """A retryable attempt failed: the outbox tries again after its back-off."""


def _email_send(
    delivery: SpendReportDelivery, period: ReportPeriod
) -> tuple[int | None, str, bool]:
    """(None, error, False): every mail backend error is retried."""
    report = spend_report(project=delivery.project, period=period, tag_key=delivery.tag_key)
    message = EmailMultiAlternatives(
        report_subject(report),
        report_text(report),
        None,
        [delivery.target],
        headers={"Message-ID": message_id("report", delivery.pk)},
    )
    message.attach_alternative(report_html(report), "text/html")
    message.attach(report_csv_name(report), report_csv(report), "text/csv")
    try:
        message.send(fail_silently=False)
    except Exception as exc:  # SMTP errors come in many types; each is retried
        return None, describe(exc), False
    return None, "", False


def _slack_send(
    delivery: SpendReportDelivery, period: ReportPeriod
) -> tuple[int | None, str, bool]:
    """(response code, error, permanent): one POST through the alerts' sender (the egress
    check, the retry policy's reading of the answer)."""
    url = delivery.project.slack_webhook_url
    if not url:
        return None, "the project has no Slack webhook URL now", True
    report = spend_report(project=delivery.project, period=period, tag_key=delivery.tag_key)
    body = json.dumps(report_slack(report), ensure_ascii=False).encode()
    sent = post_json(url, body, {}, path_secret=True)
    return sent.response_code, sent.error, sent.permanent


def spend_report_deliver(delivery_id: int, *, final: bool = True) -> str:
    """Make one attempt at a delivery and record it; a retryable failure stays pending and
    raises ReportNotSent unless this is the `final` attempt. Returns its status, or
    "skipped" when it is gone or no longer pending."""
    claimed = SpendReportDelivery.objects.filter(
        pk=delivery_id, status=SpendReportDelivery.Status.PENDING
    ).update(attempts=F("attempts") + 1)
    if claimed != 1:
        return "skipped"
    delivery = SpendReportDelivery.objects.select_related("project").get(pk=delivery_id)
    period = period_of(delivery.period, delivery.period_start)
    permanent = False
    try:
        if delivery.channel == SpendReportDelivery.Channel.SLACK:
            code, error, permanent = _slack_send(delivery, period)
        else:
            code, error, permanent = _email_send(delivery, period)
    except Exception as exc:  # recorded, never lost
        log.exception("spend report delivery %s: unexpected error", delivery_id)
        code, error = None, describe(exc)
    if not error:
        status = SpendReportDelivery.Status.DELIVERED
    elif permanent or final:
        status = SpendReportDelivery.Status.FAILED
    else:
        status = SpendReportDelivery.Status.PENDING
    SpendReportDelivery.objects.filter(pk=delivery_id).update(
        status=status,
        response_code=code,
        error=error[:_ERROR_CHARS],
        delivered_at=timezone.now() if not error else None,
    )
    if status == SpendReportDelivery.Status.PENDING:
        log.warning(
            "spend report delivery %s to %s failed: %s", delivery_id, delivery.target, error
        )
        raise ReportNotSent(error)
    return status


@outbox_handler(
    DELIVER,
    max_attempts=lambda: settings.COSTBOARD_ALERT_MAX_ATTEMPTS,
    retry_seconds=lambda: float(settings.COSTBOARD_ALERT_RETRY_SECONDS),
    atomic=False,  # the delivery row records each attempt itself
)
def _deliver_item(payload: dict[str, Any], attempt: Attempt) -> None:
    spend_report_deliver(int(payload["delivery_id"]), final=attempt.final)
