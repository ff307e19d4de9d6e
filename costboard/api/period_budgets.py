"""Period budgets through the API (docs/api.md, "Period budgets"), for `admin` keys:
`GET/POST /api/v1/budgets`, `GET/PATCH/DELETE /api/v1/budgets/<id>`."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from costboard.api.boundary import (
    ApiError,
    ApiRequest,
    Operation,
    Reply,
    endpoint,
    json_object,
    model_response,
    no_content,
    parse,
)
from costboard.api.schemas import (
    PeriodBudgetAnswer,
    PeriodBudgetDetail,
    PeriodBudgetEvent,
    PeriodBudgetList,
    PeriodBudgetMember,
)
from costboard.budgets.period_services import (
    BudgetFields,
    BudgetInputError,
    period_budget_create,
    period_budget_delete,
    period_budget_update,
)
from costboard.budgets.periods import (
    budget_days,
    budgets_whole,
    members_nearest_limit,
    per_member,
    period_budget_view,
)
from costboard.models import BudgetEvent, PeriodBudget, Project, usd

ADMIN = ("admin",)
MAX_BODY = 16 * 1024
MAX_ID = 2**63 - 1


def _budget_of(request: HttpRequest, budget_id: int) -> PeriodBudget:
    project = cast(ApiRequest, request).project
    budget = None
    if 1 <= budget_id <= MAX_ID:
        budget = PeriodBudget.objects.filter(project=project, pk=budget_id).first()
    if budget is None:
        raise ApiError(404, "budget_id", f"no budget {budget_id} in project {project.slug}")
    return budget


def _answers(budgets: list[PeriodBudget], now: datetime) -> list[dict[str, Any]]:
    """Each budget in its current period read as a whole, as the pages show it
    (`budgets_whole`: a per-member budget's members summed, its state the worst of theirs),
    with its forecast (its days read in one query)."""
    wholes = budgets_whole(budgets, now)
    days = budget_days(budgets, now)
    return [period_budget_view(b, wholes[b.pk], now=now, days=days[b.pk]) for b in budgets]


def _answer(budget: PeriodBudget, now: datetime | None = None) -> dict[str, Any]:
    return _answers([budget], now or timezone.now())[0]


def _refused(exc: BudgetInputError) -> ApiError:
    return ApiError(422, exc.field, exc.message)


ID = {"budget_id": "the budget's id"}
NOT_FOUND = Reply("no such budget in this key's project (field budget_id)")

LIST = Operation(
    method="GET",
    summary="The project's period budgets, each in its current period",
    roles=ADMIN,
    responses={200: Reply("by name", PeriodBudgetList)},
)
CREATE = Operation(
    method="POST",
    summary="Make a period budget",
    description="A budget over the project, an end user, an API key or a tag, in each day, "
    "week or month (in its timezone) or in total, held to a token and/or USD limit. Every "
    "step of its scope counts toward it, in the period its timestamp falls in.",
    roles=ADMIN,
    body=BudgetFields,
    responses={201: Reply("made: the budget in its current period", PeriodBudgetAnswer)},
)
READ = Operation(
    method="GET",
    summary="A period budget in its current period, with its events (every period's)",
    roles=ADMIN,
    path_parameters=ID,
    responses={200: Reply("the budget", PeriodBudgetDetail), 404: NOT_FOUND},
)
CHANGE = Operation(
    method="PATCH",
    summary="Change some of a period budget's fields",
    roles=ADMIN,
    body=BudgetFields,
    path_parameters=ID,
    responses={200: Reply("changed", PeriodBudgetAnswer), 404: NOT_FOUND},
)
DELETE = Operation(
    method="DELETE",
    summary="Delete a period budget and its ledgers",
    roles=ADMIN,
    path_parameters=ID,
    responses={204: Reply("deleted: no body", media_type=None), 404: NOT_FOUND},
)


@endpoint(LIST)
def budgets_list(request: HttpRequest) -> HttpResponse:
    project: Project = cast(ApiRequest, request).project
    budgets = list(PeriodBudget.objects.filter(project=project).order_by("name", "pk"))
    return model_response(
        PeriodBudgetList(
            budgets=[PeriodBudgetAnswer(**view) for view in _answers(budgets, timezone.now())]
        )
    )


@endpoint(CREATE)
def budget_create(request: HttpRequest) -> HttpResponse:
    project = cast(ApiRequest, request).project
    body = json_object(request, limit=MAX_BODY, example=BudgetFields.example())
    fields = parse(BudgetFields, body)
    try:
        budget = period_budget_create(project=project, fields=fields)
    except BudgetInputError as exc:
        raise _refused(exc) from None
    return model_response(PeriodBudgetAnswer(**_answer(budget)), status=201)


@endpoint(READ)
def budget_read(request: HttpRequest, budget_id: int) -> HttpResponse:
    budget = _budget_of(request, budget_id)
    now = timezone.now()  # one moment: the totals and the members agree
    events = (
        BudgetEvent.objects.filter(ledger__budget=budget)
        .select_related("ledger")
        .order_by("at", "id")
    )
    return model_response(
        PeriodBudgetDetail(
            **_answer(budget, now),
            events=[
                PeriodBudgetEvent(
                    **event.to_dict(),
                    period_start=event.ledger.period_start.isoformat(),
                    member=event.ledger.member or None,
                )
                for event in events
                if event.ledger is not None
            ],
            members=_members(budget, now),
        )
    )


def _members(budget: PeriodBudget, now: datetime) -> list[PeriodBudgetMember] | None:
    """A per-member budget's members nearest their limits at `now` (the budget's totals are
    all of its members' then); None for other budgets."""
    if not per_member(budget):
        return None
    return [
        PeriodBudgetMember.model_validate(
            {
                "member": standing.member,
                "state": standing.state,
                "tokens_used": standing.tokens_used,
                "cost_usd": usd(standing.cost_usd),
                "used": float(standing.fraction),
            }
        )
        for standing in members_nearest_limit(budget, now)
    ]


@endpoint(CHANGE)
def budget_change(request: HttpRequest, budget_id: int) -> HttpResponse:
    budget = _budget_of(request, budget_id)
    body = json_object(request, limit=MAX_BODY, example=BudgetFields.example())
    changes = parse(BudgetFields, body)
    try:
        budget = period_budget_update(budget, changes=changes)
    except BudgetInputError as exc:
        raise _refused(exc) from None
    return model_response(PeriodBudgetAnswer(**_answer(budget)))


@endpoint(DELETE)
def budget_delete(request: HttpRequest, budget_id: int) -> HttpResponse:
    period_budget_delete(_budget_of(request, budget_id))
    return no_content()
