"""The providers' billing APIs, read (docs/billing.md): OpenAI's organization Costs API and
completions Usage API, Anthropic's Admin API cost report and messages usage report. Each is
asked for daily buckets over a window of days and followed page by page (`next_page` while
`has_more`); each answer is read with its amounts as `Decimal` from the JSON text, checked
field by field, and turned into `Billed` rows. Nothing here touches the database.

A 429 is retried after its `Retry-After` seconds, a 5xx or a connection failure (refused,
timed out, reset, or an answer cut off before its end) after a backoff that doubles (1, 2,
4 … seconds); `sleep` is the seam tests turn by hand. Any other
refusal, or an answer that is not the documented shape, raises `ProviderError` naming the
provider and the field.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.conf import settings

from costboard.input_limits import amount_fault

Sleep = Callable[[float], None]

OPENAI, ANTHROPIC = "openai", "anthropic"
PROVIDERS = (OPENAI, ANTHROPIC)
ANTHROPIC_VERSION = "2023-06-01"
# the most daily buckets one request may ask for: Anthropic's reports and OpenAI's usage
# allow 31 (OpenAI's costs 180); a window of days is asked for at once, then stored day by day
MAX_BUCKETS = 31
MAX_ATTEMPTS = 6  # a request tried at most this often (429s and 5xx alike)
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 60.0
RETRY_AFTER_MAX_S = 300.0  # a longer Retry-After is waited this long, then tried again
TIMEOUT_S = 60.0
MAX_PAGES = 1000  # a server that never stops paginating is refused, not followed forever


class ProviderError(Exception):
    """A provider's answer we cannot use: which provider, which field, what went wrong."""

    def __init__(self, provider: str, field: str, message: str) -> None:
        super().__init__(f"{provider}: {field}: {message}")
        self.provider = provider
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Billed:
    """One result of a daily bucket, in Costboard's terms (input tokens exclude cache reads
    and writes; USD exact)."""

    day: date
    model: str | None = None
    line_item: str | None = None
    provider_project: str | None = None
    provider_api_key: str | None = None
    service_tier: str | None = None
    cost_usd: Decimal | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    requests: int | None = None


@dataclass(frozen=True, slots=True)
class Report:
    """One of a provider's reports: where it is, how it is asked, how a result reads."""

    provider: str
    source: str  # BilledUsage.Source
    path: str
    group_by: tuple[str, ...]
    parse: Callable[[Fields], Billed]


# --- reading an answer, field by field --------------------------------------------------------


class Fields:
    """A JSON object of an answer, read with the path of each field for the error."""

    def __init__(self, provider: str, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise ProviderError(provider, where or "answer", "must be a JSON object")
        self.provider = provider
        self.value = value
        self.where = where

    def field_path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _refuse(self, key: str, message: str) -> ProviderError:
        return ProviderError(self.provider, self.field_path(key), message)

    def get(self, key: str, *, required: bool = True) -> Any:
        if key not in self.value:
            if required:
                raise self._refuse(key, "missing from the answer")
            return None
        return self.value[key]

    def text(self, key: str, *, required: bool = False, limit: int = 300) -> str | None:
        value = self.get(key, required=required)
        if value is None:
            if required:
                raise self._refuse(key, "must be a string, not null")
            return None
        if not isinstance(value, str):
            raise self._refuse(key, f"must be a string, not {type(value).__name__}")
        if len(value) > limit or "\x00" in value:
            raise self._refuse(key, f"must be at most {limit} characters, without NUL")
        return value

    def count(self, key: str) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self._refuse(key, f"must be a whole number ≥ 0, not {value!r}"[:200])
        return value

    def count_or_none(self, key: str) -> int | None:
        """A count the answer may leave out or send as null."""
        return None if self.get(key, required=False) is None else self.count(key)

    def flag(self, key: str) -> bool | None:
        value = self.get(key, required=False)
        if value is not None and not isinstance(value, bool):
            raise self._refuse(key, f"must be true, false or null, not {value!r}"[:200])
        return value

    def amount(self, key: str) -> Decimal:
        """A decimal amount, a JSON number (read as Decimal) or a string of one."""
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int | Decimal | str):
            raise self._refuse(key, f"must be a number, not {value!r}"[:200])
        fault = amount_fault(value) if isinstance(value, str) else None
        if fault is not None:  # Decimal() would read "１２" as 12
            raise self._refuse(key, fault)
        try:
            number = Decimal(value.strip()) if isinstance(value, str) else Decimal(value)
        except InvalidOperation:
            raise self._refuse(key, f"must be a decimal number, not {value!r}"[:200]) from None
        if not number.is_finite() or abs(number) >= Decimal(10) ** 15:
            raise self._refuse(key, f"must be a finite amount, not {value!r}"[:200])
        return number

    def obj(self, key: str) -> Fields:
        return Fields(self.provider, self.get(key), self.field_path(key))

    def obj_or_none(self, key: str) -> Fields | None:
        return None if self.get(key, required=False) is None else self.obj(key)

    def items(self, key: str) -> list[Fields]:
        value = self.get(key)
        if not isinstance(value, list):
            raise self._refuse(key, "must be a JSON array")
        return [
            Fields(self.provider, item, f"{self.field_path(key)}[{i}]")
            for i, item in enumerate(value)
        ]


def _currency_usd(fields: Fields, key: str) -> None:
    currency = fields.text(key, required=True) or ""
    if currency.strip().lower() != "usd":
        raise ProviderError(
            fields.provider, fields.field_path(key), f"is {currency!r}: only USD amounts are read"
        )


# --- OpenAI ------------------------------------------------------------------------------------


def _openai_cost(result: Fields) -> Billed:
    amount = result.obj("amount")
    _currency_usd(amount, "currency")
    line_item = result.text("line_item")
    return Billed(
        day=date.min,  # the bucket's, set by the caller
        # "gpt-4o-2024-08-06, input": the model is what precedes the first ", " (a model's
        # name has none; what follows is the kind of token, maybe a tier)
        model=line_item.split(", ", 1)[0][:200] if line_item and ", " in line_item else None,
        line_item=line_item,
        provider_project=result.text("project_id", limit=200),
        cost_usd=amount.amount("value"),  # dollars, a JSON number
    )


def _openai_usage(result: Fields) -> Billed:
    inputs = result.count("input_tokens")
    cached = result.count_or_none("input_cached_tokens") or 0
    if cached > inputs:
        raise ProviderError(
            result.provider,
            result.field_path("input_cached_tokens"),
            f"is {cached}, more than input_tokens ({inputs}) which includes them",
        )
    tier = result.text("service_tier", limit=64)
    if result.flag("batch") and tier in (None, "default"):
        tier = "batch"
    return Billed(
        day=date.min,
        model=result.text("model", limit=200),
        provider_project=result.text("project_id", limit=200),
        provider_api_key=result.text("api_key_id", limit=200),
        service_tier=tier,
        input_tokens=inputs - cached,  # OpenAI's input includes the cached tokens
        cache_read_input_tokens=cached,
        output_tokens=result.count("output_tokens"),
        requests=result.count_or_none("num_model_requests"),
    )


# --- Anthropic --------------------------------------------------------------------------------


def _anthropic_cost(result: Fields) -> Billed:
    _currency_usd(result, "currency")
    return Billed(
        day=date.min,
        model=result.text("model", limit=200),
        line_item=result.text("description"),
        provider_project=result.text("workspace_id", limit=200),
        service_tier=result.text("service_tier", limit=64),
        # "lowest currency units (e.g. cents) as a decimal string": "123.45" is $1.2345
        cost_usd=result.amount("amount").scaleb(-2),
    )


def _anthropic_usage(result: Fields) -> Billed:
    creation = result.obj_or_none("cache_creation")
    written = 0
    if creation is not None:
        written = (creation.count_or_none("ephemeral_5m_input_tokens") or 0) + (
            creation.count_or_none("ephemeral_1h_input_tokens") or 0
        )
    return Billed(
        day=date.min,
        model=result.text("model", limit=200),
        provider_project=result.text("workspace_id", limit=200),
        provider_api_key=result.text("api_key_id", limit=200),
        service_tier=result.text("service_tier", limit=64),
        input_tokens=result.count("uncached_input_tokens"),
        output_tokens=result.count("output_tokens"),
        cache_read_input_tokens=result.count_or_none("cache_read_input_tokens"),
        cache_creation_input_tokens=written,
    )


REPORTS: dict[str, tuple[Report, ...]] = {
    OPENAI: (
        Report(
            OPENAI,
            "openai_costs",
            "/v1/organization/costs",
            ("project_id", "line_item"),
            _openai_cost,
        ),
        Report(
            OPENAI,
            "openai_usage",
            "/v1/organization/usage/completions",
            ("model", "project_id", "api_key_id", "service_tier", "batch"),
            _openai_usage,
        ),
    ),
    ANTHROPIC: (
        Report(
            ANTHROPIC,
            "anthropic_cost_report",
            "/v1/organizations/cost_report",
            ("workspace_id", "description"),
            _anthropic_cost,
        ),
        Report(
            ANTHROPIC,
            "anthropic_usage",
            "/v1/organizations/usage_report/messages",
            ("model", "workspace_id", "api_key_id", "service_tier"),
            _anthropic_usage,
        ),
    ),
}

KEY_SETTINGS = {OPENAI: "COSTBOARD_OPENAI_ADMIN_KEY", ANTHROPIC: "COSTBOARD_ANTHROPIC_ADMIN_KEY"}
BASE_SETTINGS = {OPENAI: "COSTBOARD_OPENAI_API_BASE", ANTHROPIC: "COSTBOARD_ANTHROPIC_API_BASE"}


def admin_key(provider: str) -> str:
    return str(getattr(settings, KEY_SETTINGS[provider], "") or "").strip()


def _midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def _window_params(provider: str, first: date, last: date) -> list[tuple[str, str]]:
    """The bounds of a window of whole UTC days, `first` to `last` included."""
    start, end = _midnight(first), _midnight(last + timedelta(days=1))
    if provider == OPENAI:  # Unix seconds; end exclusive
        return [
            ("start_time", str(int(start.timestamp()))),
            ("end_time", str(int(end.timestamp()))),
        ]
    # RFC 3339; buckets that end before ending_at
    return [
        ("starting_at", start.strftime("%Y-%m-%dT%H:%M:%SZ")),
        ("ending_at", end.strftime("%Y-%m-%dT%H:%M:%SZ")),
    ]


def _bucket_day(provider: str, bucket: Fields) -> date:
    if provider == OPENAI:
        start = bucket.count("start_time")
        return datetime.fromtimestamp(start, tz=UTC).date()
    text = bucket.text("starting_at", required=True) or ""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ProviderError(
            provider, bucket.field_path("starting_at"), f"{text[:40]!r} is not an RFC 3339 time"
        ) from None
    if moment.tzinfo is None:
        raise ProviderError(provider, bucket.field_path("starting_at"), f"{text!r} has no offset")
    return moment.astimezone(UTC).date()


# --- HTTP ------------------------------------------------------------------------------------


@dataclass
class Client:
    """A provider's billing API over HTTP (urllib), with its admin key and retries."""

    provider: str
    key: str
    base_url: str
    sleep: Sleep = time.sleep

    @classmethod
    def configured(cls, provider: str, *, sleep: Sleep = time.sleep) -> Client:
        key = admin_key(provider)
        if not key:
            name = KEY_SETTINGS[provider]
            raise ProviderError(
                provider, name, f"not set: set {name} to an admin API key of the organization"
            )
        base = str(getattr(settings, BASE_SETTINGS[provider])).rstrip("/")
        return cls(provider=provider, key=key, base_url=base, sleep=sleep)

    def _headers(self) -> dict[str, str]:
        if self.provider == OPENAI:
            return {"Authorization": f"Bearer {self.key}", "Accept": "application/json"}
        return {
            "x-api-key": self.key,
            "anthropic-version": ANTHROPIC_VERSION,
            "Accept": "application/json",
        }

    def get(self, path: str, params: list[tuple[str, str]]) -> Fields:
        """The answer to one GET as a checked JSON object, retried as the module says."""
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        request = urllib.request.Request(url, headers=self._headers(), method="GET")  # noqa: S310
        backoff = BACKOFF_FIRST_S
        for attempt in range(1, MAX_ATTEMPTS + 1):
            wait, doubling = backoff, True
            try:
                with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310
                    body = response.read()
                return self._parse(path, body)
            except urllib.error.HTTPError as exc:
                status = exc.code
                try:
                    detail = exc.read()[:300].decode("utf-8", "replace")
                except (http.client.HTTPException, OSError):  # the refusal's body cut off
                    detail = "(its body cut off)"
                retry_after = _retry_after(exc.headers.get("Retry-After"))
                if status == 429 and retry_after is not None:
                    wait, doubling = retry_after, False
                elif status != 429 and status < 500:
                    raise ProviderError(
                        self.provider,
                        path,
                        f"HTTP {status} {_refusal_hint(self.provider, status)}: {detail}",
                    ) from None
                failure = f"HTTP {status}: {detail}"
            except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
                # refused, timed out, reset, or cut off before the body its Content-Length
                # told (IncompleteRead): a connection failure, retried like a 5xx
                failure = f"unreachable ({getattr(exc, 'reason', exc)})"
            if attempt == MAX_ATTEMPTS:
                raise ProviderError(
                    self.provider, path, f"{failure}; gave up after {MAX_ATTEMPTS} attempts"
                )
            self.sleep(wait)
            if doubling:  # a backoff, not a Retry-After: the next one is twice as long
                backoff = min(backoff * 2, BACKOFF_MAX_S)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _parse(self, path: str, body: bytes) -> Fields:
        try:
            value = json.loads(body.decode("utf-8"), parse_float=Decimal)
        except (ValueError, UnicodeDecodeError):
            raise ProviderError(
                self.provider, path, f"the answer is not JSON: {body[:80]!r}"
            ) from None
        return Fields(self.provider, value, "")

    def buckets(
        self, report: Report, first: date, last: date
    ) -> Iterator[tuple[date, list[Billed]]]:
        """Each daily bucket of `report` from `first` to `last` (UTC days, included), page
        by page."""
        params = [
            *_window_params(self.provider, first, last),
            ("bucket_width", "1d"),
            *(("group_by[]", name) for name in report.group_by),
            ("limit", str(min(MAX_BUCKETS, (last - first).days + 1))),
        ]
        page: str | None = None
        for _ in range(MAX_PAGES):
            answer = self.get(report.path, [*params, *([("page", page)] if page else [])])
            try:
                yield from self._page(report, answer)
                more = answer.get("has_more")
                if not isinstance(more, bool):
                    raise ProviderError(self.provider, "has_more", "must be true or false")
                if not more:
                    return
                page = answer.text("next_page", required=True, limit=2000)
            except ProviderError as exc:
                raise ProviderError(
                    exc.provider, exc.field, f"{exc.message} (in the answer to {report.path})"
                ) from None
        raise ProviderError(self.provider, "next_page", f"still more after {MAX_PAGES} pages")

    def _page(self, report: Report, answer: Fields) -> Iterator[tuple[date, list[Billed]]]:
        for bucket in answer.items("data"):
            day = _bucket_day(self.provider, bucket)
            rows = [dataclasses.replace(report.parse(r), day=day) for r in bucket.items("results")]
            yield day, rows


def _retry_after(value: str | None) -> float | None:
    """Retry-After in whole seconds (the form both providers send); None otherwise."""
    if value is None or not value.strip().isdigit():
        return None
    return min(float(int(value.strip())), RETRY_AFTER_MAX_S)


def _refusal_hint(provider: str, status: int) -> str:
    if status in (401, 403):
        return f"(the key was refused: set {KEY_SETTINGS[provider]} to an admin API key)"
    return "(refused)"
