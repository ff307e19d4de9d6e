"""Context loading (CONTRACT §3, `GET /api/v1/sessions/<id>/context?budget=N`): the most recent
turns of a session that fit in a token budget, as the token-aware loader seed does it.

The newest turn is taken first, then the one before it, and so on while the running total
stays within the budget; the first turn that does not fit ends the loading, so the loaded
turns are always a contiguous most-recent stretch of the conversation. They are returned
oldest first, ready to be put in a prompt.

A turn's `tokens` is the size of its text as it would be loaded: its user message plus its
assistant response, each counted on its own.

- The user message is always estimated: no stored usage measures it alone (a step's
  `input_tokens` is the whole prompt: system prompt, history and the message together).
- The assistant response uses stored usage when the turn has exactly one successful step of
  type `response` with `output_tokens − reasoning_tokens` > 0: the tokens the model wrote,
  without its reasoning. With no such step, or several (which one produced the stored text is
  unknown), it is estimated. Where a provider does not report reasoning apart (Anthropic
  extended thinking), or the response carried tool calls, the stored count is larger than the
  text: it errs on the side of loading less.
- An empty text counts 0, exactly, whatever the steps say: there is nothing to load.

The estimate is ceil(characters / 4), characters being Unicode code points (not bytes), the
seed's offline fallback. No real tokenizer is used: the only one found working offline from
PyPI is tiktoken with the encoding files bundled inside litellm (a 41 MB package pulling in
boto3, openai, aiohttp and more), and it is OpenAI's tokenizer, itself an estimate for other
providers' models.

A turn is `estimated: true` when any of its non-empty text was estimated.

`should_summarize` is true when the session's history is past 80% of the budget: the loaded
`token_count` > 0.8 × budget, or turns were left out (then the history is larger than the
budget, since the first turn left out did not fit). It is the seed's `shouldSummarize` (the
whole conversation against the limit), found without reading the turns left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, TypedDict, cast

from django.db.models import Count, F, OuterRef, Subquery, Sum
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
from costboard.api.schemas import Answer, IsoTime
from costboard.api.schemas import Count as NonNegative
from costboard.models import Session, Step, Turn

MAX_CONTEXT_BUDGET = 10_000_000
# CONTRACT §3: should_summarize is "true past 80% of the budget".
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
    """ceil(characters / 4): the seed's offline estimate, in code points, not bytes."""
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


def _turns_newest_first(session_pk: int) -> Iterator[_TurnRow]:
    """The session's turns, newest first, with only the fields loading needs."""
    size = FIRST_CHUNK
    before: int | None = None
    while True:
        turns = Turn.objects.filter(session_id=session_pk)
        if before is not None:
            turns = turns.filter(number__lt=before)
        chunk = list(
            turns.order_by("-number")
            .annotate(stored_response_tokens=_stored_response_tokens())
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


def _context_turn(row: _TurnRow) -> LoadedTurn:
    user_message, response = row["user_message"], row["assistant_response"]
    stored = row["stored_response_tokens"]
    if response and stored is not None and stored > 0:
        response_tokens, response_estimated = stored, False
    else:
        response_tokens, response_estimated = estimate_tokens(response), bool(response)
    estimated = bool(user_message) or response_estimated
    return {
        "number": row["number"],
        "user_message": user_message,
        "assistant_response": response,
        "tokens": estimate_tokens(user_message) + response_tokens,
        "estimated": estimated,
        "started_at": row["started_at"].isoformat(),
    }


def session_context(*, session: Session, total_turns: int, budget: int) -> LoadedContext:
    """The newest turns of `session` that fit in `budget` tokens, oldest first."""
    loaded: list[LoadedTurn] = []
    token_count = 0
    for row in _turns_newest_first(session.pk):
        turn = _context_turn(row)
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
        description="user message + assistant response as loaded: the message is "
        "ceil(characters / 4); the response is the output − reasoning tokens of the turn's one "
        "successful `response` step if it has one, else ceil(characters / 4)"
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
    turns: list[ContextTurn] = Field(description="the newest turns that fit, oldest first")


SESSION_CONTEXT = Operation(
    method="GET",
    summary="The session's newest turns that fit in a token budget, oldest first",
    query=ContextQuery,
    path_parameters={"session_id": "the session_id your events use"},
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
        .annotate(total_turns=Count("turns"))
        .only("pk", "external_id")
        .first()
    )
    if session is None:
        raise ApiError(404, "session_id", f"no session {session_id!r} in project {project.slug}")
    context = session_context(session=session, total_turns=session.total_turns, budget=budget)
    return model_response(SessionContext.model_validate(context))
