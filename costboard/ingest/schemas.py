"""The events of CONTRACT §3, validated whole before anything is stored.

`parse_events(body)` returns the validated events or every error found, each naming the
event's index, the field and what to send instead.
"""

from __future__ import annotations

import difflib
import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any, Literal, cast

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
)

from costboard.ingest.normalize import Tokens, UsageError, normalize_usage

MAX_EVENTS = 1000
MAX_BODY_BYTES = 5 * 1024 * 1024
MAX_TOKENS = 10**12

TokenCount = Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]
ExternalId = Annotated[str, Field(min_length=1, max_length=128)]
# A JSON number: an int, or a Decimal (json.loads parses fractions as Decimal); never a
# string or a bool. Strict types, so no Python validator runs per event.
Milliseconds = (
    Annotated[StrictInt, Field(ge=0, le=10**10)]
    | Annotated[Decimal, Strict(), Field(ge=0, le=10**10)]
)


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, frozen=True)

    event_id: ExternalId | None = None
    # ISO 8601; without an offset it is UTC (see `at`: done there, not in a validator, as a
    # Python validator per event costs more than the rest of its validation).
    timestamp: datetime | None = None

    def at(self, now: datetime) -> datetime:
        """When the event happened: its timestamp, aware (UTC if it had no offset), else now."""
        ts = self.timestamp
        if ts is None:
            return now
        return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


class SessionEvent(_Event):
    type: Literal["session"]
    session_id: ExternalId
    user_id: Annotated[str, Field(max_length=128)] | None = None
    parent_session_id: ExternalId | None = None
    token_cap: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] | None = None
    cost_cap_usd: Annotated[Decimal, Field(ge=0, max_digits=14, decimal_places=4)] | None = None
    ended: StrictBool | None = None
    metadata: dict[str, Any] | None = None

    @field_validator("cost_cap_usd", mode="before")
    @classmethod
    def _money(cls, value: Any) -> Any:
        # A string "5.00" or a JSON number (parsed exactly as Decimal); never a float.
        if isinstance(value, bool):
            raise ValueError('must be a decimal amount in USD, e.g. "5.00"')
        if isinstance(value, int | float):
            return Decimal(str(value))
        return value


class TurnEvent(_Event):
    type: Literal["turn"]
    session_id: ExternalId
    turn: Annotated[StrictInt, Field(ge=1)]
    user_message: Annotated[str, Field(max_length=1_000_000)] | None = None
    assistant_response: Annotated[str, Field(max_length=1_000_000)] | None = None
    context: dict[str, Any] | None = None


class StepEvent(_Event):
    type: Literal["step"] = "step"
    step_type: Annotated[str, Field(min_length=1, max_length=64)]
    model: Annotated[str, Field(min_length=1, max_length=200)]
    session_id: ExternalId | None = None
    turn: Annotated[StrictInt, Field(ge=1)] | None = None
    provider: Annotated[str, Field(max_length=64)] | None = None
    input_tokens: TokenCount | None = None
    output_tokens: TokenCount | None = None
    cache_read_input_tokens: TokenCount | None = None
    cache_creation_input_tokens: TokenCount | None = None
    reasoning_tokens: TokenCount | None = None
    duration_ms: Milliseconds | None = None
    success: StrictBool = True
    error: Annotated[str, Field(max_length=20_000)] | None = None
    usage: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None

    def tokens(self) -> Tokens:
        """Token counts: the raw usage normalized, each explicit field taking precedence."""
        if self.usage is None:  # the common case, without the merge
            return Tokens(
                input_tokens=self.input_tokens or 0,
                output_tokens=self.output_tokens or 0,
                cache_read_input_tokens=self.cache_read_input_tokens or 0,
                cache_creation_input_tokens=self.cache_creation_input_tokens or 0,
                reasoning_tokens=self.reasoning_tokens or 0,
            )
        base = normalize_usage(self.usage)
        creation = _pick(self.cache_creation_input_tokens, base.cache_creation_input_tokens)
        return Tokens(
            input_tokens=_pick(self.input_tokens, base.input_tokens),
            output_tokens=_pick(self.output_tokens, base.output_tokens),
            cache_read_input_tokens=_pick(
                self.cache_read_input_tokens, base.cache_read_input_tokens
            ),
            cache_creation_input_tokens=creation,
            cache_creation_1h_input_tokens=min(base.cache_creation_1h_input_tokens, creation),
            reasoning_tokens=_pick(self.reasoning_tokens, base.reasoning_tokens),
        )


def _pick(explicit: int | None, derived: int) -> int:
    return derived if explicit is None else explicit


Event = SessionEvent | TurnEvent | StepEvent
_MODELS: dict[str, type[_Event]] = {
    "session": SessionEvent,
    "turn": TurnEvent,
    "step": StepEvent,
}


class BatchError(Exception):
    """The request as a whole is wrong (not one event): status and errors for the response,
    and how many events the refused batch held (None when the body could not tell)."""

    def __init__(
        self, status: int, errors: list[dict[str, Any]], *, event_count: int | None = None
    ) -> None:
        super().__init__(errors[0]["message"] if errors else "")
        self.status = status
        self.errors = errors
        self.event_count = event_count


def _error(index: int | None, field: str, message: str) -> dict[str, Any]:
    return {"index": index, "field": field, "message": message}


def _friendly(model: type[_Event], err: Any) -> tuple[str, str]:
    loc = [str(part) for part in err["loc"]]
    if loc and loc[0] == "duration_ms":  # both members of its union failed: one message
        value = err.get("input")
        return "duration_ms", f"must be a number of milliseconds from 0 to 10^10, got {value!r}"
    field = ".".join(loc) or "event"
    kind = err["type"]
    if kind == "extra_forbidden":
        known = [name for name in model.model_fields if name != "type"]
        close = difflib.get_close_matches(loc[-1], known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known fields: {', '.join(known)}"
        return field, f"unknown field{hint}"
    if kind == "missing":
        return field, f"{field} is required for a {model.__name__.removesuffix('Event').lower()}"
    if kind in {"int_type", "int_parsing", "int_from_float"}:
        return field, f"must be a whole number (JSON integer), got {err.get('input')!r}"
    if kind == "bool_type":
        return field, f"must be true or false, got {err.get('input')!r}"
    if kind in {"datetime_parsing", "datetime_type", "datetime_from_date_parsing"}:
        return field, "must be an ISO 8601 time, e.g. 2026-11-22T10:15:00Z"
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    return field, message


def validate_event(index: int, raw: Any) -> tuple[Event | None, list[dict[str, Any]]]:
    if not isinstance(raw, dict):
        return None, [_error(index, "event", "each event must be a JSON object")]
    kind = raw.get("type", "step")
    model = _MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        return None, [
            _error(index, "type", f"unknown event type {kind!r}; use session, turn or step")
        ]
    try:
        event = cast(Event, model.model_validate(raw))
    except ValidationError as exc:
        errors: list[dict[str, Any]] = []
        for err in exc.errors(include_url=False):
            field, message = _friendly(model, err)
            if not any(e["field"] == field and e["message"] == message for e in errors):
                errors.append(_error(index, field, message))
        return None, errors
    if isinstance(event, StepEvent) and event.usage is not None:
        try:
            event.tokens()
        except UsageError as exc:
            return None, [_error(index, exc.field, str(exc))]
    return event, []


def parse_events(body: bytes) -> list[Event]:
    """The events of a request body, all valid, or BatchError (400, 413 or 422)."""
    if len(body) > MAX_BODY_BYTES:
        raise BatchError(
            413,
            [
                _error(
                    None,
                    "body",
                    f"body is {len(body)} bytes; at most {MAX_BODY_BYTES} (5 MB): split the batch",
                )
            ],
        )
    try:
        payload = json.loads(body, parse_float=Decimal)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BatchError(400, [_error(None, "body", f"malformed JSON: {exc}")]) from None

    if isinstance(payload, dict) and "events" in payload:
        extra = sorted(set(payload) - {"events"})
        if extra:
            raise BatchError(422, [_error(None, extra[0], 'a batch holds only "events": [ … ]')])
        raw_events = payload["events"]
        if not isinstance(raw_events, list):
            raise BatchError(422, [_error(None, "events", "events must be a JSON array")])
    elif isinstance(payload, list):
        raw_events = payload
    elif isinstance(payload, dict):
        raw_events = [payload]
    else:
        raise BatchError(422, [_error(None, "body", 'send one event object or {"events": [ … ]}')])
    if not 1 <= len(raw_events) <= MAX_EVENTS:
        raise BatchError(
            422,
            [
                _error(
                    None, "events", f"a batch holds 1 to {MAX_EVENTS} events, got {len(raw_events)}"
                )
            ],
            event_count=len(raw_events),
        )

    events: list[Event] = []
    errors: list[dict[str, Any]] = []
    for index, raw in enumerate(raw_events):
        event, event_errors = validate_event(index, raw)
        if event_errors:
            errors.extend(event_errors)
        elif event is not None:
            events.append(event)
    if errors:
        raise BatchError(422, errors, event_count=len(raw_events))
    return events


def event_json_schemas() -> dict[str, Any]:
    """JSON Schemas of the three event kinds, for the OpenAPI document."""
    return {
        name.capitalize() + "Event": model.model_json_schema(
            ref_template="#/components/schemas/{model}"
        )
        for name, model in _MODELS.items()
    }
