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

_CONTEXT_TURN = {
    "type": "object",
    "required": [
        "number",
        "user_message",
        "assistant_response",
        "tokens",
        "estimated",
        "started_at",
    ],
    "properties": {
        "number": {"type": "integer"},
        "user_message": {"type": "string"},
        "assistant_response": {"type": "string"},
        "tokens": {
            "type": "integer",
            "description": "user message + assistant response as loaded: the message is "
            "ceil(characters / 4); the response is the output − reasoning tokens of the "
            "turn's one successful `response` step if it has one, else ceil(characters / 4)",
        },
        "estimated": {
            "type": "boolean",
            "description": "some of the turn's text was counted as ceil(characters / 4)",
        },
        "started_at": {"type": "string", "format": "date-time"},
    },
}

_CONTEXT = {
    "type": "object",
    "required": [
        "session_id",
        "budget",
        "token_count",
        "total_turns",
        "loaded_turns",
        "should_summarize",
        "turns",
    ],
    "properties": {
        "session_id": {"type": "string"},
        "budget": {"type": "integer"},
        "token_count": {"type": "integer", "description": "tokens of the loaded turns"},
        "total_turns": {"type": "integer"},
        "loaded_turns": {"type": "integer"},
        "should_summarize": {
            "type": "boolean",
            "description": "the history is past 80% of the budget: token_count > 0.8 × "
            "budget, or turns were left out",
        },
        "turns": {
            "type": "array",
            "description": "the newest turns that fit, oldest first",
            "items": {"$ref": "#/components/schemas/ContextTurn"},
        },
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
    # Imported here: costboard.context imports costboard.api, which imports this module.
    from costboard.context import MAX_CONTEXT_BUDGET

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
    schemas["SessionContext"] = _CONTEXT
    schemas["ContextTurn"] = _CONTEXT_TURN
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
            "/api/v1/sessions/{session_id}/context": {
                "get": {
                    "summary": "The session's newest turns that fit in a token budget, "
                    "oldest first",
                    "parameters": [
                        {
                            "name": "session_id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        },
                        {
                            "name": "budget",
                            "in": "query",
                            "required": True,
                            "description": "the most tokens of history to load",
                            "schema": {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": MAX_CONTEXT_BUDGET,
                            },
                        },
                    ],
                    "responses": {
                        "200": {
                            "description": "the loaded turns; loading stops at the first "
                            "turn (newest first) that does not fit",
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/SessionContext"}
                                }
                            },
                        },
                        "404": _error_response("no such session in this project"),
                        "422": _error_response(
                            "budget missing, not a whole number, or out of range"
                        ),
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
