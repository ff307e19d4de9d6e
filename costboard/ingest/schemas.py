"""The events of docs/api.md ("Events"), validated whole before anything is stored.

`parse_events(body)` returns the validated events or every error found, each naming the
event's index, the field and what to send instead. The same models make the OpenAPI
document (costboard/api/openapi.py), so what it says is what this accepts.

Also here, for every JSON body of the API: its errors said as what to send instead
(`friendly`, `validation_errors`, `BatchError`). How a body is read and what text it may hold
is in costboard/ingest/json_body.py.
"""

from __future__ import annotations

import difflib
import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any, Literal, cast

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    RootModel,
    Strict,
    StrictBool,
    StrictInt,
    ValidationError,
    WithJsonSchema,
    field_validator,
)

from costboard.ingest.json_body import MAX_DEPTH, bad_text, json_loads, may_hold_bad_text, too_deep
from costboard.ingest.normalize import Tokens, UsageError, normalize_usage
from costboard.input_limits import FIRST_YEAR, LAST_YEAR, amount_fault
from costboard.models import MAX_TIER_LENGTH, TIER_PATTERN
from costboard.tag_values import TAG_KEY

MAX_EVENTS = 1000
MAX_BODY_BYTES = 5 * 1024 * 1024
MAX_TOKENS = 10**12
MAX_TURN = 2**31 - 1  # the turn number's column is a 32-bit integer
MAX_MILLISECONDS = 2**31 - 1  # the step's duration column: about 24.8 days

MAX_TAGS = 20
MAX_TAG_VALUE = 128


def tags_check(value: Any) -> dict[str, str]:
    """`tags`: a flat object of strings (docs/api.md, "Tags"), e.g. {"feature": "search"}."""
    if not isinstance(value, dict):
        raise ValueError('must be an object of strings, e.g. {"feature": "search"}')
    if len(value) > MAX_TAGS:
        raise ValueError(f"has {len(value)} keys; at most {MAX_TAGS}")
    for key, tag in value.items():
        if not TAG_KEY.fullmatch(key):
            raise ValueError(
                f"key {key[:80]!r} must be 1 to 64 of a-z 0-9 _ . - (lower case), e.g. "
                '"feature" or "customer.tier"'
            )
        if not isinstance(tag, str):
            raise ValueError(
                f'"{key}" must be a string, e.g. "{key}": "search" (numbers too: "42")'
            )
        if len(tag) > MAX_TAG_VALUE:
            raise ValueError(f'"{key}" is {len(tag)} characters; at most {MAX_TAG_VALUE}')
    return value


Tags = Annotated[
    dict[str, str],
    BeforeValidator(tags_check),
    Field(
        description="a flat object of strings to attribute spend by (feature, customer, env): "
        f"at most {MAX_TAGS} keys of [a-z0-9_.-]{{1,64}}, values at most {MAX_TAG_VALUE} "
        "characters"
    ),
]

TokenCount = Annotated[StrictInt, Field(ge=0, le=MAX_TOKENS)]
ServiceTier = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_TIER_LENGTH,
        pattern=TIER_PATTERN,
        description="the service tier the provider billed: standard (the default), flex, "
        "priority, batch, or the provider's own word (letters, digits, _ . - :); stored lower "
        'case, OpenAI\'s "default" as standard',
    ),
]
TIER_FAULT = (
    "must be a service tier: standard, flex, priority, batch or the provider's own word "
    f"(letters, digits, _ . - :, at most {MAX_TIER_LENGTH} characters)"
)
_TIER_RE = re.compile(TIER_PATTERN)
ExternalId = Annotated[str, Field(min_length=1, max_length=128)]
TurnNumber = Annotated[StrictInt, Field(ge=1, le=MAX_TURN)]
# A JSON number: an int, or a Decimal (json_loads reads fractions as Decimal); never a
# string or a bool. Strict types, so no Python validator runs per event.
Milliseconds = Annotated[
    Annotated[StrictInt, Field(ge=0, le=MAX_MILLISECONDS)]
    | Annotated[Decimal, Strict(), Field(ge=0, le=MAX_MILLISECONDS)],
    WithJsonSchema(
        {"type": "number", "minimum": 0, "maximum": MAX_MILLISECONDS, "description": "ms"}
    ),
]


# ISO 8601 text, checked in validate_event: a Python validator here would run per event,
# and costs more than the rest of the event's validation (pydantic alone would read a
# number as seconds since 1970).
Timestamp = Annotated[
    datetime,
    WithJsonSchema(
        {
            "type": "string",
            "format": "date-time",
            "description": "ISO 8601, from 1970 to 2999 in UTC; without an offset it is UTC",
        }
    ),
]


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, frozen=True)

    event_id: ExternalId | None = Field(
        default=None, description="idempotency key within the project: a replay changes nothing"
    )
    # ISO 8601; without an offset it is UTC (see `at`).
    timestamp: Timestamp | None = Field(default=None, description="when it happened; absent: now")

    def at(self, now: datetime) -> datetime:
        """When the event happened: its timestamp, aware (UTC if it had no offset), else now."""
        ts = self.timestamp
        if ts is None:
            return now
        return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


class SessionEvent(_Event):
    """A session's attributes and caps; sessions are also created by their first step."""

    type: Literal["session"]
    session_id: ExternalId
    user_id: Annotated[str, Field(max_length=128)] | None = Field(
        default=None, description="your end user: spend per user"
    )
    parent_session_id: ExternalId | None = Field(
        default=None, description="a fork of this session: it gets a fresh budget"
    )
    token_cap: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] | None = Field(
        default=None, description="input + output tokens; absent: the project's, else 100000"
    )
    cost_cap_usd: (
        Annotated[
            Decimal,
            Field(ge=0, max_digits=14, decimal_places=4),
            WithJsonSchema(
                {
                    "anyOf": [
                        {"type": "number", "minimum": 0, "maximum": 9999999999},
                        {"type": "string", "pattern": r"^\s*\+?[0-9]{1,10}(\.[0-9]{0,4})?\s*$"},
                    ],
                    "description": 'USD: a decimal string such as "5.00", or a JSON number; '
                    "at most 4 decimal places and 10 digits before the point",
                }
            ),
        ]
        | None
    ) = None
    ended: StrictBool | None = Field(default=None, description="true: the session is over")
    metadata: dict[str, Any] | None = Field(
        default=None, description="merged into the stored metadata, key by key"
    )
    tags: Tags | None = Field(
        default=None,
        description="merged into the session's tags, key by key; its later steps carry them",
    )

    @field_validator("cost_cap_usd", mode="before")
    @classmethod
    def _money(cls, value: Any) -> Any:
        # A string "5.00" or a JSON number (parsed exactly as Decimal); never a float.
        if isinstance(value, bool):
            raise ValueError('must be a decimal amount in USD, e.g. "5.00"')
        if isinstance(value, int | float):
            return Decimal(str(value))
        fault = amount_fault(value) if isinstance(value, str) else None
        if fault is not None:  # Decimal() would read "１２" as 12
            raise ValueError(fault)
        return value


class TurnEvent(_Event):
    """A turn's text: what the user asked and what the agent answered (memory reads it)."""

    type: Literal["turn"]
    session_id: ExternalId
    turn: TurnNumber = Field(description="1 for the session's first turn")
    user_message: Annotated[str, Field(max_length=1_000_000)] | None = None
    assistant_response: Annotated[str, Field(max_length=1_000_000)] | None = None
    context: dict[str, Any] | None = Field(
        default=None, description="focus, selections, last query…: replaces the stored one"
    )


class StepEvent(_Event):
    """One LLM call (or tool call): priced, rolled up, counted against its session's budget."""

    type: Literal["step"] = "step"
    step_type: Annotated[str, Field(min_length=1, max_length=64)] = Field(
        description="intent, filter, search, response, compress, …"
    )
    model: Annotated[str, Field(min_length=1, max_length=200)] = Field(
        description="as the provider names it; an unknown one is stored unpriced; "
        '"none" for a step without a model (a tool call, a retrieval): $0, never unpriced'
    )
    session_id: ExternalId | None = Field(
        default=None, description="absent: the project's system session"
    )
    turn: TurnNumber | None = None
    provider: Annotated[str, Field(max_length=64)] | None = None
    service_tier: ServiceTier | None = Field(
        default=None, description="absent: usage.service_tier (Anthropic), else standard"
    )
    input_tokens: TokenCount | None = None
    output_tokens: TokenCount | None = None
    cache_read_input_tokens: TokenCount | None = None
    cache_creation_input_tokens: TokenCount | None = None
    reasoning_tokens: TokenCount | None = None
    input_audio_tokens: TokenCount | None = Field(
        default=None, description="of input_tokens, those of audio (priced at the audio rate)"
    )
    cache_audio_read_tokens: TokenCount | None = Field(
        default=None, description="of cache_read_input_tokens, those of audio"
    )
    output_audio_tokens: TokenCount | None = Field(
        default=None, description="of output_tokens, those of audio"
    )
    duration_ms: Milliseconds | None = None
    success: StrictBool = True
    error: Annotated[str, Field(max_length=20_000)] | None = None
    usage: dict[str, Any] | None = Field(
        default=None,
        description="a provider's raw usage object (Anthropic Messages, OpenAI Chat Completions "
        "or Responses, Gemini usageMetadata, Bedrock Converse); explicit token fields win over it",
    )
    metadata: dict[str, Any] | None = None
    tags: Tags | None = Field(
        default=None, description="merged over its session's tags (this step's win)"
    )

    def tokens(self) -> Tokens:
        """Token counts: the raw usage normalized, each explicit field taking precedence."""
        if self.usage is None:  # the common case, without the merge
            return Tokens(
                input_tokens=self.input_tokens or 0,
                output_tokens=self.output_tokens or 0,
                cache_read_input_tokens=self.cache_read_input_tokens or 0,
                cache_creation_input_tokens=self.cache_creation_input_tokens or 0,
                reasoning_tokens=self.reasoning_tokens or 0,
                input_audio_tokens=self.input_audio_tokens or 0,
                cache_audio_read_tokens=self.cache_audio_read_tokens or 0,
                output_audio_tokens=self.output_audio_tokens or 0,
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
            input_audio_tokens=_pick(self.input_audio_tokens, base.input_audio_tokens),
            cache_audio_read_tokens=_pick(
                self.cache_audio_read_tokens, base.cache_audio_read_tokens
            ),
            output_audio_tokens=_pick(self.output_audio_tokens, base.output_audio_tokens),
        )

    def has_audio(self) -> bool:
        """Whether any audio count is sent as a field (the usage object's are read with it)."""
        return (
            self.input_audio_tokens is not None
            or self.cache_audio_read_tokens is not None
            or self.output_audio_tokens is not None
        )


# Each audio count and the count it is part of (docs/api.md, "Audio tokens").
AUDIO_PARTS = (
    ("input_audio_tokens", "input_tokens", "the uncached input"),
    ("cache_audio_read_tokens", "cache_read_input_tokens", "the cache reads"),
    ("output_audio_tokens", "output_tokens", "the output"),
)


def audio_fault(tokens: Tokens) -> tuple[str, str] | None:
    """The first audio count larger than the count it is part of, as (field, message)."""
    for part, whole, what in AUDIO_PARTS:
        audio = getattr(tokens, part)
        total = getattr(tokens, whole)
        if audio > total:
            return part, (
                f"{part} ({audio}) exceeds {whole} ({total}): the audio tokens are part of "
                f"{what}, not in addition to it; send {whole} with the audio included"
            )
    return None


def _pick(explicit: int | None, derived: int) -> int:
    return derived if explicit is None else explicit


Event = SessionEvent | TurnEvent | StepEvent
_MODELS: dict[str, type[_Event]] = {
    "session": SessionEvent,
    "turn": TurnEvent,
    "step": StepEvent,
}
# The free-form objects of each kind, checked for depth (docs/api.md, "Limits").
_NESTED: dict[type[_Event], tuple[str, ...]] = {
    SessionEvent: ("metadata",),
    TurnEvent: ("context",),
    StepEvent: ("usage", "metadata"),
}


AnyEvent = Annotated[StepEvent | TurnEvent | SessionEvent, Field(union_mode="left_to_right")]
EventList = Annotated[list[AnyEvent], Field(min_length=1, max_length=MAX_EVENTS)]


class Batch(BaseModel):
    """`{"events": [ … ]}`: 1 to 1000 events, stored all or nothing."""

    model_config = ConfigDict(extra="forbid")

    events: EventList


class EventsBody(RootModel[AnyEvent | Batch | EventList]):
    """The body of POST /api/v1/events: one event, a batch, or a bare array of events. Its
    schema documents what parse_events accepts; parse_events validates each event with the
    event models themselves (fast, and every error at once)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "events": [
                        {"type": "session", "session_id": "chat-42", "token_cap": 200000},
                        {"type": "turn", "session_id": "chat-42", "turn": 1, "user_message": "Hi"},
                        {
                            "event_id": "call-1",
                            "session_id": "chat-42",
                            "turn": 1,
                            "step_type": "response",
                            "model": "claude-sonnet-4-5",
                            "input_tokens": 1200,
                            "output_tokens": 340,
                            "cache_read_input_tokens": 45000,
                            "duration_ms": 2310,
                        },
                    ]
                }
            ]
        }
    )


# --- friendly errors --------------------------------------------------------------------------


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


class SumsOutOfRange(BatchError):
    """A batch whose steps would take a stored sum (a session's, a turn's, a day's rollup's)
    past what its column holds: USD to 12 digits before the point, tokens to 2^63. No real
    usage gets there; the batch is refused whole, with nothing stored."""

    def __init__(self, event_count: int) -> None:
        message = (
            "the batch would take a stored sum past what Costboard keeps (USD below 10^12, "
            "tokens below 2^63, for a session, a turn or a day): no real usage comes near; "
            "check the batch's token counts and the model's price"
        )
        super().__init__(422, [_error(None, "events", message)], event_count=event_count)


def _error(index: int | None, field: str | None, message: str) -> dict[str, Any]:
    return {"index": index, "field": field, "message": message}


def friendly(model: type[BaseModel] | None, err: Any) -> tuple[str, str]:
    """A pydantic error as (field, message): the message says what to send instead."""
    loc = [str(part) for part in err["loc"]]
    if loc and loc[0] == "service_tier":  # one message whatever the fault (type, length, text)
        return "service_tier", f"{TIER_FAULT}, got {err.get('input')!r}"
    if loc and loc[0] == "duration_ms":  # both members of its union failed: one message
        value = err.get("input")
        return (
            "duration_ms",
            f"must be a number of milliseconds from 0 to {MAX_MILLISECONDS}, got {value!r}",
        )
    field = ".".join(loc) or "body"
    kind = err["type"]
    if kind == "extra_forbidden":
        known = [name for name in model.model_fields if name != "type"] if model else []
        close = difflib.get_close_matches(loc[-1], known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; known fields: {', '.join(known)}"
        return field, f"unknown field{hint}"
    if kind == "missing":
        if model is not None and issubclass(model, _Event):
            kind_name = model.__name__.removesuffix("Event").lower()
            return field, f"{field} is required for a {kind_name}"
        return field, f"{field} is required"
    if kind in {"int_type", "int_parsing", "int_from_float"}:
        return field, f"must be a whole number (JSON integer), got {err.get('input')!r}"
    if kind == "bool_type":
        return field, f"must be true or false, got {err.get('input')!r}"
    if kind in {"datetime_parsing", "datetime_type", "datetime_from_date_parsing"}:
        return field, "must be an ISO 8601 time, e.g. 2026-11-22T10:15:00Z"
    bound = _BOUNDS.get(kind)
    if bound is not None:
        words, name = bound
        return field, f"must be {words} {err.get('ctx', {}).get(name)}, got {err.get('input')!r}"
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    return field, message


# pydantic's bound errors, said as what to send: "must be at most 2147483647"
_BOUNDS = {
    "less_than_equal": ("at most", "le"),
    "less_than": ("less than", "lt"),
    "greater_than_equal": ("at least", "ge"),
    "greater_than": ("more than", "gt"),
}


def validation_errors(
    exc: ValidationError, model: type[BaseModel] | None = None, *, index: int | None = None
) -> list[dict[str, Any]]:
    """A ValidationError as the API's error items, one per field and message."""
    errors: list[dict[str, Any]] = []
    for err in exc.errors(include_url=False):
        field, message = friendly(model, err)
        if not any(e["field"] == field and e["message"] == message for e in errors):
            errors.append(_error(index, field, message))
    return errors


ISO_TIME = "must be an ISO 8601 time as a string, e.g. 2026-11-22T10:15:00Z"
ISO_TIME_RANGE = (
    f"must be a time from {FIRST_YEAR} to {LAST_YEAR} in UTC (its offset counted), "
    "e.g. 2026-11-22T10:15:00Z"
)


def in_years(moment: datetime) -> bool:
    """Whether `moment` (UTC when naive) falls within FIRST_YEAR..LAST_YEAR in UTC: the year
    it is stored under, not the year its offset names (2999-12-31T23:00-14:00 is 3000)."""
    if not FIRST_YEAR - 1 <= moment.year <= LAST_YEAR + 1:
        return False  # and near year 1 or 9999 the conversion below would overflow
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return FIRST_YEAR <= moment.year <= LAST_YEAR


def validate_event(index: int, raw: Any) -> tuple[Event | None, list[dict[str, Any]]]:
    if not isinstance(raw, dict):
        return None, [_error(index, "event", "each event must be a JSON object")]
    kind = raw.get("type", "step")
    model = _MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        return None, [
            _error(index, "type", f"unknown event type {kind!r}; use session, turn or step")
        ]
    timestamp = raw.get("timestamp")
    if timestamp is not None and not isinstance(timestamp, str):
        return None, [_error(index, "timestamp", ISO_TIME)]
    try:
        event = cast(Event, model.model_validate(raw))
    except ValidationError as exc:
        return None, validation_errors(exc, model, index=index)
    if event.timestamp is not None and not in_years(event.timestamp):
        return None, [_error(index, "timestamp", ISO_TIME_RANGE)]
    for name in _NESTED[model]:
        value = raw.get(name)
        if value and too_deep(value, MAX_DEPTH):
            return None, [_error(index, name, f"nests deeper than {MAX_DEPTH} levels: flatten it")]
    if isinstance(event, StepEvent) and event.usage is not None:
        huge = number_past(event.usage, MAX_TOKENS, "usage")
        if huge is not None:
            return None, [_error(index, huge, f"must be at most {MAX_TOKENS} (10^12) tokens")]
        try:
            tokens = event.tokens()
        except UsageError as exc:
            return None, [_error(index, exc.field, str(exc))]
        if max(_counts(tokens)) > MAX_TOKENS:
            return None, [_error(index, "usage", "token counts must be at most 10^12")]
        fault = audio_fault(tokens)
        if fault is not None:
            return None, [_error(index, *fault)]
        tier = event.usage.get("service_tier")
        if tier is not None and not (
            isinstance(tier, str)
            and len(tier.strip()) <= MAX_TIER_LENGTH
            and _TIER_RE.match(tier.strip())
        ):
            return None, [_error(index, "usage.service_tier", f"{TIER_FAULT}, got {tier!r}")]
    elif isinstance(event, StepEvent) and event.has_audio():
        fault = audio_fault(event.tokens())
        if fault is not None:
            return None, [_error(index, *fault)]
    return event, []


def usage_tier(usage: dict[str, Any] | None) -> str | None:
    """The service tier a raw usage object names (Anthropic's `usage.service_tier`), checked
    by validate_event; None when it names none."""
    if usage is None:
        return None
    tier = usage.get("service_tier")
    return tier if isinstance(tier, str) and tier.strip() else None


def number_past(value: Any, limit: int, path: str) -> str | None:
    """The dotted path of the first number in `value` beyond ±`limit`, or None: every count
    in a provider's usage object is a token count, bounded like the explicit fields."""
    stack: list[tuple[object, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            stack.extend((child, f"{where}.{key}") for key, child in item.items())
        elif isinstance(item, list):
            stack.extend((child, f"{where}.{n}") for n, child in enumerate(item))
        elif (
            isinstance(item, int | Decimal)
            and not isinstance(item, bool)
            and not -limit <= item <= limit
        ):
            return where
    return None


def _counts(tokens: Tokens) -> tuple[int, ...]:
    return (
        tokens.input_tokens,
        tokens.output_tokens,
        tokens.cache_read_input_tokens,
        tokens.cache_creation_input_tokens,
        tokens.cache_creation_1h_input_tokens,
        tokens.reasoning_tokens,
    )


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
        payload = json_loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        message = (
            f"malformed JSON ({exc}): send one event object, "
            '{"events": [...]} or a JSON array of events'
        )
        raise BatchError(400, [_error(None, "body", message)]) from None
    except RecursionError:
        raise BatchError(
            422, [_error(None, "body", f"nests deeper than {MAX_DEPTH} levels: flatten it")]
        ) from None

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

    check_text = may_hold_bad_text(body)
    events: list[Event] = []
    errors: list[dict[str, Any]] = []
    for index, raw in enumerate(raw_events):
        found = bad_text(raw) if check_text else None
        if found is not None:
            errors.append(_error(index, found[0], found[1]))
            continue
        event, event_errors = validate_event(index, raw)
        if event_errors:
            errors.extend(event_errors)
        elif event is not None:
            events.append(event)
    if errors:
        raise BatchError(422, errors, event_count=len(raw_events))
    return events
