"""Billed rows sent by hand (docs/billing.md, "Any other provider or an invoice"): the rows of
`POST /api/v1/billing` (JSON or CSV) and of the admin's CSV upload, validated whole with
pydantic. A fault anywhere names the row's index and its field, and nothing is stored."""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    WithJsonSchema,
    field_validator,
)

from costboard.input_limits import FIRST_DAY, LAST_DAY, amount_fault, text_fault
from costboard.models import Project

MAX_ROWS = 10_000
COLUMNS = ("date", "provider", "model", "project", "cost_usd", "input_tokens", "output_tokens")
REQUIRED = ("date", "provider", "cost_usd")
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
_PROVIDER = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_MONEY = re.compile(r"[+-]?[0-9]{1,12}(\.[0-9]{1,12})?")  # \d would take "١٢"
# a CSV token cell read as a number: ASCII digits only (str.isdigit and \d take '²' and '١٢',
# which int() refuses or reads), and few enough for int() (past 10^15 the model refuses it)
_TOKEN_CELL = re.compile(r"[0-9]{1,20}")
_TOKENS_FORM = "write a whole number (an integer from 0 to 10^15) in ASCII digits 0-9, e.g. 1200"
EXAMPLE = (
    '{"rows": [{"date": "2026-11-01", "provider": "mistral", "model": "mistral-large", '
    '"cost_usd": "12.34"}]}'
)


class UploadError(Exception):
    """The faults of an upload: one `{"index", "field", "message"}` per field at fault."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(
            "; ".join(f"row {e['index']}: {e['field']}: {e['message']}" for e in errors)
        )
        self.errors = errors


def _day(value: Any) -> date:
    if isinstance(value, date):
        return value
    if not isinstance(value, str) or not _DAY.fullmatch(value.strip()):
        raise ValueError(f"{str(value)[:40]!r} is not a date: write YYYY-MM-DD (a UTC day)")
    try:
        day = date.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(f"{value!r} is no such date: write YYYY-MM-DD") from None
    if not FIRST_DAY <= day <= LAST_DAY:
        raise ValueError(f"{value} is outside the years 1970–2999")
    return day


def _money(value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal | float):
        raise ValueError('must be a USD amount such as "12.34"')
    text = format(value, "f") if isinstance(value, Decimal) else str(value).strip()
    fault = amount_fault(text)
    if fault is not None:
        raise ValueError(fault)
    if not _MONEY.fullmatch(text):
        raise ValueError(
            f"{text[:40]!r} is not a USD amount: write at most 12 digits before the point and "
            'at most 12 decimals, e.g. "12.34"'
        )
    return Decimal(text)


def _blank_none(value: Any) -> Any:
    """A CSV's empty cell (or a JSON null) is an absent value."""
    if isinstance(value, str) and not value.strip():
        return None
    return value


Day = Annotated[
    date,
    BeforeValidator(_day),
    WithJsonSchema({"type": "string", "format": "date", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}),
]
Money = Annotated[
    Decimal,
    BeforeValidator(_money),
    WithJsonSchema(
        {
            "anyOf": [{"type": "string", "pattern": _MONEY.pattern}, {"type": "number"}],
            "description": 'USD: a decimal string such as "12.34" (or a JSON number), at most '
            "12 decimals; negative for a credit",
        }
    ),
]
Tokens = Annotated[
    Annotated[StrictInt, Field(ge=0, le=10**15)] | None, BeforeValidator(_blank_none)
]
Text = Annotated[Annotated[str, Field(max_length=200)] | None, BeforeValidator(_blank_none)]
Slug = Annotated[Annotated[str, Field(max_length=100)] | None, BeforeValidator(_blank_none)]


class BillingRowIn(BaseModel):
    """One billed row: a provider's cost for a UTC day, maybe of one model and project."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    date: Day = Field(description="the UTC day billed, YYYY-MM-DD")
    provider: str = Field(
        description="the provider, lowercase (openai, anthropic, mistral, …): letters, digits, "
        ". _ -, at most 64"
    )
    model: Text = Field(default=None, description="the model billed, as the provider names it")
    project: Slug = Field(
        default=None, description="a Costboard project's slug (the key's project when absent)"
    )
    cost_usd: Money
    input_tokens: Tokens = Field(default=None, description="input tokens billed, if reported")
    output_tokens: Tokens = Field(default=None, description="output tokens billed, if reported")

    @field_validator("provider", mode="before")
    @classmethod
    def _provider(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip().lower()
            if not _PROVIDER.fullmatch(value):
                raise ValueError(
                    f"{value[:40]!r} is not a provider name: lowercase letters, digits, . _ -, "
                    "at most 64 (e.g. mistral)"
                )
        return value


class BillingRowsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rows: Annotated[list[BillingRowIn], Field(min_length=1, max_length=MAX_ROWS)]


@dataclass(frozen=True, slots=True)
class UploadRow:
    """A validated row with its project resolved (None: no project)."""

    day: date
    provider: str
    model: str | None
    project_id: int | None
    cost_usd: Decimal
    input_tokens: int | None
    output_tokens: int | None


def _errors(exc: ValidationError, *, offset: int = 0) -> list[dict[str, Any]]:
    errors = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        index: int | None = None
        if loc[:1] == ["rows"] and len(loc) > 1 and loc[1].isdigit():
            index, loc = int(loc[1]) + offset, loc[2:]
        field = ".".join(loc) or "rows"
        message = str(error["msg"]).removeprefix("Value error, ")
        errors.append({"index": index, "field": field, "message": message})
    return errors


def rows_from_json(
    payload: Any, *, default_project: Project | None, key_project: bool = False
) -> list[UploadRow]:
    """`{"rows": [...]}` as validated rows, or UploadError. `key_project`: the rows come with
    an API key, whose project is `default_project`: a row may name only that project (the key
    decides the project; a bill across projects is uploaded in the admin)."""
    try:
        parsed = BillingRowsIn.model_validate(payload)
    except ValidationError as exc:
        raise UploadError(_errors(exc)) from None
    return _sums_checked(_resolved(parsed.rows, default_project, key_project=key_project))


# A day's billed cost for a provider and a project is kept (and judged for drift) as one
# numeric(24, 12): below 10^12 USD either way
_MAX_DAY_SUM = Decimal(10**12)


def _sums_checked(rows: list[UploadRow]) -> list[UploadRow]:
    """The rows, unless those of one (date, provider, project) add up past what a day's
    billed cost is kept in (UploadError naming the first such date and provider)."""
    sums: dict[tuple[date, str, int | None], Decimal] = defaultdict(Decimal)
    for row in rows:
        sums[(row.day, row.provider, row.project_id)] += row.cost_usd
    for (day, provider, _), total in sums.items():
        if abs(total) >= _MAX_DAY_SUM:
            message = (
                f"the rows of {day} and {provider} add up to {total} USD for one project: a "
                "day's bill is below 10^12 USD; check the amounts (cost_usd is in dollars)"
            )
            raise UploadError([{"index": None, "field": "cost_usd", "message": message}])
    return rows


def rows_from_csv(
    text: str, *, default_project: Project | None, key_project: bool = False
) -> list[UploadRow]:
    """A CSV with a header row of the columns (date, provider, cost_usd required; model,
    project, input_tokens, output_tokens optional) as validated rows, or UploadError; a
    row's index counts the data rows from 0 (the header is not one). A cell holding NUL is
    refused naming its row and column; a token cell is read as a number only when it is
    ASCII digits, else the model refuses it in words."""
    # newline="": lines end in LF, CRLF or a lone CR (a spreadsheet's "CSV (Macintosh)"),
    # and a quoted cell keeps its own line breaks
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""))
    try:
        header = [name.strip().lower() for name in next(reader)]
    except (StopIteration, csv.Error):
        raise UploadError(
            [{"index": None, "field": "body", "message": f"no header row: {', '.join(COLUMNS)}"}]
        ) from None
    unknown = [name for name in header if name not in COLUMNS]
    missing = [name for name in REQUIRED if name not in header]
    if unknown or missing or len(set(header)) != len(header):
        wrong = (
            f"unknown column {unknown[0]!r}"
            if unknown
            else f"no column {missing[0]!r}"
            if missing
            else "a column named twice"
        )
        raise UploadError(
            [
                {
                    "index": None,
                    "field": unknown[0] if unknown else missing[0] if missing else "header",
                    "message": f"{wrong}: the header names {', '.join(REQUIRED)} and any of "
                    f"{', '.join(c for c in COLUMNS if c not in REQUIRED)}",
                }
            ]
        )
    records: list[dict[str, Any]] = []
    faults: list[dict[str, Any]] = []  # NUL (PostgreSQL's text refuses it), token cells
    try:
        for number, cells in enumerate(reader):
            if not any(cell.strip() for cell in cells):
                continue  # a blank line
            if len(cells) != len(header):
                raise UploadError(
                    [
                        {
                            "index": len(records),
                            "field": "row",
                            "message": f"line {number + 2} has {len(cells)} cells, the header "
                            f"{len(header)}",
                        }
                    ]
                )
            record: dict[str, Any] = dict(zip(header, cells, strict=True))
            for name, cell in record.items():
                fault = text_fault(cell)
                if fault is not None:
                    faults.append({"index": len(records), "field": name, "message": fault})
            for name in ("input_tokens", "output_tokens"):
                cell = str(record.get(name) or "").strip()
                if _TOKEN_CELL.fullmatch(cell):
                    record[name] = int(cell)
                elif cell:
                    faults.append(
                        {"index": len(records), "field": name, "message": _no_count(cell)}
                    )
            records.append(record)
    except csv.Error as exc:
        raise UploadError(
            [{"index": None, "field": "body", "message": f"not CSV: {exc}"}]
        ) from None
    if faults:
        raise UploadError(faults)
    if not records:
        raise UploadError([{"index": None, "field": "rows", "message": "no rows under the header"}])
    return rows_from_json(
        {"rows": records}, default_project=default_project, key_project=key_project
    )


def _no_count(cell: str) -> str:
    """Why a CSV token cell that is not ASCII digits (or is too many of them) is refused."""
    shown = repr(cell) if len(cell) <= 24 else f"{cell[:20]!r}… ({len(cell)} characters)"
    return f"{shown} is not a token count: {_TOKENS_FORM}"


def _resolved(
    rows: list[BillingRowIn], default_project: Project | None, *, key_project: bool
) -> list[UploadRow]:
    if key_project:
        if default_project is None:
            raise ValueError("rows sent with a key are its project's: name the project")
        found = {default_project.slug: default_project.pk}
        # the same answer whether another project exists or not: a key learns nothing of them
        fault = (
            f"is not this key's project ({default_project.slug}): a key sends its own "
            "project's rows; leave project out, send another project's rows with a key of "
            "that project, or upload a bill across projects in the admin (Billed usage → "
            "Upload a CSV bill)"
        )
    else:
        slugs = {row.project for row in rows if row.project}
        found = dict(Project.objects.filter(slug__in=slugs).values_list("slug", "pk"))
        fault = "is no project: name a project by its slug (the admin's Projects list), or " + (
            f"leave it out for the project chosen beside the file ({default_project.slug})"
            if default_project
            else "leave it out for none"
        )
    errors = [
        {"index": index, "field": "project", "message": f"{row.project!r} {fault}"}
        for index, row in enumerate(rows)
        if row.project and row.project not in found
    ]
    if errors:
        raise UploadError(errors)
    default = default_project.pk if default_project else None
    return [
        UploadRow(
            day=row.date,
            provider=row.provider,
            model=row.model,
            project_id=found[row.project] if row.project else default,
            cost_usd=row.cost_usd,
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens,
        )
        for row in rows
    ]
