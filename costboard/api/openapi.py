"""The OpenAPI 3.1 document of the API, generated, never typed by hand.

Its operations are the `Operation`s the API views are decorated with (costboard/api/boundary.py),
found by walking the URLconf, so every routed endpoint is documented at the path it is served
at; its schemas are the pydantic models that parse the requests and describe the answers.
Imports no view: the URLconf is read when the document is first asked for.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import replace
from functools import cache
from typing import Any, Literal

from django.urls import URLPattern, URLResolver, get_resolver
from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import JsonSchemaMode

from costboard.api.boundary import MAX_QUERY_STRING, Operation, Reply, operations_of
from costboard.api.encoding import HEADER as ENCODING_HEADER
from costboard.api.schemas import Errors
from costboard.ingest.json_body import MAX_DEPTH
from costboard.ingest.otlp import PROTOBUF

REF = "#/components/schemas/{model}"
# Django's `str` converter: one path segment
PATH_SEGMENT = {"type": "string", "minLength": 1, "pattern": "^[^/]+$"}
CONVERTERS: dict[str, dict[str, Any]] = {
    "str": PATH_SEGMENT,
    # Django's `path` converter: any text, `/` included (sent as %2F or as it is)
    "path": {"type": "string", "minLength": 1},
    "slug": {"type": "string", "pattern": "^[-a-zA-Z0-9_]+$"},
    "int": {"type": "integer", "minimum": 0},
}
# (model, mode) → its $ref, as TypeAdapter.json_schemas gives them
Refs = Mapping[Any, dict[str, Any]]
ALLOW_HEADER = {"description": "the method this path answers", "schema": {"type": "string"}}
RETRY_AFTER_HEADER = {
    "description": "whole seconds to wait before retrying",
    "required": True,
    "schema": {"type": "integer", "minimum": 1},
}
_PARAMETER = re.compile(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>")

DESCRIPTION = f"""Report LLM usage, read session budgets and context, propose and search agent
memories. The key (`Authorization: Bearer <key>`, or `X-Costboard-Key`) decides the project;
create one with `python manage.py create_api_key <project>`.

Every refusal is JSON `{{"errors": [{{"index", "field", "message"}}]}}`, the message saying what
to send instead. Each key may make at most its project's number of requests per second
(`COSTBOARD_API_RATE_LIMIT`, default 50) and have at most its number being answered at once
(`COSTBOARD_API_MAX_IN_FLIGHT`, default 2): beyond either, 429 with `Retry-After`. Text must not
hold NUL or unpaired surrogates, nor a query parameter control characters or bytes that are not
UTF-8 (422 naming it); objects nest at most {MAX_DEPTH} deep; a query string is at most
{MAX_QUERY_STRING} bytes; a JSON number with a zero fraction (100.0) is the integer it
equals; NaN and Infinity are not JSON (400).

JSON bodies are sent as `Content-Type: application/json`; no Content-Type, or curl's default
`application/x-www-form-urlencoded`, is read as JSON too; any other is 415. A chunked body
(`Transfer-Encoding: chunked`, no Content-Length) is read when the server decodes it
(gunicorn, as `make run` serves); a server that does not answers 411: send Content-Length.
A body may come compressed, `Content-Encoding: gzip`: its limits are those of the body
decompressed (413 past them, found without decompressing further), a body that is not gzip is
400 and another coding (br, deflate) 415 with `Accept-Encoding: gzip`.
Unknown paths under /api/ are a JSON 404; a database outage is a 503 with Retry-After. This
document is generated from the models the server validates with."""

STANDARD_ERRORS: dict[int, str] = {
    400: "malformed JSON, or Content-Encoding: gzip on a body that is not gzip",
    401: "missing, unknown or revoked key",
    403: "a key whose role may not do this (field Authorization names the role needed)",
    405: "another method: the Allow header names the one",
    411: "a chunked body (Transfer-Encoding: chunked) this server could not read: send "
    "Content-Length (under gunicorn, as `make run` serves, chunked bodies are read)",
    413: "body too large (compressed, or once decompressed)",
    414: f"query string over {MAX_QUERY_STRING} bytes",
    415: "a Content-Type this endpoint does not read (field Content-Type), or a "
    "Content-Encoding other than gzip (Accept-Encoding: gzip)",
    422: "invalid input (a body's field, or a query parameter holding NUL, a control "
    "character or bytes that are not UTF-8); the field is named",
    429: "more requests per second, or more at once, with this key than its project "
    "allows; nothing stored",
    503: "the database is unavailable: retry after Retry-After seconds",
}


def api_routes() -> Iterator[tuple[str, str, Operation]]:
    """(OpenAPI path, Django route, operation) of every routed API view."""
    yield from _walk(get_resolver().url_patterns, "")


def _walk(patterns: list[Any], prefix: str) -> Iterator[tuple[str, str, Operation]]:
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _walk(pattern.url_patterns, route)
        elif isinstance(pattern, URLPattern):
            for operation in operations_of(pattern.callback):
                yield "/" + _PARAMETER.sub(r"{\g<name>}", route), route, operation


def _path_parameters(route: str, operation: Operation) -> list[dict[str, Any]]:
    return [
        {
            "name": match["name"],
            "in": "path",
            "required": True,
            "description": operation.path_parameters.get(match["name"], ""),
            "schema": CONVERTERS.get(match["converter"] or "str", PATH_SEGMENT),
        }
        for match in _PARAMETER.finditer(route)
    ]


def _query_parameters(model: type[BaseModel], schemas: dict[str, Any]) -> list[dict[str, Any]]:
    schema = model.model_json_schema(ref_template=REF, mode="validation")
    schemas.update(schema.pop("$defs", {}))
    required = set(schema.get("required", []))
    parameters = []
    for name, prop in schema["properties"].items():
        prop = {key: value for key, value in prop.items() if key != "title"}
        description = prop.pop("description", "")
        parameters.append(
            {
                "name": name,
                "in": "query",
                "required": name in required,
                "description": description,
                "schema": prop,
            }
        )
    return parameters


# every body may come gzip (costboard/api/encoding.py); an operation may say more of it
CONTENT_ENCODING = {
    "description": "gzip when the body is gzip-compressed; the body's limits apply to it "
    "decompressed. Another coding is 415.",
    # not an enum: no value, identity, x-gzip and "gzip, identity" are read too
    "schema": {"type": "string", "examples": ["gzip"]},
}


def _header_parameters(operation: Operation) -> list[dict[str, Any]]:
    headers = dict(operation.headers)
    if operation.body is not None:
        headers.setdefault(ENCODING_HEADER, CONTENT_ENCODING)
    return [
        {
            "name": name,
            "in": "header",
            "required": False,
            "description": header.get("description", ""),
            "schema": dict(header["schema"]),
        }
        for name, header in headers.items()
    ]


def _content(media_type: str, schema: Any, alternatives: Any) -> dict[str, Any]:
    return {media_type: {"schema": schema}, **{m: {"schema": s} for m, s in alternatives.items()}}


def _response(reply: Reply, refs: Refs) -> dict[str, Any]:
    if reply.model is not None:
        schema = refs[(reply.model, "serialization")]
    elif reply.schema is not None:
        schema = dict(reply.schema)
    else:
        schema = refs[(Errors, "serialization")]
    response: dict[str, Any] = {"description": reply.description}
    if reply.media_type is not None:  # None: no body, so no content (a 204)
        response["content"] = _content(reply.media_type, schema, reply.alternatives)
    if reply.headers:
        response["headers"] = {name: dict(header) for name, header in reply.headers.items()}
    return response


def _replies(operation: Operation) -> dict[int, Reply]:
    replies = dict(operation.responses)
    # 422 on every one: a query parameter with NUL or a control character, whatever it is
    standard = [405, 414, 422]
    if operation.auth:  # the key is looked up in the database
        standard += [401, 403, 429, 503]
    if operation.body is not None:
        standard += [400, 411, 413, 415]
    if operation.auth and PROTOBUF in operation.body_alternatives and 400 in replies:
        # OTLP: the 429 is a google.rpc.Status in the request's format, as its 400 is
        status_body = replies[400]
        replies.setdefault(
            429,
            replace(
                status_body,
                description=STANDARD_ERRORS[429] + ": a google.rpc.Status in the request's format",
            ),
        )
    for status in standard:
        replies.setdefault(status, Reply(STANDARD_ERRORS[status]))
    for status, name, header in (
        (405, "Allow", ALLOW_HEADER),
        (429, "Retry-After", RETRY_AFTER_HEADER),
        (503, "Retry-After", RETRY_AFTER_HEADER),
    ):
        if status in replies and not replies[status].headers:
            replies[status] = replace(replies[status], headers={name: header})
    return dict(sorted(replies.items()))


def _operation(
    route: str,
    operation: Operation,
    schemas: dict[str, Any],
    refs: Refs,
    operation_id: str,
) -> dict[str, Any]:
    parameters = _path_parameters(route, operation)
    if operation.query is not None:
        parameters += _query_parameters(operation.query, schemas)
    parameters += _header_parameters(operation)
    document: dict[str, Any] = {
        "operationId": operation_id,
        "summary": operation.summary,
        "tags": [operation.tag],
    }
    if operation.description:
        document["description"] = operation.description
    if parameters:
        document["parameters"] = parameters
    if operation.body is not None:
        document["requestBody"] = {
            "required": True,
            "content": _content(
                "application/json",
                refs[(operation.body, "validation")],
                operation.body_alternatives,
            ),
        }
    responses: dict[str, Any] = {}
    for status, reply in _replies(operation).items():
        responses[str(status)] = _response(reply, refs)
    document["responses"] = responses
    if not operation.auth:
        document["security"] = []
    return document


Documented = type[BaseModel] | TypeAdapter[Any]  # a model, or a TypedDict answer's adapter


def _models(operations: list[Operation]) -> list[tuple[Documented, JsonSchemaMode]]:
    wanted: dict[tuple[Documented, JsonSchemaMode], None] = {(Errors, "serialization"): None}
    for operation in operations:
        if operation.body is not None:
            wanted[(operation.body, "validation")] = None
        for reply in operation.responses.values():
            if reply.model is not None:
                wanted[(reply.model, "serialization")] = None
    return list(wanted)


def _adapter(model: Documented) -> TypeAdapter[Any]:
    return model if isinstance(model, TypeAdapter) else TypeAdapter(model)


def _name(route: str, method: Literal["GET", "POST", "PATCH", "DELETE"]) -> str:
    """The operationId: the method, the path's words, then `By` each path parameter
    (`getBudgetsByBudgetId` beside `getBudgets`), so no two operations share one."""
    words = re.findall(r"[A-Za-z0-9]+", _PARAMETER.sub("", route).removeprefix("api/v1/"))
    by = [f"By{_camel(match['name'])}" for match in _PARAMETER.finditer(route)]
    return method.lower() + "".join(word.capitalize() for word in words) + "".join(by)


def _camel(name: str) -> str:
    return "".join(word.capitalize() for word in name.split("_"))


@cache
def openapi_document() -> dict[str, Any]:
    routes = list(api_routes())
    operations = [operation for _, _, operation in routes]
    keyed_models = _models(operations)
    refs, definitions = TypeAdapter.json_schemas(
        [(model, mode, _adapter(model)) for model, mode in keyed_models], ref_template=REF
    )
    schemas: dict[str, Any] = dict(definitions.get("$defs", {}))
    paths: dict[str, dict[str, Any]] = {}
    named: dict[str, str] = {}
    for path, route, operation in routes:
        operation_id = _name(route, operation.method)
        if operation_id in named:  # OpenAPI: an operationId names one operation
            raise ValueError(f"{operation_id} names {named[operation_id]} and {route}")
        named[operation_id] = route
        paths.setdefault(path, {})[operation.method.lower()] = _operation(
            route, operation, schemas, refs, operation_id
        )
    return {
        "openapi": "3.1.0",
        "info": {"title": "Costboard API", "version": "1", "description": DESCRIPTION},
        "tags": [
            {"name": "usage", "description": "events, budgets, context, OpenTelemetry"},
            {"name": "memory", "description": "candidates, MEMORY.md, search, feedback"},
            {"name": "documentation", "description": "this document"},
        ],
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "an API key"},
                "costboardKey": {"type": "apiKey", "in": "header", "name": "X-Costboard-Key"},
            },
        },
        "security": [{"bearer": []}, {"costboardKey": []}],
        "paths": paths,
    }
