"""The `Idempotency-Key`'s row (docs/api.md, "Idempotency"): a whole batch sent again under the
same key gets the answer it got the first time, and is not ingested again. The API
(costboard/api/idempotency.py) reads the header and answers what `idempotent_run` returns.

The key's row (`IdempotentRequest`: the body's SHA-256 and the answer) is inserted first in the
same transaction as the ingest, with ON CONFLICT DO NOTHING on `idempotency_key_once`:

- a committed batch always has its stored answer, and a rolled-back one has none;
- a second request with the key while the first is still ingesting waits on the first's
  uncommitted row, then finds it and replays its answer: two at once ingest once.

Only a 200 is stored. A refusal (400, 413, 422, 429…) stores nothing and its transaction takes
the key row with it, so the client may correct the batch and send it under the same key: our
refusals change nothing and say the same thing again for the same body, so there is nothing
to replay (Stripe keeps its 4xx because some of them, a declined card, are outcomes that
must not happen twice; none of ours is).

Keys are kept 48 hours (at least 24, as docs/api.md promises): costboard/retention.py deletes
older ones in the hourly sweep.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.utils import timezone

from costboard.models import IdempotentRequest, Project

ANSWERED = 200  # the one status stored: the ingest's answer
_TABLE = IdempotentRequest._meta.db_table


@dataclass(frozen=True, slots=True)
class IdempotentAnswer:
    """What to answer: the status and JSON body, and whether it is a stored answer replayed."""

    status: int
    body: Any
    replayed: bool


class KeyReused(ValueError):
    """The key was used with another body."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"{key!r} was used with another body: send a new key for a new batch (the same "
            "body again under this key gets its stored answer)"
        )


def idempotent_run(
    *, project: Project, key: str, body: bytes, answer: Callable[[], dict[str, Any]]
) -> IdempotentAnswer:
    """`answer()` (the ingest) once per key: the first request runs it in one transaction with
    the key's row and stores what it returned (as its JSON reads back); the same key and body
    again get that stored answer, replayed; the same key with another body is KeyReused."""
    digest = hashlib.sha256(body).hexdigest()
    for _ in range(2):  # a second turn only if the row was pruned between insert and read
        with transaction.atomic():
            claimed = _claim(project, key, digest, timezone.now())
            if claimed is not None:
                answered = answer()
                IdempotentRequest.objects.filter(pk=claimed).update(
                    status_code=ANSWERED,
                    response=json.loads(json.dumps(answered, cls=DjangoJSONEncoder)),
                )
                return IdempotentAnswer(ANSWERED, answered, replayed=False)
        stored = (
            IdempotentRequest.objects.filter(project=project, key=key)
            .values_list("body_sha256", "status_code", "response")
            .first()
        )
        if stored is not None:
            stored_digest, status, response = stored
            if stored_digest != digest:
                raise KeyReused(key)
            return IdempotentAnswer(status, response, replayed=True)
    raise RuntimeError(f"Idempotency-Key {key!r} was neither claimed nor found")


def _claim(project: Project, key: str, digest: str, now: datetime) -> int | None:
    """Insert the key's row (a placeholder answer) and return its id; None if the key is
    taken. A concurrent holder's uncommitted row makes this wait for its commit."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {_TABLE} (project_id, key, body_sha256, status_code, response, created_at)
            VALUES (%s, %s, %s, 0, '{{}}', %s)
            ON CONFLICT (project_id, key) DO NOTHING
            RETURNING id
            """,
            [project.pk, key, digest, connection.ops.adapt_datetimefield_value(now)],
        )
        row = cursor.fetchone()
    return None if row is None else int(row[0])
