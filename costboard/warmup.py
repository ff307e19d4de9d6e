"""A worker warms up before it takes its first request.

Measured with `bench_ingest --single` on a 1M-step database: every other one-step post took
~9 ms, but each gunicorn worker's first took ~220 ms — a fresh PostgreSQL backend planning
every ingest statement against cold catalog caches, the rate table and its model families
built, the ORM's queries compiled — which with two workers and 200 posts is exactly the p99.
So gunicorn's `post_worker_init` hook (costboard/gunicorn_conf.py) runs the real ingest and
budget read once, for a throwaway project, inside a transaction that is rolled back: nothing
is stored, no after-commit side effect runs, and the worker's connection stays open and warm.
A step partition the warm-up's ingest made is rolled back with it, so the worker then forgets
the months it saw: taken as made, its month's batches would all go to the DEFAULT partition.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from datetime import UTC, datetime

from django.db import transaction

from costboard.api.events import session_budget_read
from costboard.ingest.schemas import parse_events
from costboard.ingest.service import events_ingest
from costboard.partitions import forget_step_partitions
from costboard.projects import key_for, project_create

log = logging.getLogger(__name__)

SESSION = "warmup"


def _warmup_body(at: datetime) -> bytes:
    """A session with a user and tags, a turn with text and three steps (priced, tool,
    failed): every statement a real batch can run."""
    when = at.isoformat().replace("+00:00", "Z")
    step = {"session_id": SESSION, "turn": 1, "timestamp": when, "step_type": "response"}
    return json.dumps(
        [
            {"type": "session", "session_id": SESSION, "user_id": "warmup", "tags": {"a": "b"}},
            {"type": "turn", "session_id": SESSION, "turn": 1, "user_message": "hi"},
            {**step, "event_id": "warmup-1", "model": "gpt-4o-mini", "input_tokens": 10},
            {**step, "event_id": "warmup-2", "model": "none", "step_type": "tool"},
            {**step, "model": "gpt-4o-mini", "success": False, "error": "warm-up"},
        ]
    ).encode()


def worker_warm() -> float:
    """Run ingest and a budget read once, rolled back; the seconds it took. Never raises: a
    worker that cannot warm up (the database down at boot) serves cold rather than not at
    all."""
    began = time.perf_counter()
    try:
        key_for(f"warmup-{uuid.uuid4().hex}")  # no such key: compiles the lookup, writes nothing
        with transaction.atomic():
            project = project_create(
                name="warm-up (rolled back)", slug=f"warmup-{uuid.uuid4().hex[:20]}"
            )
            events_ingest(project=project, events=parse_events(_warmup_body(datetime.now(UTC))))
            session_budget_read(project, SESSION, key_prefix="")
            transaction.set_rollback(True)
    except Exception:  # whatever it is, the worker serves without the warm-up
        log.warning("worker warm-up failed; serving cold", exc_info=True)
    finally:
        forget_step_partitions()  # any it made were rolled back: ingest makes them for real
    return time.perf_counter() - began
