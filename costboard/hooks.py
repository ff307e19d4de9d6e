"""Where other apps join in: what they do with a stored batch, and what runs every hour.

The cost app never imports them; each registers at start-up (its AppConfig.ready), so the
imports run one way (memory_ui → costboard).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from costboard.models import Project


@dataclass(frozen=True, slots=True)
class Ingested:
    """What a stored batch brought, for the hooks: its project and the ids of the turns
    whose text (user message or assistant response) arrived."""

    project: Project
    turns_with_text: list[int]


AfterIngest = Callable[[Ingested], None]
HourlyJob = Callable[[], str]  # returns a short line for guard_sweep's log

_after_ingest: list[AfterIngest] = []
_hourly: list[HourlyJob] = []


def after_ingest_register(hook: AfterIngest) -> None:
    """Call `hook` inside each ingest transaction, after its rows are written: a hook queues
    its work in the outbox (costboard/outbox.py), so the agent never waits for it."""
    if hook not in _after_ingest:
        _after_ingest.append(hook)


def after_ingest_run(ingested: Ingested) -> None:
    for hook in _after_ingest:
        hook(ingested)


def hourly_register(job: HourlyJob) -> None:
    """Run `job` hourly in guard_sweep (the deployment without a broker; with one, Celery
    beat runs each app's own schedule)."""
    if job not in _hourly:
        _hourly.append(job)


def hourly_run() -> list[str]:
    return [job() for job in _hourly]
