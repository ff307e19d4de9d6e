"""The page benchmark behind `manage.py bench_pages`.

Every dashboard page and fragment is requested in-process through Django's test client, as
a staff user (who sees every project), on whatever data the database holds: server time per
request (p50, p95, max), its query count and its size. Queries are counted in a separate,
untimed request, so capturing them does not slow the timed ones.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count, Q
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from costboard.dashboards.views.shared import PAGE_SIZE, PERIOD_DAYS
from costboard.models import (
    SYSTEM_SESSION_ID,
    Project,
    Session,
    SessionModelUsage,
    Step,
    Turn,
)

BENCH_USER = "bench-pages"
TARGET_MS = 300.0


@dataclass(frozen=True)
class PageCase:
    name: str
    path: str
    htmx: bool = False


@dataclass(frozen=True)
class PageTiming:
    case: PageCase
    status: int
    times_ms: list[float]
    queries: int
    size: int

    @property
    def p50(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def p95(self) -> float:
        ordered = sorted(self.times_ms)
        return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


@dataclass(frozen=True)
class DataSize:
    steps: int
    sessions: int
    turns: int
    projects: int

    def line(self) -> str:
        return (
            f"data: {self.steps:,} steps, {self.sessions:,} sessions, {self.turns:,} turns in "
            f"{self.projects} projects on {connection.vendor}"
        )


def data_size() -> DataSize:
    return DataSize(
        steps=Step.objects.count(),
        sessions=Session.objects.count(),
        turns=Turn.objects.count(),
        projects=Project.objects.count(),
    )


def page_cases() -> list[PageCase]:
    """The pages and fragments to time, on sessions picked from the data: the one with the
    most steps (a busy `system` budget), one of median size, a flagged one; the model the most
    sessions called; the sessions list's last page (its deepest OFFSET)."""
    biggest = Session.objects.order_by("-step_count", "pk").first()
    if biggest is None:
        raise ValueError("the database has no sessions: run `manage.py seed_demo --steps 1000000`")
    conversations = Session.objects.exclude(external_id=SYSTEM_SESSION_ID).filter(turn_count__gt=0)
    middle = conversations.count() // 2
    typical = conversations.order_by("step_count", "pk")[middle : middle + 1].first() or biggest
    project = Project.objects.order_by("pk").first()
    model = (  # a family: what the model filter takes
        SessionModelUsage.objects.values("family")
        .annotate(sessions=Count("*"))
        .order_by("-sessions", "family")
        .values_list("family", flat=True)
        .first()
    ) or ""
    slug = urlencode({"project": project.slug}) if project else ""
    warning_or_exhausted = Q(state=Session.State.WARNING) | Q(state=Session.State.EXHAUSTED)
    flagged = Session.objects.filter(warning_or_exhausted).order_by("pk").first() or typical
    # the list shows the last 30 days unless told otherwise (`since=` empty: all time)
    first_day = timezone.now().date() - timedelta(days=PERIOD_DAYS - 1)
    recent = Session.objects.filter(
        last_active_at__gte=datetime.combine(first_day, datetime.min.time(), tzinfo=UTC)
    ).count()
    last_page = max(1, -(-recent // PAGE_SIZE))
    last_page_all = max(1, -(-Session.objects.count() // PAGE_SIZE))
    return [
        PageCase("overview, all projects", "/"),
        PageCase("overview, one project", f"/?{slug}"),
        PageCase("sessions", "/sessions/"),
        PageCase("sessions, state=exhausted", "/sessions/?state=exhausted"),
        PageCase("sessions, state=flagged", "/sessions/?state=flagged"),
        PageCase("sessions, by model", f"/sessions/?{urlencode({'model': model})}"),
        PageCase("sessions, by user", "/sessions/?user=researcher-1001"),
        PageCase("sessions, id search", "/sessions/?q=chat-a"),
        PageCase("sessions, sorted by cost", "/sessions/?sort=-cost"),
        PageCase("sessions, sorted by tokens", "/sessions/?sort=-tokens"),
        PageCase("sessions, last 7 days", "/sessions/?since=" + _days_ago(7)),
        PageCase("sessions, one project", f"/sessions/?{slug}"),
        PageCase("sessions, page 100", f"/sessions/?page={min(100, last_page)}"),
        PageCase("sessions, last page", f"/sessions/?page={last_page}"),
        PageCase("sessions, all time", "/sessions/?since="),
        PageCase("sessions, all time, by cost", "/sessions/?since=&sort=-cost"),
        PageCase("sessions, all time, last page", f"/sessions/?since=&page={last_page_all}"),
        PageCase("sessions table (htmx)", "/sessions/?state=warning&sort=-tokens", htmx=True),
        PageCase("sessions table, live (htmx)", "/sessions/?live=1", htmx=True),
        PageCase("sessions CSV, warning", "/sessions/export.csv?state=warning"),
        PageCase("session, most steps", f"/sessions/{biggest.pk}/"),
        PageCase("session, typical", f"/sessions/{typical.pk}/"),
        PageCase("session, flagged", f"/sessions/{flagged.pk}/"),
        PageCase("flagged", "/flagged/"),
        PageCase("flagged, one project", f"/flagged/?{slug}"),
        PageCase("flagged, with acknowledged", "/flagged/?acknowledged=1"),
        PageCase("flagged list, exhausted (htmx)", "/flagged/?kind=exhausted", htmx=True),
        PageCase("steps", "/steps/"),
        PageCase("steps, last 7 days", "/steps/?since=" + _days_ago(6)),
        PageCase("steps, one type", "/steps/?step_type=response"),
        PageCase("users", "/users/"),
        PageCase("steps, one project", f"/steps/?{slug}"),
        PageCase("steps results (htmx)", f"/steps/?{urlencode({'model': model})}", htmx=True),
        PageCase("memory review", "/memory/review/"),
        PageCase("memory review, one project", f"/memory/review/?{slug}"),
        PageCase("memory review list, one type (htmx)", "/memory/review/?type=user", htmx=True),
        PageCase("memory browser", "/memory/"),
        PageCase("memory browser, search", "/memory/?q=user"),
        PageCase("memory metrics", "/memory/metrics/"),
    ]


def _days_ago(days: int) -> str:
    return (timezone.now().date() - timedelta(days=days)).isoformat()


def bench_client() -> Client:
    user, _ = get_user_model().objects.get_or_create(
        username=BENCH_USER, defaults={"is_staff": True, "is_superuser": True}
    )
    if not user.is_staff:
        user.is_staff = True
        user.save(update_fields=["is_staff"])
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    return client


def _get(client: Client, case: PageCase) -> tuple[int, int]:
    headers = {"HX-Request": "true"} if case.htmx else {}
    response = client.get(case.path, headers=headers)
    # a streaming response's getvalue() reads it to its end (the CSV export's queries run)
    return response.status_code, len(response.getvalue())


def page_time(client: Client, case: PageCase, *, runs: int, warmup: int) -> PageTiming:
    for _ in range(warmup):
        _get(client, case)
    with CaptureQueriesContext(connection) as captured:
        status, size = _get(client, case)
    queries = len(captured.captured_queries)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        status, size = _get(client, case)
        times.append((time.perf_counter() - start) * 1000)
    return PageTiming(case=case, status=status, times_ms=times, queries=queries, size=size)


PLAIN_STATIC = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}


def pages_bench(
    *, runs: int, warmup: int, say: Callable[[str], None] = lambda line: None
) -> list[PageTiming]:
    client = bench_client()
    timings = []
    # Static files by their plain names: the pages' own work is timed, and the command runs
    # without `collectstatic` having written the hashed names' manifest (`make run` does).
    with override_settings(STORAGES={**settings.STORAGES, "staticfiles": PLAIN_STATIC}):
        for case in page_cases():
            say(f"  {case.name} …")
            timings.append(page_time(client, case, runs=runs, warmup=warmup))
    return timings


def report_lines(timings: list[PageTiming], *, target_ms: float = TARGET_MS) -> list[str]:
    width = max(len(t.case.name) for t in timings)
    lines = [
        f"{'page':<{width}}  {'p50 ms':>8}  {'p95 ms':>8}  {'max ms':>8}  {'queries':>7}  "
        f"{'KB':>7}  path"
    ]
    for t in timings:
        flag = "" if t.status == 200 else f"  HTTP {t.status}"
        if t.p95 >= target_ms:
            flag += f"  OVER {target_ms:.0f} ms"
        lines.append(
            f"{t.case.name:<{width}}  {t.p50:8.1f}  {t.p95:8.1f}  {max(t.times_ms):8.1f}  "
            f"{t.queries:7d}  {t.size / 1024:7.1f}  {t.case.path}{flag}"
        )
    over = [t for t in timings if t.p95 >= target_ms or t.status != 200]
    worst = max(timings, key=lambda t: t.p95)
    lines.append(
        f"{len(timings) - len(over)} of {len(timings)} pages under {target_ms:.0f} ms p95 and "
        f"200; slowest p95: {worst.case.name} {worst.p95:.1f} ms"
    )
    return lines
