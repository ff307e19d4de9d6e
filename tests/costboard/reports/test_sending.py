"""`manage.py spend_report`: printed without --send; with it, an email to each report recipient
(HTML and text, the CSV attached) whose tables are GET /api/v1/spend's for the same days, and a
Slack message, each once however often it is run; a mail server or Slack that fails is tried
again through the outbox; a project without recipients gets nothing."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from decimal import Decimal
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
import time_machine
from django.core import mail
from django.core.mail import EmailMessage
from django.core.mail.backends.locmem import EmailBackend
from django.core.management import CommandError, call_command
from django.test import Client

from costboard.budgets.alert_senders import message_id
from costboard.models import OutboxItem, SpendReportDelivery
from costboard.outbox import outbox_dispatch
from costboard.reports.periods import period_of
from costboard.reports.services import spend_report_send, spend_reports_due
from tests.conftest import make_agent, project_admin_fields, run_in_threads
from tests.costboard.reports.showback import NOW, SCRIPT, W46, W47, Showback, spend_two_weeks
from tests.costboard.reports.test_report import SUMS, api_spend
from tests.servers import free_port, serve

pytestmark = pytest.mark.django_db

SUBJECT = "Costboard spend, week 2026-W47: Acme $6.45 (+43.3 % vs previous)"


def run(*args: str, now: str = NOW) -> str:
    out = io.StringIO()
    with time_machine.travel(now, tick=False):
        call_command("spend_report", *args, stdout=out)
    return out.getvalue()


def attachment(message: EmailMessage) -> list[dict[str, str]]:
    [(name, content, kind)] = message.attachments
    assert (name, kind) == ("spend-acme-2026-W47.csv", "text/csv")
    return list(csv.DictReader(io.StringIO(content)))


def html_of(message: EmailMessage) -> str:
    [(html, kind)] = message.alternatives  # type: ignore[attr-defined]
    assert kind == "text/html"
    return str(html)


def test_without_send_the_report_is_printed_and_nothing_sent(showback: Showback) -> None:
    printed = run("--period", "week")
    assert printed.startswith(SUBJECT)
    assert "By tag customer" in printed and SCRIPT in printed  # text: nothing to escape
    assert "Top movers: ann +$3.00, bob -$1.50, carol +$0.30, (no user) +$0.15" in printed
    assert mail.outbox == []
    assert not SpendReportDelivery.objects.exists()


def test_send_twice_emails_each_recipient_once(showback: Showback) -> None:
    first = run("--period", "week", "--send")
    assert "acme: week 2026-W47: 2 queued" in first
    again = run("--period", "week", "--send")
    assert "acme: week 2026-W47: 0 queued, 2 sent before" in again
    assert sorted(m.to[0] for m in mail.outbox) == ["ann@example.com", "boss@example.com"]
    assert {m.subject for m in mail.outbox} == {SUBJECT}
    assert set(SpendReportDelivery.objects.values_list("status", "attempts")) == {("delivered", 1)}
    assert not OutboxItem.objects.filter(kind="reports.deliver").exists()


def test_each_report_mail_carries_its_deliverys_message_id(showback: Showback) -> None:
    """The id is the delivery's, the same at every attempt: a mail sent again after a
    dispatcher died before recording it is shown once where duplicates are dropped by it."""
    run("--period", "week", "--send")
    by_address = {m.to[0]: m.message()["Message-ID"] for m in mail.outbox}
    assert by_address == {
        d.target: message_id("report", d.pk) for d in SpendReportDelivery.objects.all()
    }
    assert len(set(by_address.values())) == 2


def test_the_emailed_tables_equal_the_api_for_the_same_days(showback: Showback) -> None:
    run("--period", "week", "--send")
    message = mail.outbox[0]
    rows = attachment(message)
    assert list(rows[0]) == [
        "grouping",
        "name",
        *SUMS,
        "previous_cost_usd",
        "change_usd",
        "change_pct",
    ]
    html = html_of(message)
    for grouping in ("tag:customer", "user", "model"):
        mine = [r for r in rows if r["grouping"] == grouping]
        api = api_spend(showback.read_key, grouping, *W47)["rows"]
        before = api_spend(showback.read_key, grouping, *W46)["rows"]
        current = {r["name"]: {n: r[n] for n in SUMS} for r in mine if r["steps"] != "0"}
        assert current == {
            "(untagged)" if row[grouping] is None else row[grouping]: {n: str(row[n]) for n in SUMS}
            for row in api
        }
        assert {
            r["name"]: r["previous_cost_usd"] for r in mine if r["previous_cost_usd"] != "0.00"
        } == {
            "(untagged)" if row[grouping] is None else row[grouping]: row["cost_usd"]
            for row in before
        }
        for row in mine:
            change = Decimal(row["cost_usd"]) - Decimal(row["previous_cost_usd"])
            assert Decimal(row["change_usd"]) == change
        total = api_spend(showback.read_key, grouping, *W47)["total"]["cost_usd"]
        assert total == "6.45"
    # the HTML shows the same figures, every name escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and SCRIPT not in html
    assert 'data-grouping="tag:customer"' in html and "$6.45" in html and "+43.3 %" in html
    assert "-$1.50" in html  # bob, gone
    assert "(untagged)" in html
    # the text alternative is the printed report
    assert message.body.startswith(SUBJECT)


def test_tag_overrides_the_projects_tag_key(showback: Showback) -> None:
    printed = run("--period", "week", "--tag", "team")
    assert "By tag team" in printed and "By tag customer" not in printed
    assert "(untagged)" in printed  # nothing carries `team`: all of it untagged


def test_a_past_period_is_sent_with_at(showback: Showback) -> None:
    out = run("--period", "week", "--at", "2026-W46", "--send")
    assert "acme: week 2026-W46: 2 queued" in out
    assert {m.subject for m in mail.outbox} == {
        "Costboard spend, week 2026-W46: Acme $4.50 (none the period before)"
    }
    with pytest.raises(CommandError, match="--at 2026-W48 is not over yet for acme"):
        run("--period", "week", "--at", "2026-W48")
    with pytest.raises(CommandError, match=r"--at: .* is not a month: write it as YYYY-MM"):
        run("--period", "month", "--at", "2026-W46")


@pytest.mark.parametrize("bad", ["", "Customer", "a b", "x" * 65])
def test_a_bad_tag_key_or_project_is_refused_naming_it(showback: Showback, bad: str) -> None:
    with pytest.raises(CommandError, match=r"--tag .* is not a tag key"):
        run("--period", "week", "--tag", bad)
    with pytest.raises(CommandError, match="--project 'nope': no such project"):
        run("--period", "week", "--project", "nope")
    assert mail.outbox == [] and not SpendReportDelivery.objects.exists()


def test_a_month_is_sent_once_too(showback: Showback) -> None:
    run("--period", "month", "--send", now="2026-12-02T10:00:00Z")
    run("--period", "month", "--send", now="2026-12-02T11:00:00Z")
    assert {m.subject for m in mail.outbox} == {
        "Costboard spend, month 2026-11: Acme $18.45 (none the period before)"
    }
    assert len(mail.outbox) == 2
    # the week after is another report for the same recipients
    run("--period", "week", "--send")
    assert len(mail.outbox) == 4


def test_no_recipients_nothing_sent(db: None) -> None:
    project = make_agent(
        "quiet", report_tag_key="customer", slack_webhook_url="https://hooks.slack.com/x"
    ).project
    spend_two_weeks(make_agent("other"))  # spend elsewhere changes nothing here
    out = run("--period", "week", "--send", "--project", "quiet")
    assert "quiet: week 2026-W47: 0 queued" in out
    assert mail.outbox == []
    assert not SpendReportDelivery.objects.filter(project=project).exists()
    assert not OutboxItem.objects.filter(kind="reports.deliver").exists()


class FailingOnce(EmailBackend):
    """The locmem backend, refusing the first message it is given (a mail server down)."""

    failures = 1

    def send_messages(self, email_messages: Any) -> int:
        if FailingOnce.failures:
            FailingOnce.failures -= 1
            raise ConnectionRefusedError("mail server down")
        return super().send_messages(email_messages)


def dispatch_at(now: str) -> Any:
    """The outbox run at `now` (retries are due COSTBOARD_ALERT_RETRY_SECONDS × 2ⁿ after)."""
    with time_machine.travel(now, tick=False):
        return outbox_dispatch()


def test_a_mail_failure_is_retried_and_sent_once(showback: Showback, settings: Any) -> None:
    settings.EMAIL_BACKEND = f"{__name__}.FailingOnce"
    settings.COSTBOARD_ALERT_RETRY_SECONDS = 30
    FailingOnce.failures = 1
    showback.agent.project.report_recipients = "ann@example.com"
    showback.agent.project.save()
    with time_machine.travel(NOW, tick=False):
        spend_report_send(
            project=showback.agent.project, period=period_of("week", W47[0]), tag_key=""
        )
    first = dispatch_at(NOW)
    assert (first.kinds, first.retried) == ({}, 1)
    delivery = SpendReportDelivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("pending", 1)
    assert delivery.error == "ConnectionRefusedError: mail server down"
    assert dispatch_at("2026-11-25T10:00:20Z").claimed == 0  # not due before 30 s
    second = dispatch_at("2026-11-25T10:00:31Z")
    assert second.kinds == {"reports.deliver": 1}
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.error) == ("delivered", 2, "")
    assert [m.to for m in mail.outbox] == [["ann@example.com"]]


# --- Slack ------------------------------------------------------------------------------------


class SlackInbox:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.answers: list[int] = []  # statuses to answer, in order; 200 after
        self.location = ""  # the Location a 3xx answer names

    def handler(self) -> type[BaseHTTPRequestHandler]:
        inbox = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = inbox.answers.pop(0) if inbox.answers else 200
                if status == 200:
                    inbox.messages.append(json.loads(body))
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", inbox.location)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


@pytest.fixture
def slack(showback: Showback, settings: Any) -> Iterator[SlackInbox]:
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]  # a receiver on this machine
    settings.COSTBOARD_ALERT_RETRY_SECONDS = 30
    settings.COSTBOARD_BASE_URL = "https://costboard.example"
    inbox = SlackInbox()
    url, stop = serve(inbox.handler())
    showback.agent.project.slack_webhook_url = f"{url}/services/T0/B0/x"
    showback.agent.project.save()
    try:
        yield inbox
    finally:
        stop()


def test_slack_gets_the_total_the_movers_and_the_link_once(
    showback: Showback, slack: SlackInbox
) -> None:
    run("--period", "week", "--send")
    run("--period", "week", "--send")
    [message] = slack.messages
    text = message["text"]
    assert text.startswith(f"*{SUBJECT}*\nTotal $6.45, previous $4.50 (+$1.95, +43.3 %)")
    assert "By user, top movers: ann +$3.00, bob -$1.50, carol +$0.30, (no user) +$0.15" in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt; +$0.30" in text and SCRIPT not in text
    assert text.endswith(
        "<https://costboard.example/reports/?project=acme&period=week&at=2026-W47"
        "&tag=customer|Open the report>"
    )
    slack_row = SpendReportDelivery.objects.get(channel="slack")
    assert (slack_row.target, slack_row.status, slack_row.response_code) == (
        "slack",
        "delivered",
        200,
    )
    assert len(mail.outbox) == 2


def test_slack_down_is_retried_until_it_answers(showback: Showback, slack: SlackInbox) -> None:
    project = showback.agent.project
    live = project.slack_webhook_url
    project.slack_webhook_url = f"http://127.0.0.1:{free_port()}/services/T0/B0/x"  # nobody
    project.save()
    with time_machine.travel(NOW, tick=False):
        spend_report_send(project=project, period=period_of("week", W47[0]), tag_key="")
    dispatch_at(NOW)
    row = SpendReportDelivery.objects.get(channel="slack")
    assert (row.status, row.attempts) == ("pending", 1)
    assert row.error.startswith("cannot connect")
    slack.answers = [503]  # up, but failing once more
    project.slack_webhook_url = live
    project.save()
    dispatch_at("2026-11-25T10:00:31Z")  # 30 s after
    row.refresh_from_db()
    assert (row.status, row.attempts, row.response_code) == ("pending", 2, 503)
    assert row.error == "HTTP 503 Service Unavailable"
    dispatch_at("2026-11-25T10:01:32Z")  # 60 s after that
    row.refresh_from_db()
    assert (row.status, row.attempts) == ("delivered", 3)
    assert len(slack.messages) == 1
    assert not OutboxItem.objects.filter(kind="reports.deliver").exists()


def test_slack_refusing_the_request_is_not_retried(showback: Showback, slack: SlackInbox) -> None:
    slack.answers = [404]
    run("--period", "week", "--send")
    row = SpendReportDelivery.objects.get(channel="slack")
    assert (row.status, row.attempts, row.response_code) == ("failed", 1, 404)
    assert slack.messages == [] and not OutboxItem.objects.filter(kind="reports.deliver").exists()


def test_slack_to_a_refused_address_fails_at_once(
    showback: Showback, slack: SlackInbox, settings: Any
) -> None:
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = []  # 127.0.0.1 is this machine: refused
    run("--period", "week", "--send")
    row = SpendReportDelivery.objects.get(channel="slack")
    assert row.status == "failed" and row.error.startswith("refused: ")
    assert slack.messages == []
    assert len(mail.outbox) == 2  # the emails go out all the same


def test_a_project_name_with_slack_formatting_shows_literally(
    showback: Showback, slack: SlackInbox
) -> None:
    """A project named with Slack's formatting characters is shown as named — as look-alikes
    that format nothing (costboard/slack_text.py) — and its `<…|…>` as text, not a link."""
    project = showback.agent.project
    project.name = "*Acme* _ops_ ~x~ `y` <https://evil.example|click>"
    project.save()
    run("--period", "week", "--send")
    [message] = slack.messages
    assert message["text"].split("\n")[0] == (
        "*Costboard spend, week 2026-W47: ∗Acme∗ ˍopsˍ ∼x∼ ˋyˋ "
        "&lt;https://evil.example|click&gt; $6.45 (+43.3 % vs previous)*"
    )


def test_a_slack_url_that_redirects_is_not_retried(showback: Showback, slack: SlackInbox) -> None:
    slack.answers = [308]
    slack.location = "https://hooks.slack.com/services/T0/B0/moved"
    run("--period", "week", "--send")
    row = SpendReportDelivery.objects.get(channel="slack")
    assert (row.status, row.attempts, row.response_code) == ("failed", 1, 308)
    assert row.error == (
        "HTTP 308 Permanent Redirect: the URL redirects to https://hooks.slack.com/…; "
        "redirects are not followed: use the final URL"
    )
    assert not OutboxItem.objects.filter(kind="reports.deliver").exists()


# --- the schedule -------------------------------------------------------------------------------


def test_the_schedule_sends_each_period_once_within_a_day_of_its_end(showback: Showback) -> None:
    def due(now: str) -> list[str]:
        with time_machine.travel(now, tick=False):
            return [str(q) for q in spend_reports_due(now=datetime_of(now))]

    assert due("2026-11-23T00:30:00Z") == ["acme: week 2026-W47: 2 queued"]
    assert due("2026-11-23T01:30:00Z") == []  # sent already
    assert due("2026-11-25T10:00:00Z") == []  # W47 sent already
    assert due("2026-11-30T00:30:00Z") == ["acme: week 2026-W48: 2 queued"]
    assert due("2026-12-01T00:30:00Z") == ["acme: month 2026-11: 2 queued"]
    dispatch_at("2026-12-01T00:30:00Z")
    assert len(mail.outbox) == 6


def test_a_report_due_while_the_schedule_was_down_is_sent_once_late(
    showback: Showback,
) -> None:
    """The sweep down from Sunday to Wednesday: the week a project was being sent reports
    for goes out late, once, not skipped; a project given recipients since is not sent a
    report out of the blue."""

    def due(now: str) -> list[str]:
        with time_machine.travel(now, tick=False):
            return [str(q) for q in spend_reports_due(now=datetime_of(now))]

    assert due("2026-11-16T00:30:00Z") == ["acme: week 2026-W46: 2 queued"]
    # down from here until Wednesday of W48; newco given its recipients meanwhile
    make_agent("newco", report_recipients="new@example.com")
    assert due("2026-11-25T10:00:00Z") == ["acme: week 2026-W47: 2 queued"]
    assert due("2026-11-25T11:00:00Z") == []
    dispatch_at("2026-11-25T11:00:00Z")
    assert sorted((m.to[0], m.subject[:31]) for m in mail.outbox) == [
        ("ann@example.com", "Costboard spend, week 2026-W46:"),
        ("ann@example.com", "Costboard spend, week 2026-W47:"),
        ("boss@example.com", "Costboard spend, week 2026-W46:"),
        ("boss@example.com", "Costboard spend, week 2026-W47:"),
    ]


def test_the_schedule_keeps_to_the_projects_timezone(showback: Showback) -> None:
    from costboard.models import PeriodBudget

    PeriodBudget.objects.create(
        project=showback.agent.project,
        name="weekly",
        period="week",
        timezone="America/Los_Angeles",
        token_limit=10**9,
    )
    at_utc_midnight = "2026-11-23T00:30:00Z"  # Sunday 16:30 in Los Angeles
    with time_machine.travel(at_utc_midnight, tick=False):
        assert spend_reports_due(now=datetime_of(at_utc_midnight)) == []
    at_la_midnight = "2026-11-23T08:30:00Z"
    with time_machine.travel(at_la_midnight, tick=False):
        [queued] = spend_reports_due(now=datetime_of(at_la_midnight))
    assert str(queued) == "acme: week 2026-W47: 2 queued"


def test_a_timezone_ahead_of_utc_waits_for_the_last_utc_day(showback: Showback) -> None:
    """A week's figures are its UTC days' (the rollups', the spend API's): at midnight in
    Tokyo the week's Sunday still has 9 UTC hours to run (carol's step at 23:30 UTC among
    them), so the week is not reported until that day is over too."""
    from costboard.models import PeriodBudget

    PeriodBudget.objects.create(
        project=showback.agent.project,
        name="weekly",
        period="week",
        timezone="Asia/Tokyo",
        token_limit=10**9,
    )
    at_tokyo_midnight = "2026-11-22T15:30:00Z"  # Monday 00:30 in Tokyo, Sunday in UTC
    with time_machine.travel(at_tokyo_midnight, tick=False):
        assert spend_reports_due(now=datetime_of(at_tokyo_midnight)) == []
    assert run("--period", "week", now=at_tokyo_midnight).startswith(
        "Costboard spend, week 2026-W46"
    )
    with pytest.raises(CommandError, match="2026-W47 is not over yet"):
        run("--period", "week", "--at", "2026-W47", now=at_tokyo_midnight)
    at_utc_midnight = "2026-11-23T00:30:00Z"
    with time_machine.travel(at_utc_midnight, tick=False):
        [queued] = spend_reports_due(now=datetime_of(at_utc_midnight))
    assert str(queued) == "acme: week 2026-W47: 2 queued"
    dispatch_at(at_utc_midnight)
    assert {m.subject for m in mail.outbox} == {SUBJECT}  # carol's Sunday step counted


def test_guard_sweep_sends_the_reports_without_a_broker(showback: Showback) -> None:
    out = io.StringIO()
    with time_machine.travel("2026-11-23T02:00:00Z", tick=False):
        call_command("guard_sweep", stdout=out)
    assert "spend report acme: week 2026-W47: 2 queued" in out.getvalue()
    assert sorted(m.to[0] for m in mail.outbox) == ["ann@example.com", "boss@example.com"]


def datetime_of(text: str) -> Any:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_sends_at_once_make_one_delivery_per_recipient() -> None:
    agent = make_agent("race", report_recipients="ann@example.com, boss@example.com")
    period = period_of("week", W47[0])
    queued: list[int] = []

    def send(_: int) -> None:
        queued.append(spend_report_send(project=agent.project, period=period, tag_key="").queued)

    assert run_in_threads(4, send) == []
    assert sum(queued) == 2
    assert SpendReportDelivery.objects.count() == 2
    assert OutboxItem.objects.filter(kind="reports.deliver").count() == 2


def test_a_project_name_with_a_line_break_is_emailed_on_one_subject_line(
    showback: Showback,
) -> None:
    """A project's name is typed into the admin, a line break included: the subject is one
    line, not a header the mail library refuses on every attempt."""
    project = showback.agent.project
    project.name = "Acme\r\nBcc: everyone@example.com"
    project.save()
    assert "2 queued" in run("--period", "week", "--send")
    assert set(SpendReportDelivery.objects.values_list("status", "error")) == {("delivered", "")}
    assert {m.subject for m in mail.outbox} == {
        "Costboard spend, week 2026-W47: Acme Bcc: everyone@example.com $6.45 (+43.3 % vs previous)"
    }
    assert sorted(m.recipients()[0] for m in mail.outbox) == [
        "ann@example.com",
        "boss@example.com",
    ]


def test_the_admin_names_recipients_and_a_tag_key_no_report_could_use(
    showback: Showback, staff: Client
) -> None:
    """An address the report would skip, or a tag key no step can carry, is refused when the
    project is saved, naming the field, not accepted to send nothing (or all untagged)."""
    project = showback.agent.project
    page = f"/admin/costboard/project/{project.pk}/change/"
    refused = staff.post(
        page,
        project_admin_fields(
            project,
            report_recipients="Ann Smith <ann@example.com>, boss@example.com",
            alert_emails="ops@example,com",
            report_tag_key="Customer",
        ),
    )
    assert refused.status_code == 200
    errors = refused.context["adminform"].form.errors
    assert errors["report_recipients"] == [
        "Not an email address: “Ann”, “Smith”, “<ann@example.com>”. Write bare addresses "
        "(ann@example.com), one per line or comma-separated."
    ]
    assert errors["alert_emails"] == [
        "Not an email address: “ops@example”, “com”. Write bare addresses "
        "(ann@example.com), one per line or comma-separated."
    ]
    assert errors["report_tag_key"] == [
        "Not a tag key: up to 64 of a-z 0-9 _ . - as agents send tags (e.g. customer), or "
        "blank for no tag table."
    ]
    project.refresh_from_db()
    assert project.report_tag_key == "customer"  # unchanged
    saved = staff.post(
        page,
        project_admin_fields(
            project, report_recipients="ann@example.com;\nboss@example.com", report_tag_key="team"
        ),
    )
    assert saved.status_code == 302
    project.refresh_from_db()
    assert (project.report_recipients, project.report_tag_key) == (
        "ann@example.com;\nboss@example.com",
        "team",
    )
