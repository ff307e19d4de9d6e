"""`GET /api/v1/reconciliation` (docs/api.md, "Reconciliation"; keys with the `read` or `admin`
role, as the spend export): the key's project's estimated cost and input tokens beside what
its providers billed and reported, by UTC day, provider and model, as JSON or CSV. The rules
(how a step's provider is known, which billed rows count, how names match) are
costboard/billing/reconcile.py's, told in docs/billing.md, "Reconciliation"."""

from __future__ import annotations

import csv
import io
from datetime import date
from typing import Annotated, Any, cast

from django.http import HttpRequest, HttpResponse
from pydantic import BaseModel, ConfigDict, Field

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
from costboard.api.spend import FIRST_DAY, LAST_DAY, READERS, IsoDay, day_window
from costboard.billing.reconcile import GROUPS, Figures, Wanted, grouped, reconcile, total
from costboard.exports import csv_cell
from costboard.json_types import Count, Money
from costboard.models import usd
from costboard.replicas import replica_reads

MAX_DAYS = 366
FIGURES = (
    "estimated_cost_usd",
    "billed_cost_usd",
    "drift_usd",
    "drift_pct",
    "estimated_input_tokens",
    "billed_input_tokens",
    "uninstrumented",
    "steps_removed",
)
Percent = Annotated[
    str | None,
    Field(
        json_schema_extra={"pattern": r"^-?[0-9]+\.[0-9]{2}$"},
        description="drift ÷ billed × 100, two decimals; null when billed is 0",
    ),
]


class ReconciliationQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group_by: str = Field(
        default="day,provider,model",
        description="comma-separated, any of day, provider, model (each once)",
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


class ReconciliationTotal(Answer):
    estimated_cost_usd: Money = Field(description="Costboard's estimate: its steps' cost")
    billed_cost_usd: Money = Field(description="what the provider billed")
    drift_usd: Money = Field(description="billed − estimated")
    drift_pct: Percent
    estimated_input_tokens: Count
    billed_input_tokens: Count | None = Field(
        description="input tokens the provider reported (null: none reported)"
    )
    uninstrumented: bool = Field(
        description="billed or reported by the provider with no step of Costboard's"
    )
    steps_removed: bool = Field(
        description="some of the estimate's steps are no longer kept (retention): their part "
        "is the daily rollups' (as GET /api/v1/spend counts them), by the model's provider"
    )


class ReconciliationRow(ReconciliationTotal):
    """The group_by fields (day, provider, model; the model null for billed cost no model
    names), then the figures."""


class ReconciliationWhole(ReconciliationTotal):
    uninstrumented_cost_usd: Money = Field(
        description="of the billed cost, what no step of Costboard's matched"
    )


class ReconciliationAnswer(Answer):
    group_by: list[str]
    since: str
    until: str
    rows: Annotated[list[ReconciliationRow], Field(description="by the group_by fields")]
    total: ReconciliationWhole


RECONCILIATION = Operation(
    method="GET",
    summary="Estimated cost beside what the providers billed, by day, provider and model",
    description="Only the provider-days something was billed or reported for are rows (imported "
    "from the providers or sent to POST /api/v1/billing). A row with no step behind it is "
    "uninstrumented spend. Names match exactly first, then by model family "
    "(`gpt-4o-2024-08-06` is `gpt-4o`). `Accept: text/csv` answers CSV, a header row first.",
    roles=READERS,
    query=ReconciliationQuery,
    responses={
        200: Reply(
            "the rows and their total",
            ReconciliationAnswer,
            alternatives={"text/csv": {"schema": {"type": "string"}}},
        ),
    },
)


def _groups(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ApiError(422, "group_by", "name at least one of day, provider, model")
    for name in names:
        if name not in GROUPS:
            raise ApiError(
                422,
                "group_by",
                f"{name[:40]!r} is not a group: use day, provider or model (e.g. "
                '"day,provider,model" or "provider")',
            )
    if len(set(names)) != len(names):
        raise ApiError(422, "group_by", "a group is named twice: name each once")
    return names


def figures(made: Figures) -> dict[str, Any]:
    """The figures as the API writes them: USD and percent as decimal strings."""
    pct = made.drift_pct
    return {
        "estimated_cost_usd": usd(made.estimated_cost_usd),
        "billed_cost_usd": usd(made.billed_cost_usd),
        "drift_usd": usd(made.drift_usd),
        "drift_pct": None if pct is None else format(pct, "f"),
        "estimated_input_tokens": made.estimated_input_tokens,
        "billed_input_tokens": made.billed_input_tokens,
        "uninstrumented": made.uninstrumented,
        "steps_removed": made.estimated_from_rollups,
    }


@endpoint(RECONCILIATION)
@replica_reads
def reconciliation(request: HttpRequest) -> HttpResponse:
    project = cast(ApiRequest, request).project
    asked = parse_query(request, ReconciliationQuery)
    names = _groups(asked.group_by)
    since, until = day_window(asked.since, asked.until, max_days=MAX_DAYS)
    lines = reconcile(Wanted([project.pk], since, until))
    groups = grouped(lines, names)
    rows = [{**group.values, **figures(group)} for group in groups]
    whole = total(lines)
    if "text/csv" in request.META.get("HTTP_ACCEPT", ""):
        return _csv(names, rows, since, until)
    return model_response(
        ReconciliationAnswer(
            group_by=names,
            since=since.isoformat(),
            until=until.isoformat(),
            rows=[ReconciliationRow(**row) for row in rows],
            total=ReconciliationWhole(
                **figures(whole),
                uninstrumented_cost_usd=usd(whole.uninstrumented_cost_usd) or "0.00",
            ),
        )
    )


def _csv(names: list[str], rows: list[dict[str, Any]], since: date, until: date) -> HttpResponse:
    out = io.StringIO()
    writer = csv.writer(out)
    header = [*names, *FIGURES]
    writer.writerow(header)
    for row in rows:
        # the names are text a provider or an agent sent; the figures are numbers (a negative
        # drift is one, not a formula) and true/false
        cells = [csv_cell(row[n]) for n in names]
        cells += [str(row[n]).lower() if isinstance(row[n], bool) else row[n] for n in FIGURES]
        writer.writerow(cells)
    response = HttpResponse(out.getvalue(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="reconciliation-{since}-{until}.csv"'
    return response
