"""gunicorn settings for Costboard: `gunicorn -c python:costboard.gunicorn_conf costboard.wsgi`
(`make run` and `bench_ingest` use it). Command-line flags still override these."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("gunicorn.error")

# Newer gunicorn opens a control socket at one path per user ($HOME/.gunicorn/gunicorn.ctl),
# which a second server (another checkout's `make run`, bench_ingest) would take over; we
# don't use it. Older releases ignore a setting they don't know.
control_socket_disable = True


def post_worker_init(worker: Any) -> None:
    """Each worker learns how many there are (costboard/api/ratelimit.py) and runs ingest once,
    rolled back, before it accepts (costboard/warmup.py)."""
    from costboard.api.ratelimit import workers_set
    from costboard.warmup import worker_warm

    workers_set(worker.cfg.workers)  # each one's share of the API limits while Redis is away

    seconds = worker_warm()
    log.info("worker %s warmed up in %.0f ms", worker.pid, seconds * 1000)
