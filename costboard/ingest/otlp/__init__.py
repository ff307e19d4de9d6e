"""OTLP/HTTP traces (docs/api.md, "OTLP traces"), wholly in ingest: a body decoded
(decode.py, against json_models.py), its spans mapped to steps (mapping.py), their turns
numbered (turns.py) and stored in chunks (store.py). The view only decodes, stores, answers."""

from costboard.ingest.otlp.decode import (
    JSON,
    MAX_SPANS,
    PROTOBUF,
    OtlpError,
    otlp_decode,
    otlp_read,
    otlp_response,
    otlp_status,
)
from costboard.ingest.otlp.mapping import OtlpMapping, OtlpSpan, otlp_spans
from costboard.ingest.otlp.store import OtlpUnavailable, otlp_store

__all__ = [
    "JSON",
    "MAX_SPANS",
    "PROTOBUF",
    "OtlpError",
    "OtlpMapping",
    "OtlpSpan",
    "OtlpUnavailable",
    "otlp_decode",
    "otlp_read",
    "otlp_response",
    "otlp_spans",
    "otlp_status",
    "otlp_store",
]
