"""`POST /api/v1/billing` (docs/api.md, "Billing"; keys with the `admin` role): what a provider
billed, for any provider or from an invoice, as JSON `{"rows": [...]}` or as CSV with a header
row of the same columns. The rows are validated whole (422 naming the row's index and field,
nothing stored); they are the key's project's (a row naming another project is refused, in the
same words whether that project exists or not), and each (date, provider) they name has the
project's rows sent this way replaced by them. A bill across projects is the admin's upload."""

from __future__ import annotations

from typing import Annotated, cast

from django.http import HttpRequest, HttpResponse
from pydantic import Field

from costboard.api.boundary import (
    ApiError,
    ApiRequest,
    Operation,
    Reply,
    endpoint,
    json_object,
    model_response,
    read_body,
)
from costboard.api.schemas import Answer
from costboard.billing.services import billing_rows_replace
from costboard.billing.uploads import (
    COLUMNS,
    EXAMPLE,
    MAX_ROWS,
    BillingRowsIn,
    UploadError,
    UploadRow,
    rows_from_csv,
    rows_from_json,
)
from costboard.json_types import Count
from costboard.models import BilledUsage

ADMIN = ("admin",)
CSV = "text/csv"
MAX_BODY = 5 * 1024 * 1024


class BillingDay(Answer):
    date: str = Field(description="a UTC day the rows named, YYYY-MM-DD")
    provider: str


class BillingStored(Answer):
    stored: Count = Field(description="the rows stored")
    replaced: Count = Field(
        description="the rows sent before for the same (date, provider), replaced"
    )
    days: Annotated[list[BillingDay], Field(description="each (date, provider) named, in order")]


BILLING = Operation(
    method="POST",
    summary="Store what a provider billed (any provider, or an invoice), as JSON or CSV",
    description="Rows of `date` (a UTC day), `provider`, `cost_usd`, and optionally `model`, "
    "`project` (the key's project's slug, its default; another project's rows are sent "
    "with that project's key) and `input_tokens` / `output_tokens`. "
    f"`Content-Type: {CSV}` sends a CSV whose header row names the columns "
    f"({', '.join(COLUMNS)}; date, provider and cost_usd required). At most {MAX_ROWS} rows. "
    "Each (date, provider) the rows name has the project's rows sent this way (JSON or CSV) "
    "before replaced by them, so sending the same rows again changes nothing; the rows "
    "imported from a provider's API and those uploaded in the admin are kept apart.",
    roles=ADMIN,
    body=BillingRowsIn,
    body_alternatives={CSV: {"schema": {"type": "string"}}},
    responses={200: Reply("stored", BillingStored)},
)


@endpoint(BILLING)
def billing(request: HttpRequest) -> HttpResponse:
    project = cast(ApiRequest, request).project
    try:
        if request.content_type == CSV:
            body = read_body(request, limit=MAX_BODY, what="send fewer rows")
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                raise ApiError(422, "body", "the CSV is not UTF-8: save it as UTF-8") from None
            rows: list[UploadRow] = rows_from_csv(text, default_project=project, key_project=True)
        else:
            payload = json_object(request, limit=MAX_BODY, example=EXAMPLE)
            rows = rows_from_json(payload, default_project=project, key_project=True)
    except UploadError as exc:
        raise ApiError.of(422, exc.errors) from None
    done = billing_rows_replace(rows, source=BilledUsage.Source.API, project=project)
    return model_response(
        BillingStored(
            stored=done.stored,
            replaced=done.replaced,
            days=[BillingDay(date=day.isoformat(), provider=name) for day, name in done.days],
        )
    )
