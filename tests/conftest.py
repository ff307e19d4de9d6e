"""Shared fixtures: a project with a key, known prices, and a helper to post events.

Tests run on SQLite by default and on PostgreSQL when DATABASE_URL is set (CI). Celery tasks
run eagerly here unless a test starts a real worker (see test_repricing).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from celery.contrib.testing.worker import TestWorkController, start_worker
from django.conf import global_settings, settings
from django.contrib.auth import get_user_model
from django.db import connections
from django.http import HttpResponseBase, StreamingHttpResponse
from django.test import Client, override_settings

from costboard.budgets.alert_senders import silent_hosts_forget
from costboard.celery import app as celery_app
from costboard.models import ApiKey, ModelPrice, Project
from costboard.partitions import forget_step_partitions
from costboard.pricing.rates import forget_rate_table


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that drives a browser is slow whatever its file says; and the files with slow
    tests run first. pytest-xdist's worksteal hands out the collection in order, so a
    migration walk collected last started last and set the end of the run while the other
    worker idled; longest first, the fast files fill in behind them. A file moves whole: split,
    its module-scoped fixtures (a LiteLLM callback that installs the global tracer provider
    once) would be set up twice."""
    slow_files = set()
    for item in items:
        if item.get_closest_marker("e2e") or "e2e" in item.path.parts:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow"):
            slow_files.add(item.path)
    items.sort(key=lambda item: item.path not in slow_files)  # stable: in-file order kept


# LiteLLM (tests/clients/test_litellm.py, the OTLP gateway tests) reads its bundled price map
# instead of retrying a download for seconds on an offline machine.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# Pages name static files as they are found, not by the hashed names collectstatic writes:
# the suite needs no collectstatic run (45 s with plotly's brotli). The hashed, compressed
# storage itself is tested in tests/costboard/test_static_files.py.
UNHASHED_STATIC = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}


# A password hashed at Django's 1,000,000 PBKDF2 rounds costs 0.4 s of CPU, and most page
# tests make a staff user: MD5 first in the suite (the others still check what they made).
FAST_PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.MD5PasswordHasher",
    *global_settings.PASSWORD_HASHERS,
]


@pytest.fixture(autouse=True, scope="session")
def _suite_settings() -> Iterator[None]:
    with override_settings(STORAGES=UNHASHED_STATIC, PASSWORD_HASHERS=FAST_PASSWORD_HASHERS):
        yield


# COSTBOARD_TEST_PGBOUNCER=1 (with COSTBOARD_DB_POOLER=pgbouncer; .ci/run's PgBouncer leg): the
# tests reach PostgreSQL through a PgBouncer in transaction mode (tests/servers.py) that this
# session starts. The test databases are made and dropped directly: PgBouncer keeps its server
# connections open, which DROP DATABASE refuses, until it stops.
THROUGH_PGBOUNCER = os.environ.get("COSTBOARD_TEST_PGBOUNCER") == "1"

if THROUGH_PGBOUNCER:

    @pytest.fixture(scope="session")
    def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
        from tests.servers import PgBouncer

        if connections["default"].vendor != "postgresql":
            pytest.fail(
                "COSTBOARD_TEST_PGBOUNCER=1 needs DATABASE_URL=postgres://…: PgBouncer stands "
                "in front of PostgreSQL"
            )
        if settings.COSTBOARD_DB_POOLER != "pgbouncer":
            pytest.fail("COSTBOARD_TEST_PGBOUNCER=1 needs COSTBOARD_DB_POOLER=pgbouncer too")
        db = connections["default"].settings_dict
        bouncer = PgBouncer(host=db["HOST"], port=int(db["PORT"] or 5432), user=db["USER"])
        bouncer.start()
        direct = {
            alias: (
                connections[alias].settings_dict["HOST"],
                connections[alias].settings_dict["PORT"],
            )
            for alias in connections
        }
        connections.close_all()
        for alias in connections:  # the dict every thread's connection is made from
            connections[alias].settings_dict.update(HOST="127.0.0.1", PORT=str(bouncer.port))
        try:
            with django_db_blocker.unblock(), connections["default"].cursor() as cursor:
                cursor.execute("SELECT 1")  # and PgBouncer logged it: the way really is through
            assert "login attempt: db=test_" in bouncer.log(), bouncer.log()
            yield
        finally:
            connections.close_all()
            for alias, (host, port) in direct.items():
                connections[alias].settings_dict.update(HOST=host, PORT=port)
            bouncer.stop()


@pytest.fixture(autouse=True)
def _eager_celery() -> Iterator[None]:
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = True


@pytest.fixture(autouse=True)
def _no_api_rate_limit(settings: Any) -> None:
    """No test is held to a per-second limit by the speed of the machine it runs on, nor to
    two requests in flight when it posts from threads; the limits' own tests
    (tests/costboard/api/test_ratelimit.py, test_inflight.py) set the ones they test."""
    settings.COSTBOARD_API_RATE_LIMIT = 0
    settings.COSTBOARD_API_MAX_IN_FLIGHT = 0


@pytest.fixture(autouse=True)
def _fresh_rate_table() -> Iterator[None]:
    forget_rate_table()
    yield
    forget_rate_table()


@pytest.fixture(autouse=True)
def _no_silent_alert_hosts() -> Iterator[None]:
    """A receiver one test let time out is not left alone in the next test's sends."""
    silent_hosts_forget()
    yield
    silent_hosts_forget()


@pytest.fixture(autouse=True)
def _fresh_step_partitions() -> Iterator[None]:
    """A test rolled back takes the step partitions it made with it: forget them."""
    forget_step_partitions()
    yield
    forget_step_partitions()


@dataclass
class Agent:
    """An API client for one project."""

    project: Project
    key: str
    client: Client

    def post(self, payload: Any, *, raw: bytes | None = None, **headers: str) -> Any:
        body = raw if raw is not None else json.dumps(payload)
        return self.client.post(
            "/api/v1/events",
            body,
            content_type="application/json",
            headers={"Authorization": f"Bearer {self.key}", **headers},
        )

    def events(self, *events: dict[str, Any]) -> dict[str, Any]:
        response = self.post({"events": list(events)})
        assert response.status_code == 200, response.content
        return response.json()

    def budget(self, session_id: str) -> Any:
        return self.client.get(
            f"/api/v1/sessions/{session_id}/budget",
            headers={"Authorization": f"Bearer {self.key}"},
        )


def make_agent(slug: str, **project_fields: Any) -> Agent:
    project = Project.objects.create(name=slug.title(), slug=slug, **project_fields)
    _, key = ApiKey.issue(project=project)
    return Agent(project=project, key=key, client=Client())


@pytest.fixture
def agent(db: None) -> Agent:
    return make_agent("acme")


# Rates chosen so every product has a distinct, exactly representable value.
TEST_RATES = {
    "input_mtok": Decimal("3"),
    "output_mtok": Decimal("15"),
    "cache_read_mtok": Decimal("0.3"),
    "cache_write_mtok": Decimal("3.75"),
    "cache_write_1h_mtok": Decimal("6"),
}


def add_price(model: str, provider: str = "testco", **fields: Any) -> ModelPrice:
    values = {**TEST_RATES, **fields}
    return ModelPrice.objects.create(
        model=model, provider=provider, source=ModelPrice.Source.MANUAL, **values
    )


@pytest.fixture
def priced(db: None) -> ModelPrice:
    """A price for `test-sonnet` at the TEST_RATES."""
    return add_price("test-sonnet")


def usd(tokens: int, rate: Decimal) -> Decimal:
    """The exact cost of `tokens` at `rate` USD per million tokens."""
    return Decimal(tokens) * rate / Decimal(1_000_000)


# The outbox's dispatchers, one per queue (costboard/tasks.py), as beat sends them.
OUTBOX_TASKS = ("outbox_dispatch", "outbox_alerts", "outbox_memory", "outbox_repricing")


@contextmanager
def own_queues() -> Iterator[dict[str, str]]:
    """Every queue of settings.CELERY_TASK_QUEUES renamed to one of this test's own (another
    test process on the same Redis takes nothing of it), routes and the default queue with
    them: queue name -> this test's name for it. Tasks leave for a broker while it lasts."""
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    names = {queue.name: f"{prefix}-{queue.name}" for queue in settings.CELERY_TASK_QUEUES}
    conf = celery_app.conf
    conf.task_always_eager = False
    conf.task_default_queue = names[settings.CELERY_TASK_DEFAULT_QUEUE]
    conf.task_routes = {
        task: {"queue": names[route["queue"]]}
        for task, route in settings.CELERY_TASK_ROUTES.items()
    }
    _routes_reread()
    try:
        yield names
    finally:
        conf.task_default_queue = settings.CELERY_TASK_DEFAULT_QUEUE
        conf.task_routes = settings.CELERY_TASK_ROUTES
        _routes_reread()
        conf.task_always_eager = True
        _queues_delete(list(names.values()))


def _queues_delete(names: list[str]) -> None:
    """This test's queues gone from the broker, with what is left in them (beat's sends no
    worker took): the machine's Redis is shared with every later run."""
    # a broker the test stopped has nothing of it to tidy
    with contextlib.suppress(Exception), celery_app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)
        channel = conn.default_channel
        for name in names:
            channel.queue_delete(name)


def _routes_reread() -> None:
    """Celery reads task_routes once into its router: make it read them again."""
    celery_app.amqp.flush_routes()
    celery_app.amqp.router = celery_app.amqp.Router()


class OwnLoopWorker(TestWorkController):
    """A worker that drains its own broker connection (Celery's synchronous loop). On the
    event loop, a second worker in this process would take over the first one's (kombu keeps
    one per process), and a task holding one worker up would hold up the other."""

    def should_use_eventloop(self) -> bool:
        return False


@contextmanager
def worker_on(*queues: str) -> Iterator[Any]:
    """A real Celery worker in a thread of this process, consuming these queues (Redis when
    CELERY_BROKER_URL is set, as in CI; else Celery's in-memory transport)."""
    with start_worker(
        celery_app,
        queues=list(queues),
        WorkController=OwnLoopWorker,
        perform_ping_check=False,
        shutdown_timeout=30,
        loglevel="WARNING",
    ) as worker:
        yield worker


@pytest.fixture
def celery_worker(transactional_db: None) -> Iterator[dict[str, str]]:
    """A real Celery worker on every queue, as `celery -A costboard worker` without -Q runs
    on one box; the queues are this test's own (`own_queues`)."""
    with own_queues() as names, worker_on(*names.values()):
        yield names


@contextmanager
def beating() -> Iterator[None]:
    """What Celery beat does in production: send each queue's outbox dispatcher every 100 ms
    (CELERY_BEAT_SCHEDULE says every second), each routed to its queue."""
    from costboard import tasks

    dispatchers = [getattr(tasks, name) for name in OUTBOX_TASKS]
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            for dispatcher in dispatchers:
                dispatcher.apply_async(expires=10)
            stop.wait(0.1)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


@pytest.fixture
def outbox_beat(celery_worker: dict[str, str]) -> Iterator[None]:
    with beating():
        yield


# the project admin's fields besides the alert channels and reports (costboard/admin/projects.py)
PROJECT_ADMIN_KEPT = (
    "runaway_failed_steps",
    "runaway_repeated_steps",
    "runaway_turn_steps",
    "runaway_burn_window_minutes",
    "runaway_burn_factor",
    "runaway_burn_floor",
    "runaway_overrun_minutes",
    "runaway_max_hours",
    "reconciliation_drift_pct",
    "anomaly_k",
    "anomaly_floor_usd",
)


def project_admin_fields(project: Project, **changed: Any) -> dict[str, Any]:
    """The project admin's change form as it stands (its inlines empty), with `changed`."""
    fields = {
        "name": project.name,
        "slug": project.slug,
        "alert_channels": project.alert_channels,
        "alert_emails": project.alert_emails,
        "report_recipients": project.report_recipients,
        "report_tag_key": project.report_tag_key,
        **{name: getattr(project, name) for name in PROJECT_ADMIN_KEPT},
        **{
            f"{prefix}-{name}": 0
            for prefix in ("memberships", "api_keys", "webhooks")
            for name in ("TOTAL_FORMS", "INITIAL_FORMS")
        },
    }
    return fields | changed


@pytest.fixture
def staff(db: None) -> Client:
    user = get_user_model().objects.create_superuser("root", "", "pw-root-123")
    client = Client()
    client.force_login(user)
    return client


def streamed(response: HttpResponseBase) -> bytes:
    """A streaming response's body (a CSV export's), read to its end: its queries run as it is
    read. Fails on a response that does not stream."""
    assert isinstance(response, StreamingHttpResponse), type(response)
    return response.getvalue()


def run_in_threads(count: int, work: Callable[[int], object]) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def target(index: int) -> None:
        try:
            barrier.wait()
            work(index)
        except BaseException as exc:  # reported to the test below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return errors
