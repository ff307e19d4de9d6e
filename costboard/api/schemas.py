"""Pydantic models of the cost API's answers (docs/api.md, "Events"): what the OpenAPI document
shows and the contract test checks real responses against.

A session's budget is the one type the budgets build (`costboard.budgets.caps.SessionBudget`,
a TypedDict): the document shows it as the code writes it.

Answers keep unknown keys (`extra="allow"`): a field added on the server side reaches the
client even before its model names it, and the document never forbids it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from costboard.budgets.caps import SessionBudget
from costboard.json_types import Count, IsoTime, Money

# the path parameter of a session's endpoints (their routes take any text, `/` included)
SESSION_ID = "the session_id your events use, percent-encoded (`/` as %2F, or as it is)"


class Answer(BaseModel):
    """A response body."""

    model_config = ConfigDict(extra="allow", json_schema_serialization_defaults_required=True)


class ErrorItem(Answer):
    index: int | None = Field(description="the event's place in the batch; null: the request")
    field: str | None = Field(description="the field, parameter or header to fix")
    message: str = Field(description="what is wrong and what to send instead")


class Errors(Answer):
    """Every refusal: 400 malformed, 401 key, 404 unknown, 405 method, 411 chunked body the
    server cannot read, 413 body too large, 414 query string too long, 415 content type,
    422 invalid, 503 database unavailable (with Retry-After)."""

    errors: list[ErrorItem] = Field(min_length=1)


class BudgetEvent(Answer):
    kind: str = Field(
        description="soft_warned, exhausted, runaway, cap_changed, threshold (a period "
        'budget\'s warn fraction: detail "threshold"), forecast, …'
    )
    at: IsoTime
    tokens_used: Count = Field(description="the session's tokens then")
    cost_usd: Money = Field(description="the session's cost then")
    detail: dict[str, Any] = Field(description="a runaway's rule and evidence; a cap change")


class SessionBudgetDetail(SessionBudget):  # GET /api/v1/sessions/<id>/budget
    events: Annotated[list[BudgetEvent], Field(description="oldest first")]


# The detail answer is a TypedDict: a pydantic model could not extend SessionBudget's fields.
SESSION_BUDGET_DETAIL = TypeAdapter(SessionBudgetDetail)


# --- period budgets (docs/api.md, "Period budgets") --------------------------------------------


class PeriodBudgetAnswer(Answer):
    """`<period budget>`: a budget in its current period (or the one a batch touched)."""

    id: int
    name: str
    scope: Literal["project", "user", "api_key", "tag"]
    scope_value: str | None = Field(
        description='the user_id, key prefix or key=value; "*" (a tag\'s "key=*"): each user, '
        "key or tag value on its own (a per-member budget)"
    )
    member: str | None = Field(
        description="a per-member budget's member this entry was decided for (the user_id, "
        "key prefix or tag value); null for other budgets, and for a per-member budget read "
        "as a whole"
    )
    period: Literal["day", "week", "month", "total", "rolling"]
    window_hours: int | None = Field(
        ge=1, le=720, description="a rolling budget's window in hours; null for the others"
    )
    timezone: str = Field(description="where days, weeks and months begin")
    period_start: IsoTime = Field(
        description="the period's start; a rolling budget's window's: the hour the answer was "
        "made in and the window_hours − 1 before it (UTC)"
    )
    period_end: IsoTime | None = Field(
        description="exclusive; null for a total budget; a rolling window's: the end of the "
        "current hour"
    )
    state: Literal["ok", "warning", "exhausted"] = Field(
        description="a per-member budget read as a whole (member null): its worst member's "
        "(ok < warning < exhausted)"
    )
    tokens_used: Count = Field(
        description="input + output tokens in the period; a per-member budget read as a "
        "whole: all its members' summed"
    )
    token_limit: int | None
    cost_usd: Money = Field(
        description="USD in the period; a per-member budget read as a whole: all its "
        "members' summed"
    )
    cost_limit_usd: Money | None = Field(
        description="a per-member budget's: each member's (token_limit too)"
    )
    warn_at: list[float] = Field(
        description="the fractions of a limit that warn, ascending: a threshold event each"
    )
    warn_at_pct: float = Field(ge=0, le=1, description="the first of warn_at (the older name)")
    threshold_crossed: float | None = Field(
        description="the highest of warn_at the period's totals (a rolling budget: its "
        "window's; a per-member budget read as a whole: any member's) have reached; null "
        "below the first"
    )
    action: Literal["warn", "stop"] = Field(
        description="stop: the sessions it covers report exhausted, stopped_by budget:<id>"
    )
    channels: list[Literal["webhook", "email", "slack", "pagerduty"]] | None = Field(
        description="where its alerts go; null: the project's default channels"
    )
    warned_at: IsoTime | None = Field(
        description="when the period passed the first warn fraction; a per-member budget read "
        "as a whole: the first of its members' (still true, for a rolling budget)"
    )
    exhausted_at: IsoTime | None = Field(
        description="when the period reached a limit; a per-member budget read as a whole: "
        "the first of its members' (still true, for a rolling budget)"
    )
    forecast_cost_usd: Money | None = Field(
        description="the period's cost at its end at its recent daily rate (the mean of up "
        "to 7 recent days); null for total and rolling budgets, and for a per-member budget "
        "read as a whole (each member's forecast is its own)"
    )
    forecast_range_usd: list[Money] | None = Field(
        description="[low, high]: the period's end cost at the recent days' lowest and "
        "highest daily rates"
    )
    forecast_daily_usd: Money | None = Field(description="the recent daily rate")
    crossing_date: str | None = Field(
        description="the day (in the budget's timezone) the USD limit is crossed at that "
        "rate, if within the period; the day it was crossed once it is",
        json_schema_extra={"format": "date"},
    )


class PeriodBudgetList(Answer):
    budgets: list[PeriodBudgetAnswer] = Field(description="by name")


class PeriodBudgetEvent(BudgetEvent):
    period_start: IsoTime = Field(description="the period it happened in")
    member: str | None = Field(
        description="the member it happened to, for a per-member budget; else null"
    )


class PeriodBudgetMember(Answer):
    """A per-member budget's member in the current period."""

    member: str = Field(description="the user_id, key prefix or tag value")
    state: Literal["ok", "warning", "exhausted"]
    tokens_used: Count
    cost_usd: Money
    used: float = Field(
        ge=0, description="the larger of tokens_used/token_limit and cost_usd/cost_limit_usd"
    )


class PeriodBudgetDetail(PeriodBudgetAnswer):
    events: list[PeriodBudgetEvent] = Field(
        description="soft_warned, exhausted and one threshold per warn fraction, once per "
        "period (and member; a rolling budget: per episode) each, oldest first; tokens_used "
        "and cost_usd are the period's then"
    )
    members: list[PeriodBudgetMember] | None = Field(
        description="a per-member budget's members nearest their limits in the current "
        "period, nearest first (at most 10); null for other budgets"
    )


class EventsResponse(Answer):
    accepted: Count = Field(description="events stored")
    duplicates: Count = Field(description="replays of an event_id already stored: no change")
    sessions: dict[str, SessionBudget] = Field(
        description="every session the batch touched, by session_id"
    )
    budgets: dict[str, PeriodBudgetAnswer] = Field(
        description="every period budget the batch's steps counted toward, by id, in the "
        "period they counted in; a per-member budget the batch counted toward for several "
        'members, once per member, by "<id>:<member>"'
    )
    # optional in the document: present only in the minimal answer
    model_config = ConfigDict(json_schema_serialization_defaults_required=False)

    sessions_ok: Count = Field(
        default=0,
        description="with Prefer: return=minimal only: the touched sessions that are ok, "
        "left out of `sessions`",
    )


# --- OTLP (documented; the view speaks protobuf's own JSON mapping) --------------------------


class PartialSuccess(Answer):  # OTLP JSON's own camelCase names, here and below
    rejectedSpans: str | None = Field(
        default=None, description="spans not stored (an int64, as OTLP JSON writes it)"
    )
    errorMessage: str | None = Field(default=None)


class ExportTraceServiceResponse(Answer):
    """OTLP's answer; partialSuccess only when spans were rejected."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=False)

    partialSuccess: PartialSuccess | None = None


class RpcStatus(Answer):
    """google.rpc.Status: OTLP/HTTP's error body (400, 413), in the request's format; in JSON
    with the API's `errors` too."""

    code: int
    message: str
    errors: list[ErrorItem] = Field(min_length=1)
