"""The OpenAPI document of the JSON API, built from the same pydantic models that validate."""

from __future__ import annotations

from functools import cache
from typing import Any

from costboard.ingest.schemas import MAX_EVENTS, event_json_schemas

_BUDGET = {
    "type": "object",
    "required": [
        "session_id",
        "state",
        "runaway",
        "tokens_used",
        "token_cap",
        "cost_usd",
        "cost_cap_usd",
        "turns",
        "steps",
        "warned_at",
        "exhausted_at",
    ],
    "properties": {
        "session_id": {"type": "string"},
        "state": {"type": "string", "enum": ["ok", "warning", "exhausted"]},
        "runaway": {"type": "boolean"},
        "tokens_used": {"type": "integer", "description": "input + output tokens"},
        "token_cap": {"type": "integer"},
        "cost_usd": {"type": "string", "description": "decimal USD"},
        "cost_cap_usd": {"type": "string", "description": "decimal USD"},
        "turns": {"type": "integer"},
        "steps": {"type": "integer"},
        "warned_at": {"type": ["string", "null"], "format": "date-time"},
        "exhausted_at": {"type": ["string", "null"], "format": "date-time"},
    },
}

_ERRORS = {
    "type": "object",
    "properties": {
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "index": {"type": ["integer", "null"]},
                    "field": {"type": "string"},
                    "message": {"type": "string"},
                },
            },
        }
    },
}


def _error_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Errors"}}},
    }


@cache
def openapi_document() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for name, schema in event_json_schemas().items():
        schemas.update(schema.pop("$defs", {}))
        schemas[name] = schema
    event_ref = {
        "oneOf": [
            {"$ref": "#/components/schemas/StepEvent"},
            {"$ref": "#/components/schemas/TurnEvent"},
            {"$ref": "#/components/schemas/SessionEvent"},
        ]
    }
    schemas["Budget"] = _BUDGET
    schemas["Errors"] = _ERRORS
    schemas["BudgetEvent"] = {
        "type": "object",
        "properties": {
            "kind": {"type": "string"},
            "at": {"type": "string", "format": "date-time"},
            "tokens_used": {"type": "integer"},
            "cost_usd": {"type": "string"},
            "detail": {"type": "object"},
        },
    }
    auth_errors = {"401": _error_response("missing, unknown or revoked key")}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Costboard API",
            "version": "1",
            "description": "Report LLM usage; read session budgets. Token semantics are "
            "Anthropic's: input_tokens excludes cache reads and writes.",
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/api/v1/events": {
                "post": {
                    "summary": "Ingest one event or a batch (all or nothing)",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "oneOf": [
                                        event_ref,
                                        {
                                            "type": "object",
                                            "required": ["events"],
                                            "properties": {
                                                "events": {
                                                    "type": "array",
                                                    "minItems": 1,
                                                    "maxItems": MAX_EVENTS,
                                                    "items": event_ref,
                                                }
                                            },
                                        },
                                    ]
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": {
                            "description": "stored",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {
                                            "accepted": {"type": "integer"},
                                            "duplicates": {"type": "integer"},
                                            "sessions": {
                                                "type": "object",
                                                "additionalProperties": {
                                                    "$ref": "#/components/schemas/Budget"
                                                },
                                            },
                                        },
                                    }
                                }
                            },
                        },
                        "400": _error_response("malformed JSON"),
                        "413": _error_response("body over 5 MB"),
                        "422": _error_response("invalid events; nothing stored"),
                        **auth_errors,
                    },
                }
            },
            "/api/v1/sessions/{session_id}/budget": {
                "get": {
                    "summary": "A session's budget and its budget events, oldest first",
                    "parameters": [
                        {
                            "name": "session_id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": {
                            "description": "the budget",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "allOf": [
                                            {"$ref": "#/components/schemas/Budget"},
                                            {
                                                "type": "object",
                                                "properties": {
                                                    "events": {
                                                        "type": "array",
                                                        "items": {
                                                            "$ref": "#/components/schemas/"
                                                            "BudgetEvent"
                                                        },
                                                    }
                                                },
                                            },
                                        ]
                                    }
                                }
                            },
                        },
                        "404": _error_response("no such session in this project"),
                        **auth_errors,
                    },
                }
            },
            "/api/v1/openapi.json": {
                "get": {
                    "summary": "This document",
                    "security": [],
                    "responses": {"200": {"description": "OpenAPI 3.1"}},
                }
            },
        },
    }
