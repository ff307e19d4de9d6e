"""`GET /api/v1/spend` (docs/api.md, "Spend"; keys with the `read` or `admin` role): spend grouped
by day, model (its family, as the pages show it), step type, end user or one tag key, between two
UTC days, as JSON or CSV. The sums are costboard/reports/spend.py's, from the daily rollups
only (the showback report reads the same): `total` is the window's whole spend whatever the
grouping, and grouped by a tag the steps without it are a row whose tag is null."""

from __future__ import annotations

import csv
import io
import re
from datetime import date, timedelta
from typing import Annotated, Any, cast

from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from costboard.api.boundary import (
    ApiError,
    ApiRequest,
    Operation,
    Reply,
    endpoint,
    model_response,
    parse_query,
)
from costboard.api.schemas import Answer
from costboard.exports import csv_cell, tag_csv_cell
from costboard.input_limits import FIRST_YEAR, LAST_YEAR
from costboard.json_types import Count as CountField
from costboard.json_types import Money
from costboard.models import usd
from costboard.replicas import replica_reads
from costboard.reports.spend import PLAIN, SUMS, spend_rows, spend_total
from costboard.tag_values import TAG_KEY

READERS = ("read", "admin")
DEFAULT_DAYS = 30
MAX_DAYS = 3660


FIRST_DAY, LAST_DAY = date(FIRST_YEAR, 1, 1), date(LAST_YEAR, 12, 31)
DAY_FORMS = (
    f"a date written YYYY-MM-DD (a UTC day) from {FIRST_DAY} to {LAST_DAY}, the years the "
    "data can have, e.g. 2026-11-01"
)
_ISO_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def _iso_day(value: Any) -> date:
    """A day written YYYY-MM-DD within the data's years, nothing else: pydantic alone would
    read `0` or `1700000000` as a Unix time (until=0 as 1970-01-01) and `2026-11-01T00:00`
    as a day."""
    if not isinstance(value, str) or not _ISO_DAY.fullmatch(value):
        raise PydanticCustomError("iso_day", f"{str(value)[:40]!r} is not {DAY_FORMS}")
    try:
        day = date.fromisoformat(value)
    except ValueError:  # the shape of a day, not a day of the calendar (2026-02-30)
        raise PydanticCustomError(
            "iso_day", f"{value!r} is no such date: send {DAY_FORMS}"
        ) from None
    if not FIRST_DAY <= day <= LAST_DAY:
        # no step is outside them, and a default counted back from year 1 would overflow
        raise PydanticCustomError(
            "iso_day", f"{value} is outside the years {FIRST_YEAR}–{LAST_YEAR}: send {DAY_FORMS}"
        )
    return day


IsoDay = Annotated[
    date,
    PlainValidator(_iso_day),
    WithJsonSchema({"type": "string", "format": "date", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}),
]


class SpendQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group_by: str = Field(
        default="day",
        description="comma-separated: day, model, step_type, user, tag:<key>. user and a "
        "tag each go with day alone",
    )
    since: IsoDay | None = Field(
        default=None,
        description=f"the first UTC day (30 days before until): YYYY-MM-DD, {FIRST_DAY} to "
        f"{LAST_DAY}",
    )
    until: IsoDay | None = Field(
        default=None,
        description=f"the last UTC day, included (today): YYYY-MM-DD, {FIRST_DAY} to {LAST_DAY}",
    )


class SpendTotals(Answer):
    cost_usd: Money
    input_tokens: CountField
    output_tokens: CountField
    cache_read_input_tokens: CountField
    cache_creation_input_tokens: CountField
    steps: CountField


class SpendRow(SpendTotals):
    """The group_by fields (day, model, step_type, user, tag:<key>; the tag null for the
    steps without it), then the sums."""


class SpendAnswer(Answer):
    group_by: list[str]
    since: str
    until: str
    rows: Annotated[list[SpendRow], Field(description="by the group_by fields")]
    total: SpendTotals


SPEND = Operation(
    method="GET",
    summary="Spend grouped by day, model, step type, user or a tag, as JSON or CSV",
    description="Read from the daily rollups. `Accept: text/csv` answers CSV, a header row "
    "first. `total` is the window's whole spend whatever the grouping (the overview's figure "
    "for the same days): grouped by `tag:<key>`, the steps without that tag are a row whose "
    "tag is null (an empty cell in CSV).",
    roles=READERS,
    query=SpendQuery,
    responses={
        200: Reply(
            "the rows and their total",
            SpendAnswer,
            alternatives={"text/csv": {"schema": {"type": "string"}}},
        ),
    },
)


def _groups(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ApiError(
            422, "group_by", "name at least one of day, model, step_type, user, tag:<key>"
        )
    seen: list[str] = []
    for name in names:
        if name not in PLAIN and not (name.startswith("tag:") and len(name) > 4):
            raise ApiError(
                422,
                "group_by",
                f"{name[:40]!r} is not a group: use day, model, step_type, user or tag:<key> "
                '(e.g. "day,model" or "tag:feature")',
            )
        if name.startswith("tag:") and not TAG_KEY.fullmatch(name[4:]):
            raise ApiError(
                422,
                "group_by",
                f"{name[4:44]!r} is not a tag key: up to 64 of a-z 0-9 _ . -, as events' "
                "tags have them (e.g. tag:customer)",
            )
        if name in seen:
            raise ApiError(422, "group_by", f"{name!r} is named twice")
        seen.append(name)
    special = [n for n in seen if n == "user" or n.startswith("tag:")]
    if special and len([n for n in seen if n != "day"]) > 1:
        raise ApiError(
            422,
            "group_by",
            f"{special[0]} goes with day alone (the rollup it reads has no model or step "
            f"type, nor another user or tag): e.g. group_by=day,{special[0]}",
        )
    return seen


def day_window(
    since: date | None, until: date | None, *, max_days: int = MAX_DAYS
) -> tuple[date, date]:
    """The days a windowed read asks for (spend, reconciliation): until today and the 30
    days before, unless given; refused (422 naming `since`) when since is after until or the
    window is longer than `max_days`. Each day given is within FIRST_DAY..LAST_DAY (IsoDay),
    and so is the default since."""
    today = timezone.now().date()
    until = until or today
    since = since or max(FIRST_DAY, until - timedelta(days=DEFAULT_DAYS - 1))
    if since > until:
        raise ApiError(422, "since", f"{since} is after until ({until}): swap them")
    if (until - since).days >= max_days:
        raise ApiError(422, "since", f"at most {max_days} days at once: narrow since..until")
    return since, until


@endpoint(SPEND)
@replica_reads
def spend(request: HttpRequest) -> HttpResponse:
    project = cast(ApiRequest, request).project
    asked = parse_query(request, SpendQuery)
    names = _groups(asked.group_by)
    since, until = day_window(asked.since, asked.until)
    rows = spend_rows(project_id=project.pk, names=names, since=since, until=until)
    total = spend_total(rows)
    for row in rows:
        row["cost_usd"] = usd(row["cost_usd"])
    total["cost_usd"] = usd(total["cost_usd"])
    if "text/csv" in request.META.get("HTTP_ACCEPT", ""):
        return _csv(names, rows, since, until)
    return model_response(
        SpendAnswer(
            group_by=names,
            since=since.isoformat(),
            until=until.isoformat(),
            rows=[SpendRow(**row) for row in rows],
            total=SpendTotals(**total),
        )
    )


def _csv(names: list[str], rows: list[dict[str, Any]], since: date, until: date) -> HttpResponse:
    out = io.StringIO()
    writer = csv.writer(out)
    header = [*names, *SUMS, "steps"]
    writer.writerow(header)
    for row in rows:
        writer.writerow(
            [
                tag_csv_cell(row[name]) if name.startswith("tag:") else csv_cell(row[name])
                for name in header
            ]
        )
    response = HttpResponse(out.getvalue(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="spend-{since}-{until}.csv"'
    return response
