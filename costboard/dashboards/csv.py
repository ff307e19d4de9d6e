"""The CSV downloads: which columns the sessions and users exports have and how their rows
are written, apart from the views that check the filters. Text cells go through
costboard/exports.py's csv_cell, so a spreadsheet never runs one as a formula (docs/pages.md);
the sessions export streams, its rows read as tuples and sent in chunks."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator

from django.db.models import QuerySet

from costboard.budgets.caps import caps_for, stop_verdict
from costboard.dashboards.selectors.users import UserSpend
from costboard.exports import csv_cell
from costboard.models import SYSTEM_SESSION_ID, PeriodBudget, Project, Session, usd

CSV_COLUMNS = [
    "project",
    "session_id",
    "user_id",
    "state",
    "runaway",
    "tokens_used",
    "token_cap",
    "cost_usd",
    "cost_cap_usd",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "turns",
    "steps",
    "errors",
    "started_at",
    "last_active_at",
    "ended_at",
    "stopped_by",
    "stopped_by_budget",
]


# Read as tuples, not Session instances: building models (and decoding their JSON metadata)
# was half the time of a large export.
CSV_FIELDS = (
    "project_id",
    "external_id",
    "user_id",
    "state",
    "runaway_at",
    "input_tokens",
    "output_tokens",
    "token_cap",
    "cost_usd",
    "cost_cap_usd",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "turn_count",
    "step_count",
    "error_count",
    "started_at",
    "last_active_at",
    "ended_at",
    "held_by_budget",
)
CSV_CHUNK_ROWS = 500  # rows per chunk sent: one chunk per row costs more than the rows


def sessions_csv_chunks(
    sessions: QuerySet[Session], projects: dict[int, Project], stops: dict[int, PeriodBudget]
) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    rows = sessions.values_list(*CSV_FIELDS).iterator(chunk_size=2000)
    for count, row in enumerate(rows, start=1):
        (
            project_id,
            external_id,
            user_id,
            state,
            runaway_at,
            input_tokens,
            output_tokens,
            token_cap,
            cost_usd,
            cost_cap_usd,
            cache_read,
            cache_write,
            turns,
            steps,
            errors,
            started_at,
            last_active_at,
            ended_at,
            held_by_budget,
        ) = row
        project = projects[project_id]
        caps = caps_for(
            project=project,
            token_cap=token_cap,
            cost_cap_usd=cost_cap_usd,
            system=external_id == SYSTEM_SESSION_ID,
        )
        state, stopped_by = stop_verdict(
            state=state,
            runaway=runaway_at is not None,
            tokens_used=input_tokens + output_tokens,
            cost_usd=cost_usd,
            caps=caps,
            stopped_by_budget=held_by_budget,
        )
        holding = stops.get(held_by_budget) if stopped_by == f"budget:{held_by_budget}" else None
        writer.writerow(
            [
                csv_cell(project.slug),  # a slug may start with "-"
                csv_cell(external_id),
                csv_cell(user_id),
                state,
                runaway_at is not None,
                input_tokens + output_tokens,
                caps.token_cap,
                usd(cost_usd),
                usd(caps.cost_cap_usd),
                input_tokens,
                output_tokens,
                cache_read,
                cache_write,
                turns,
                steps,
                errors,
                started_at.isoformat(),
                last_active_at.isoformat(),
                ended_at.isoformat() if ended_at else "",
                stopped_by or "",
                csv_cell(holding.name) if holding is not None else "",
            ]
        )
        if count % CSV_CHUNK_ROWS == 0:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue()


USER_CSV_COLUMNS = ["user_id", "cost_usd", "input_tokens", "output_tokens", "sessions", "steps"]


def users_csv_text(rows: list[UserSpend]) -> str:
    """/users/'s rows (users_spend) as one CSV text: a page of users, not a stream."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(USER_CSV_COLUMNS)
    for r in rows:
        writer.writerow(
            [
                csv_cell(r.user_id),
                usd(r.cost_usd),
                r.input_tokens,
                r.output_tokens,
                r.sessions,
                r.steps,
            ]
        )
    return buffer.getvalue()
