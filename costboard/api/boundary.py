"""The API's one boundary: every JSON endpoint is a view decorated with `endpoint(Operation)`.

The decorator answers wrong methods (405), overlong query strings (414) and query parameters
holding NUL, control characters or bytes that are not UTF-8 (422, costboard/query_text.py),
resolves the key
(`Authorization: Bearer` or `X-Costboard-Key`) to `request.project` on a typed `ApiRequest`
(401 otherwise), holds the key to its requests per second (costboard/api/ratelimit.py) and
its requests in flight (costboard/api/inflight.py: the slot is held while the view runs, and
given back however it ends) with a 429, refuses a body it cannot read (411 chunked, 415
Content-Type), and turns
every refusal the view raises into the API's error body
`{"errors": [{"index", "field", "message"}]}` with its status: an `ApiError`, which `parse`
makes of the client's pydantic `ValidationError`, or ingest's `BatchError`. A ValidationError
that escapes a view is the server's own (an answer that broke its model): a 500, not a 422.
The `Operation` it records on the view is what costboard/api/openapi.py documents, so the
URLconf, the views and the OpenAPI document cannot drift apart. What no endpoint answers (an
unknown path, an unexpected failure, a database outage) is costboard/api/failures.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import wraps
from typing import Annotated, Any, Literal, TypeVar, cast

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from pydantic import AfterValidator, BaseModel, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

from costboard.api.encoding import BodyRefused, decoded_body
from costboard.api.inflight import Busy, in_flight
from costboard.api.ratelimit import rate_limit_check
from costboard.ingest.json_body import MAX_DEPTH, bad_text, json_loads, too_deep
from costboard.ingest.otlp import PROTOBUF, otlp_status
from costboard.ingest.schemas import BatchError, validation_errors
from costboard.input_limits import text_fault
from costboard.models import ApiKey, Project
from costboard.projects import key_for
from costboard.query_text import query_faults

# Longer query strings are refused (414) before anything reads them: the longest useful one
# (a 500-character search in any script, percent-encoded, and a scope) fits well within.
MAX_QUERY_STRING = 8 * 1024

View = Callable[..., HttpResponse]
Model = TypeVar("Model", bound=BaseModel)


class ApiRequest(HttpRequest):
    """A request whose key was checked: `project` is the key's project, `api_key` the key
    (its prefix and role)."""

    project: Project
    api_key: ApiKey


class ApiError(Exception):
    """A refusal: the HTTP status and the error items of the API's error body."""

    def __init__(
        self,
        status: int,
        field: str | None,
        message: str,
        *,
        index: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.errors = [{"index": index, "field": field, "message": message}]
        self.headers = dict(headers or {})

    @classmethod
    def of(cls, status: int, errors: list[dict[str, Any]]) -> ApiError:
        """A refusal with several error items (one per field at fault)."""
        refused = cls(status, errors[0]["field"], errors[0]["message"], index=errors[0]["index"])
        refused.errors = errors
        return refused


def errors_response(
    status: int, errors: list[dict[str, Any]], *, headers: Mapping[str, str] | None = None
) -> JsonResponse:
    response = JsonResponse({"errors": errors}, status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def error_response(status: int, field: str | None, message: str) -> JsonResponse:
    return errors_response(status, [{"index": None, "field": field, "message": message}])


def refusal(exc: ApiError | BatchError | ValidationError) -> JsonResponse:
    """The one error mapper: any refusal as the API's error body and status."""
    if isinstance(exc, ValidationError):
        return errors_response(422, validation_errors(exc))
    if isinstance(exc, BatchError):
        return errors_response(exc.status, exc.errors)
    return errors_response(exc.status, exc.errors, headers=exc.headers)


def model_response(body: BaseModel, *, status: int = 200) -> JsonResponse:
    return JsonResponse(body.model_dump(mode="json"), status=status)


def typed_response(adapter: TypeAdapter[Any], body: Any, *, status: int = 200) -> JsonResponse:
    """A TypedDict's answer, checked and written as `model_response` writes a model's."""
    return JsonResponse(
        adapter.dump_python(adapter.validate_python(body), mode="json"), status=status
    )


def no_content() -> HttpResponse:
    """204: no body, so no Content-Type (Django would say text/html)."""
    response = HttpResponse(status=204)
    del response["Content-Type"]
    return response


# --- keys -------------------------------------------------------------------------------------


def bearer_key(request: HttpRequest) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get("X-Costboard-Key", "").strip()


def _key_or_refusal(request: HttpRequest, operation: Operation) -> ApiKey | JsonResponse:
    raw_key = bearer_key(request)
    if not raw_key:
        return error_response(
            401, "Authorization", "missing API key: send Authorization: Bearer <key>"
        )
    key = key_for(raw_key)
    if key is None:
        return error_response(
            401,
            "Authorization",
            "unknown or revoked API key: create one with "
            "`python manage.py create_api_key <project>`",
        )
    roles = operation.allowed_roles
    if key.role not in roles:
        needed = " or ".join(roles)
        return error_response(
            403,
            "Authorization",
            f"this key's role is {key.role}; {operation.method} here needs a key with the "
            f"{needed} role: `python manage.py create_api_key {key.project.slug} --role "
            f"{roles[-1]}`",
        )
    return key


def _rate_limited(
    request: HttpRequest, operation: Operation, project: Project
) -> HttpResponse | None:
    """429 with Retry-After when this key is over its requests per second (ratelimit.py)."""
    refused = rate_limit_check(raw_key=bearer_key(request), project=project)
    if refused is None:
        return None
    message = (
        f"more than {refused.limit} requests in one second with this API key: retry after "
        f"{refused.retry_after} s (Retry-After), or raise the limit (the project's API rate "
        "limit in the admin, or COSTBOARD_API_RATE_LIMIT)" + _held_here(refused.share)
    )
    return _too_many(request, operation, message, refused.retry_after)


def _held_here(share: int | None) -> str:
    """What a refusal adds while the limits are held per process (Redis away)."""
    if share is None:
        return ""
    return (
        f"; the server's shared count is unavailable, so each of its processes admits "
        f"{share} until it is back"
    )


def _busy(request: HttpRequest, operation: Operation, busy: Busy) -> HttpResponse:
    """429 with Retry-After when this key already has its requests in flight (inflight.py)."""
    message = (
        f"this API key already has {busy.limit} request{'s' if busy.limit != 1 else ''} "
        "being answered, its most at once: "
        f"retry after {busy.retry_after} s (Retry-After) or when one of them is answered, send "
        "fewer at once (or smaller ones), or raise the limit (the project's API requests in "
        "flight in the admin, or COSTBOARD_API_MAX_IN_FLIGHT)" + _held_here(busy.share)
    )
    return _too_many(request, operation, message, busy.retry_after)


# google.rpc.Code RESOURCE_EXHAUSTED: what OTLP/HTTP's Status says with a 429
RESOURCE_EXHAUSTED = 8


def _too_many(
    request: HttpRequest, operation: Operation, message: str, retry_after: int
) -> HttpResponse:
    """A 429 naming the key, in the API's error body; an OTLP endpoint's (one that reads
    protobuf) as a google.rpc.Status in the request's format, as its other refusals are
    (costboard/api/otlp.py), the `errors` beside it in JSON."""
    headers = {"Retry-After": str(retry_after)}
    if PROTOBUF not in operation.body_alternatives:
        error = {"index": None, "field": "Authorization", "message": message}
        return errors_response(429, [error], headers=headers)
    content_type = PROTOBUF if request.content_type == PROTOBUF else JSON
    response = HttpResponse(
        otlp_status(RESOURCE_EXHAUSTED, message, content_type, "Authorization"),
        status=429,
        content_type=content_type,
    )
    response["Retry-After"] = headers["Retry-After"]
    return response


# --- what an endpoint is, for the views and the document --------------------------------------


@dataclass(frozen=True)
class Reply:
    """One documented response: a model (JSON; a TypeAdapter of a TypedDict answer, as
    `typed_response` writes it), a raw schema for another media type, or no body at all
    (`media_type` None, as a 204 answers: `no_content()`)."""

    description: str
    model: type[BaseModel] | TypeAdapter[Any] | None = None
    media_type: str | None = "application/json"
    schema: Mapping[str, Any] | None = None
    headers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # OpenAPI headers
    alternatives: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Operation:
    """An endpoint as the OpenAPI document shows it. 405 and 414 are added to every
    operation; 401, 429 and 503 to keyed ones; 400, 411, 413 and 415 to those with a body; 422
    to those that validate."""

    method: Literal["GET", "POST", "PATCH", "DELETE"]
    summary: str
    responses: Mapping[int, Reply]
    description: str = ""
    query: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    # media types beside the body model's application/json, e.g. OTLP's protobuf
    body_alternatives: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    path_parameters: Mapping[str, str] = field(default_factory=dict)  # name → description
    # request headers it reads: name → {"description", "schema"} (OpenAPI, optional headers)
    headers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    auth: bool = True
    tag: str = "usage"
    # the key roles that may call it (ApiKey.Role); None: reads are open to every role,
    # writes to ingest and admin keys
    roles: tuple[str, ...] | None = None

    @property
    def allowed_roles(self) -> tuple[str, ...]:
        if self.roles is not None:
            return self.roles
        if self.method == "GET":
            return ("ingest", "read", "admin")
        return ("ingest", "admin")


def endpoint(operation: Operation) -> Callable[[View], View]:
    """Make `view` an API endpoint described by `operation` (see the module's docstring)."""

    def decorate(view: View) -> View:
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method != operation.method:
                message = f"{request.method} is not allowed here: use {operation.method}"
                return errors_response(
                    405,
                    [{"index": None, "field": "method", "message": message}],
                    headers={"Allow": operation.method},
                )
            query_string = request.META.get("QUERY_STRING", "")
            if len(query_string) > MAX_QUERY_STRING:
                return error_response(
                    414,
                    "query",
                    f"the query string is {len(query_string)} bytes; at most "
                    f"{MAX_QUERY_STRING}: ask for less",
                )
            faulty = query_faults(query_string)
            if faulty is not None:  # before any view, or the database, reads them
                return errors_response(
                    422,
                    [
                        {"index": None, "field": name, "message": message}
                        for name, message in faulty.faults.items()
                    ],
                )
            if operation.auth:
                key = _key_or_refusal(request, operation)
                if isinstance(key, JsonResponse):
                    return key
                project = key.project
                cast(ApiRequest, request).project = project
                cast(ApiRequest, request).api_key = key
                limited = _rate_limited(request, operation, project)
                if limited is not None:
                    return limited
                with in_flight(raw_key=bearer_key(request), project=project) as busy:
                    if busy is not None:
                        return _busy(request, operation, busy)
                    return _answer(view, operation, request, *args, **kwargs)
            return _answer(view, operation, request, *args, **kwargs)

        api_view = csrf_exempt(wrapper)  # a key, not a cookie, says who is asking
        _OPERATIONS[api_view] = operation
        return api_view

    return decorate


def _answer(
    view: View, operation: Operation, request: HttpRequest, *args: Any, **kwargs: Any
) -> HttpResponse:
    """The view's answer to a request let in, or the refusal of its body or of the view."""
    unreadable = body_refusal(request, operation)
    if unreadable is not None:
        return refusal(unreadable)
    try:
        return view(request, *args, **kwargs)
    except (ApiError, BatchError) as exc:
        # a ValidationError that escapes is the server's (an answer's model): a 500
        return refusal(exc)


# view → its operation: what the OpenAPI document reads, walking the URLconf
_OPERATIONS: dict[Callable[..., Any], Operation] = {}


# a view answering several methods at one URL → its endpoints, one per method
_METHOD_VIEWS: dict[Callable[..., Any], list[Callable[..., Any]]] = {}


def operations_of(view: Callable[..., Any]) -> list[Operation]:
    """The operations a routed view answers: one, several (methods), or none (not an API
    view)."""
    if view in _METHOD_VIEWS:
        return [_OPERATIONS[each] for each in _METHOD_VIEWS[view]]
    operation = _OPERATIONS.get(view)
    return [operation] if operation is not None else []


def methods(*views: View) -> View:
    """One URL answered by several endpoints, one per method (GET, PATCH, DELETE of a
    budget); another method is a 405 naming those allowed."""
    by_method: dict[str, View] = {_OPERATIONS[view].method: view for view in views}
    allow = ", ".join(by_method)

    @csrf_exempt
    def dispatch(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        view = by_method.get(request.method or "")
        if view is None:
            message = f"{request.method} is not allowed here: use {allow}"
            return errors_response(
                405,
                [{"index": None, "field": "method", "message": message}],
                headers={"Allow": allow},
            )
        return view(request, *args, **kwargs)

    _METHOD_VIEWS[dispatch] = list(views)
    return dispatch


# --- bodies: how they arrive -----------------------------------------------------------------

JSON = "application/json"
# `curl -d` without -H sends this; the body is read as JSON all the same (a JSON-only body).
LENIENT_CONTENT_TYPES = ("", "application/x-www-form-urlencoded")


def body_refusal(request: HttpRequest, operation: Operation) -> ApiError | None:
    """411 for a chunked body the server could not read, 415 for a Content-Type the operation
    does not read; None when the body (if the operation takes one) can be read."""
    if operation.body is None:
        return None
    chunked = "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()
    if chunked and not request.META.get("CONTENT_LENGTH"):
        # costboard.wsgi reads chunked bodies when the server decodes them (gunicorn);
        # this server did not, and Django reads only Content-Length bytes
        return ApiError(
            411,
            "Content-Length",
            "this server cannot read a chunked body: send the body with a Content-Length "
            "header (or run Costboard under gunicorn, which reads chunked bodies)",
        )
    accepted = (JSON, *operation.body_alternatives)
    given = request.content_type or ""
    if given in accepted or (not operation.body_alternatives and given in LENIENT_CONTENT_TYPES):
        return None
    return ApiError(
        415,
        "Content-Type",
        f"unsupported {given!r}: send the body as "
        + " or ".join(f"Content-Type: {media_type}" for media_type in accepted),
    )


# --- parsing ----------------------------------------------------------------------------------


def _no_bad_characters(value: str) -> str:
    fault = text_fault(value)
    if fault is not None:
        raise PydanticCustomError("text", fault)
    return value


# Text for PostgreSQL: no NUL, no unpaired surrogate (docs/api.md, "Limits").
SafeText = Annotated[str, AfterValidator(_no_bad_characters)]


def parse(model: type[Model], data: Any) -> Model:
    """`data` (a body, a query) as `model`, or a 422 naming each field at fault."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ApiError.of(422, validation_errors(exc, model)) from None


def parse_query(request: HttpRequest, model: type[Model]) -> Model:
    """The query string as `model`, or a 422 naming each parameter at fault: a parameter of
    the model given more than once too (`QueryDict.dict()` keeps the last value and drops
    the others unsaid; none of the API's parameters is a list)."""
    repeated = repeated_parameters(request, model)
    if repeated:
        raise ApiError.of(422, repeated)
    return parse(model, request.GET.dict())


def repeated_parameters(request: HttpRequest, model: type[BaseModel]) -> list[dict[str, Any]]:
    """An error item for each of `model`'s parameters the query string gives more than once;
    a parameter the model does not name is the model's to refuse or ignore."""
    fields = {info.alias or name: info for name, info in model.model_fields.items()}
    errors = []
    for name, values in request.GET.lists():
        if len(values) < 2 or name not in fields:
            continue
        given = ", ".join(repr(value[:40]) for value in values[:5])
        message = f"given {len(values)} times ({given}{', …' if len(values) > 5 else ''}): "
        message += f"give `{name}` once"
        if "comma-separated" in (fields[name].description or ""):  # group_by
            message += ", its values comma-separated in it"
        errors.append({"index": None, "field": name, "message": message})
    return errors


def path_text(name: str, value: str) -> str:
    """A text path parameter, refused (422) if PostgreSQL could not compare it."""
    fault = text_fault(value)
    if fault is not None:
        raise ApiError(422, name, fault)
    return value


def read_body(request: HttpRequest, *, limit: int, what: str) -> bytes:
    """The body, decompressed if it came with Content-Encoding: gzip, or 413 past `limit`
    bytes, compressed or not (told by Content-Length before it is read); 400 for a gzip body
    that is not, 415 for another coding (costboard/api/encoding.py)."""
    try:
        return decoded_body(request, limit=limit, what=what)
    except BodyRefused as exc:
        raise ApiError(exc.status, exc.field, exc.message, headers=exc.headers) from None


def json_object(request: HttpRequest, *, limit: int, example: str) -> dict[str, Any]:
    """A small JSON object body (maybe gzip), checked whole: 413 past `limit`, 400 if
    malformed, 422 if not an object, nested past 32 levels, or holding NUL or unpaired
    surrogates."""
    body = read_body(request, limit=limit, what="send less")
    try:
        payload = json_loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(
            400, "body", f"malformed JSON ({exc}): send a JSON object, e.g. {example}"
        ) from None
    except RecursionError:
        raise ApiError(422, "body", f"nests deeper than {MAX_DEPTH} levels: flatten it") from None
    if not isinstance(payload, dict):
        raise ApiError(422, "body", f"must be a JSON object, e.g. {example}")
    found = bad_text(payload)
    if found is not None:
        raise ApiError(422, found[0], found[1])
    if too_deep(payload, MAX_DEPTH):
        raise ApiError(422, "body", f"nests deeper than {MAX_DEPTH} levels: flatten it")
    return payload
