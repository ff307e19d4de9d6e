"""`Idempotency-Key` on `POST /api/v1/events` (docs/api.md, "Idempotency"): the header read,
and the answer made from what the service (costboard/ingest/idempotency.py: the key's claim,
its stored answer and its replay, in the ingest's transaction) returns.

Replays answer the stored JSON with `Idempotent-Replayed: true` and are not counted in
/metrics again. The same key with another body is 422 naming `Idempotency-Key`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, JsonResponse

from costboard.api.boundary import ApiError
from costboard.ingest.idempotency import KeyReused, idempotent_run
from costboard.models import Project

KEY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255
_KEY = re.compile(rf"[!-~]{{1,{MAX_KEY_LENGTH}}}")  # printable ASCII, no spaces


def idempotency_key(request: HttpRequest) -> str | None:
    """The request's Idempotency-Key (None without one), or 422 naming the header."""
    key = request.headers.get(KEY_HEADER)
    if key is None:
        return None
    if not _KEY.fullmatch(key):
        raise ApiError(
            422,
            KEY_HEADER,
            f"must be 1 to {MAX_KEY_LENGTH} printable ASCII characters without spaces "
            "(a UUID is a good key); one key per batch, the same on its retries",
        )
    return key


def idempotent_answer(
    *, project: Project, key: str | None, body: bytes, answer: Callable[[], dict[str, Any]]
) -> JsonResponse:
    """`answer()` (the ingest) as JSON: without a key, run now; with one, once per key
    (`idempotent_run`), a replay saying so in its header, the same key with another body
    422."""
    if key is None:
        return JsonResponse(answer())
    try:
        outcome = idempotent_run(project=project, key=key, body=body, answer=answer)
    except KeyReused as exc:
        raise ApiError(422, KEY_HEADER, str(exc)) from None
    response = JsonResponse(outcome.body, status=outcome.status)
    if outcome.replayed:
        response[REPLAYED_HEADER] = "true"
    return response
