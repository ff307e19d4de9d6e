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


_MEMORY_TYPES = ["user", "feedback", "project", "reference"]

_MEMORY = {
    "type": "object",
    "required": [
        "id",
        "type",
        "content",
        "scope",
        "status",
        "importance",
        "tags",
        "ttl_days",
        "times_proposed",
        "created_at",
        "merged",
    ],
    "properties": {
        "id": {"type": "integer"},
        "type": {"type": "string", "enum": _MEMORY_TYPES},
        "content": {"type": "string", "maxLength": 150},
        "scope": {"type": "string", "description": '"project" or "user:<user_id>"'},
        "status": {
            "type": "string",
            "enum": ["pending", "approved", "rejected", "expired", "merged"],
            "description": "a new candidate is pending; a person approves it",
        },
        "importance": {"type": "number", "minimum": 0, "maximum": 1},
        "source": {"type": "string", "enum": ["user_stated", "agent_inferred", "tool_output"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "ttl_days": {"type": ["integer", "null"]},
        "times_proposed": {"type": "integer"},
        "created_at": {"type": "string", "format": "date-time"},
        "merged": {
            "type": "boolean",
            "description": "true: the sentence (or a near duplicate) was already pending or "
            "approved in the scope; this is that memory, proposed once more",
        },
    },
}

_MEMORY_CANDIDATE = {
    "type": "object",
    "required": ["content", "type"],
    "properties": {
        "content": {
            "type": "string",
            "maxLength": 150,
            "description": "one sentence; spaces and newlines are made single spaces",
        },
        "type": {"type": "string", "enum": _MEMORY_TYPES},
        "scope": {"type": "string", "default": "project", "pattern": "^(project|user:.+)$"},
        "session_id": {"type": "string", "description": "a session of this project"},
        "importance": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.5},
        "tags": {"type": "array", "maxItems": 20, "items": {"type": "string"}},
        "ttl_days": {"type": "integer", "minimum": 1, "maximum": 36500},
    },
}

_COMPONENT = {"type": "number", "minimum": 0, "maximum": 1}

_MEMORY_SEARCH = {
    "type": "object",
    "required": ["retrieval_id", "results"],
    "properties": {
        "retrieval_id": {
            "type": "integer",
            "description": "this search in the retrieval log: send it with feedback",
        },
        "query": {"type": "string"},
        "scope": {"type": "string"},
        "k": {"type": "integer"},
        "results": {
            "type": "array",
            "description": "best first",
            "items": {
                "type": "object",
                "required": ["id", "type", "content", "score", "components"],
                "properties": {
                    "id": {"type": "integer"},
                    "type": {"type": "string", "enum": _MEMORY_TYPES},
                    "content": {"type": "string"},
                    "score": {
                        "type": "number",
                        "description": "Σ weight × component (COSTBOARD_MEMORY_WEIGHTS; by "
                        "default 0.5 relevance, 0.2 importance, 0.15 freshness, 0.15 "
                        "credibility), 4 decimal places",
                    },
                    "components": {
                        "type": "object",
                        "required": ["relevance", "importance", "freshness", "credibility"],
                        "properties": {
                            "relevance": {
                                **_COMPONENT,
                                "description": "full-text rank over the best match's (1 = "
                                "the best); trigram word similarity when no word matches",
                            },
                            "importance": _COMPONENT,
                            "freshness": {
                                **_COMPONENT,
                                "description": "0.5^(days since approval / half-life)",
                            },
                            "credibility": {
                                **_COMPONENT,
                                "description": "stated by the user 1, inferred by the agent "
                                "0.6, tool output 0.3",
                            },
                        },
                    },
                },
            },
        },
    },
}

_MEMORY_FEEDBACK = {
    "type": "object",
    "required": ["memory_id", "useful"],
    "properties": {
        "memory_id": {"type": "integer", "description": "a memory of this project"},
        "useful": {"type": "boolean"},
        "retrieval_id": {
            "type": ["integer", "null"],
            "description": "the search that returned it (its retrieval_id)",
        },
    },
}


def _error_response(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Errors"}}},
    }


def _count_header(description: str) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "integer"}}


@cache
def openapi_document() -> dict[str, Any]:
    # Imported here: costboard.api.context imports costboard.api.events, which imports this module.
    from costboard.api.context import MAX_CONTEXT_BUDGET

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
    schemas["Memory"] = _MEMORY
    schemas["MemoryCandidate"] = _MEMORY_CANDIDATE
    schemas["MemorySearch"] = _MEMORY_SEARCH
    schemas["MemoryFeedback"] = _MEMORY_FEEDBACK
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
    memory_ref = {"$ref": "#/components/schemas/Memory"}
    scope_parameter = {
        "name": "scope",
        "in": "query",
        "required": False,
        "description": '"project" or "user:<user_id>"',
        "schema": {"type": "string", "default": "project"},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Costboard API",
            "version": "1",
            "description": "Report LLM usage; read session budgets; propose and search agent "
            "memories. Token semantics are "
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
            "/api/v1/memory/candidates": {
                "post": {
                    "summary": "Propose a memory: a pending candidate until a person approves it",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/MemoryCandidate"}
                            }
                        },
                    },
                    "responses": {
                        "201": {
                            "description": "a new pending candidate",
                            "content": {"application/json": {"schema": memory_ref}},
                        },
                        "200": {
                            "description": "the scope already had it (or a near duplicate), "
                            'pending or approved: that memory, proposed once more, "merged": '
                            "true",
                            "content": {"application/json": {"schema": memory_ref}},
                        },
                        "400": _error_response("malformed JSON"),
                        "409": _error_response(
                            "the same sentence was rejected before in this scope (field content)"
                        ),
                        "422": _error_response(
                            "invalid content, type, scope, importance, tags, ttl_days or an "
                            "unknown session_id; the field is named"
                        ),
                        **auth_errors,
                    },
                }
            },
            "/api/v1/memory/MEMORY.md": {
                "get": {
                    "summary": "The scope's approved, live memories as MEMORY.md",
                    "description": "One `[type] content` line each, most important first (then "
                    "the newest); at most 200 lines and 25,000 bytes, cut at a line boundary.",
                    "parameters": [scope_parameter],
                    "responses": {
                        "200": {
                            "description": "MEMORY.md",
                            "headers": {
                                "X-Memory-Lines": _count_header("lines (entries) served"),
                                "X-Memory-Bytes": _count_header("bytes served, UTF-8"),
                                "X-Memory-Total": _count_header("live entries in the scope"),
                                "X-Memory-Cut": _count_header("entries the caps left out"),
                            },
                            "content": {"text/markdown": {"schema": {"type": "string"}}},
                        },
                        "422": _error_response("bad scope"),
                        **auth_errors,
                    },
                }
            },
            "/api/v1/memory/search": {
                "get": {
                    "summary": "The k best live memories of a scope for a query, each score "
                    "with its components; logged for feedback",
                    "parameters": [
                        {
                            "name": "q",
                            "in": "query",
                            "required": True,
                            "description": "words to look for (web-search syntax: quotes, "
                            "or, -word)",
                            "schema": {"type": "string", "maxLength": 500},
                        },
                        scope_parameter,
                        {
                            "name": "k",
                            "in": "query",
                            "required": False,
                            "schema": {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": 50,
                                "default": 5,
                            },
                        },
                    ],
                    "responses": {
                        "200": {
                            "description": "the results, best first",
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/MemorySearch"}
                                }
                            },
                        },
                        "422": _error_response("q missing or too long, bad scope, k not 1 to 50"),
                        **auth_errors,
                    },
                }
            },
            "/api/v1/memory/feedback": {
                "post": {
                    "summary": "Say whether a retrieved memory was useful",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/MemoryFeedback"}
                            }
                        },
                    },
                    "responses": {
                        "201": {"description": "stored"},
                        "400": _error_response("malformed JSON"),
                        "404": _error_response("no such memory (or search) in this project"),
                        "422": _error_response("memory_id, useful or retrieval_id invalid"),
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
            "/v1/traces": {
                "post": {
                    "summary": "OTLP/HTTP traces: GenAI spans become steps, one trace one turn",
                    "description": "An ExportTraceServiceRequest (opentelemetry-proto) as "
                    "protobuf or OTLP JSON, optionally with Content-Encoding: gzip (at most 5 "
                    "MB decompressed). The key as Authorization: Bearer or x-costboard-key. "
                    "gen_ai.usage.input_tokens includes cached tokens: cache reads and writes "
                    "are subtracted. A span is a step (event_id otlp:<trace_id>:<span_id>, so a "
                    "replay is a duplicate); its session is gen_ai.conversation.id, else "
                    "session.id, else the system session.",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/x-protobuf": {"schema": {"type": "string"}},
                            "application/json": {"schema": {"type": "object"}},
                        },
                    },
                    "responses": {
                        "200": {
                            "description": "an ExportTraceServiceResponse in the request's "
                            "format; partialSuccess.rejectedSpans counts the spans not stored",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {
                                            "partialSuccess": {
                                                "type": "object",
                                                "properties": {
                                                    "rejectedSpans": {"type": "string"},
                                                    "errorMessage": {"type": "string"},
                                                },
                                            }
                                        },
                                    }
                                }
                            },
                        },
                        "400": {"description": "undecodable body: a google.rpc.Status"},
                        "413": {"description": "body over 5 MB (decompressed): a Status"},
                        "415": _error_response("not application/x-protobuf or application/json"),
                        **auth_errors,
                    },
                }
            },
        },
    }
