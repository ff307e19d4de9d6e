"""What a showback report says (docs/reports.md): the email's subject, text and HTML (Django
templates under templates/reports/), its CSV attachment, the Slack message, and the link to
the same report at /reports/. Sending them is costboard/reports/services.py's."""

from __future__ import annotations

import csv
import io
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.template.loader import render_to_string
from django.urls import reverse

from costboard.exports import csv_cell, tag_csv_cell
from costboard.models import usd
from costboard.numbers import usd_text
from costboard.reports.selectors import COUNTS, Line, SpendReport
from costboard.slack_text import slack_escaped, slack_literal

CSV_HEADER = [
    "grouping",
    "name",
    "cost_usd",
    *COUNTS,
    "previous_cost_usd",
    "change_usd",
    "change_pct",
]


def usd_change(amount: Decimal) -> str:
    """+$1.20, -$0.30, $0.00."""
    return f"+{usd_text(amount)}" if amount > 0 else usd_text(amount)


def pct_change(pct: Decimal | None, *, new: bool = False) -> str:
    """+25.0 %, -4.1 %; "new" for spend with none the period before, "—" for none either."""
    if pct is None:
        return "new" if new else "—"
    return f"{'+' if pct > 0 else ''}{pct} %"


def report_query(report: SpendReport) -> str:
    """The query string that names this report at /reports/ (and its CSV)."""
    query = {
        "project": report.project.slug,
        "period": report.period.kind,
        "at": report.period.label,
    }
    if report.tag_key:
        query["tag"] = report.tag_key
    return urlencode(query)


def report_url(report: SpendReport) -> str:
    """The same report at /reports/: absolute with COSTBOARD_BASE_URL, else a path."""
    path = f"{reverse('reports')}?{report_query(report)}"
    base = str(getattr(settings, "COSTBOARD_BASE_URL", ""))
    return f"{base}{path}" if base else path


def report_subject(report: SpendReport) -> str:
    """Costboard spend, week 2026-W47: Acme $1,234.56 (+12.5 % vs previous). One line: a
    project's name may hold a line break, and a header with one is refused by the mail
    library (every attempt would fail)."""
    total = Decimal(report.total["cost_usd"])
    versus = pct_change(report.change_pct, new=bool(total))
    if versus == "new":
        versus = "none the period before"
    elif versus != "—":
        versus = f"{versus} vs previous"
    else:
        versus = "none either period"
    title = report.period.title
    name = " ".join(report.project.name.splitlines())
    return f"Costboard spend, {title}: {name} {usd_text(total)} ({versus})"


def _context(report: SpendReport) -> dict[str, Any]:
    return {"report": report, "url": report_url(report), "subject": report_subject(report)}


def report_text(report: SpendReport) -> str:
    """The report as plain text: the email's text part and what the command prints."""
    return render_to_string("reports/spend_report.txt", _context(report))


def report_html(report: SpendReport) -> str:
    """The report as the email's HTML part; every name escaped (tag values are user data)."""
    return render_to_string("reports/spend_report_email.html", _context(report))


def _csv_row(grouping: str, line: Line) -> list[Any]:
    pct = line.change_pct
    return [
        grouping,
        # a tag's untagged row is named as the API's CSV names it; no user, no model: empty
        tag_csv_cell(line.name)
        if grouping.startswith("tag:")
        else csv_cell("" if line.name is None else line.name),
        usd(line.cost_usd),
        *(line.current[name] for name in COUNTS),
        usd(line.previous_cost_usd),
        usd(line.change_usd),  # a number, never quoted as a formula: "-0.30"
        "" if pct is None else str(pct),
    ]


def report_csv(report: SpendReport) -> str:
    """Every table's lines, a `grouping` column first (tag:<key>, user, model); the sums are
    the API's for the period, the previous cost and the change beside them."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_HEADER)
    for table in report.tables:
        for line in table.lines:
            writer.writerow(_csv_row(table.grouping, line))
    return out.getvalue()


def report_csv_name(report: SpendReport) -> str:
    return f"spend-{report.project.slug}-{report.period.label}.csv"


def report_slack(report: SpendReport) -> dict[str, Any]:
    """The Slack message: the total against the period before, each table's top movers, and
    a link to the report. Names show as written (costboard/slack_text.py): tag values and
    users are what agents sent, a project's name what an admin typed."""
    total = Decimal(report.total["cost_usd"])
    lines = [
        f"*{slack_literal(report_subject(report))}*",
        f"Total {usd_text(total)}, previous {usd_text(Decimal(report.previous_total['cost_usd']))}"
        f" ({usd_change(report.change_usd)}, {pct_change(report.change_pct, new=bool(total))})",
    ]
    for table in report.tables:
        if not table.movers:
            continue
        movers = ", ".join(
            f"{slack_literal(line.label)} {usd_change(line.change_usd)}" for line in table.movers
        )
        lines.append(f"{slack_literal(table.title)}, top movers: {movers}")
    url = report_url(report)
    # a path is no link in Slack: COSTBOARD_BASE_URL makes it one
    lines.append(
        f"<{url}|Open the report>" if "://" in url else f"The report: {slack_escaped(url)}"
    )
    return {"text": "\n".join(lines)}
