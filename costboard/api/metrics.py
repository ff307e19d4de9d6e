"""`GET /metrics` (docs/api.md, "Metrics"): Prometheus text read from the database at
scrape time.

Every number comes from tables, not from in-process counters, so each gunicorn worker (and
each replica) answers the same; the one exception is the rate limiter's refusals, counted
where the limiter keeps its state (Redis, shared; without Redis, per process). The ingest
counters live in `IngestTally`: the ingest service adds every batch it stores (whoever calls
it: the events API, OTLP, the demo seeder) in its own transaction; the views add what they
refuse with `costboard.projects.ingest_tally`. Both are atomic upserts. Each metric
family costs one aggregate query grouped by project, whatever the number of projects.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.db.models import Count, F, Q, Sum
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from costboard.api.inflight import in_flight_refused_counts
from costboard.api.ratelimit import rate_limited_counts
from costboard.models import (
    BudgetEvent,
    DailyRollup,
    IngestTally,
    OutboxItem,
    Project,
    Session,
)
from costboard.outbox import outbox_kinds

# Upper bounds (inclusive, as Prometheus' `le`) of the session tokens_used histogram.
SESSION_TOKEN_BUCKETS = (
    1_000,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    5_000_000,
)

# IngestTally column → metric name (costboard_events_<name>_total) and its help.
_INGEST_COUNTERS = (
    (
        "accepted",
        "accepted",
        "Events stored: the events API's, OTLP spans, and any other caller of the ingest "
        "(the demo seeder).",
    ),
    ("duplicates", "duplicated", "Events replayed with a known event_id: nothing changed."),
    (
        "refused",
        "refused",
        "Events in batches refused (400, 413, 422) after the key was accepted; "
        "1 per batch whose events could not be counted.",
    ),
)


@dataclass(frozen=True, slots=True)
class _Project:
    id: int
    slug: str


def _bucket_label(bound: int) -> str:
    return str(float(bound))  # Prometheus writes `le` as a float: "1000.0"


class CostboardCollector(Collector):
    """The metrics of docs/api.md ("Metrics"), read from the database each time `collect` runs."""

    def describe(self) -> Iterable[Metric]:
        return []  # names unknown until collect: the registry must not call collect twice

    def collect(self) -> Iterator[Metric]:
        projects = [
            _Project(id=pk, slug=slug)
            for pk, slug in Project.objects.order_by("slug").values_list("pk", "slug")
        ]
        yield self._session_tokens(projects)
        yield from self._ingest_counters(projects)
        yield from self._session_gauges(projects)
        yield self._budget_events(projects)
        yield self._cost(projects)
        yield self._outbox()
        yield from self._rate_limited(projects)
        yield from self._in_flight_limited(projects)

    def _session_tokens(self, projects: list[_Project]) -> Metric:
        family = HistogramMetricFamily(
            "costboard_session_tokens_used",
            "Sessions by tokens used (input + output tokens), all sessions including ended.",
            labels=["project"],
        )
        tokens = F("input_tokens") + F("output_tokens")
        buckets = {
            f"le_{bound}": Count("pk", filter=Q(used__lte=bound)) for bound in SESSION_TOKEN_BUCKETS
        }
        # project → cumulative counts per bound, then all sessions, then the tokens summed
        rows: dict[int, list[int]] = {
            project_id: values
            for project_id, *values in Session.objects.alias(used=tokens)
            .values("project_id")
            .annotate(**buckets, sessions=Count("pk"), tokens=Coalesce(Sum(tokens), 0))
            .values_list("project_id", *buckets, "sessions", "tokens")
            .order_by()
        }
        labels = [*(_bucket_label(bound) for bound in SESSION_TOKEN_BUCKETS), "+Inf"]
        for project in projects:
            *counts, tokens_sum = rows.get(project.id, [0] * (len(labels) + 1))
            family.add_metric(
                [project.slug], buckets=list(zip(labels, counts, strict=True)), sum_value=tokens_sum
            )
        return family

    def _ingest_counters(self, projects: list[_Project]) -> Iterator[Metric]:
        columns = [column for column, _, _ in _INGEST_COUNTERS]
        rows: dict[int, list[int]] = {
            project_id: sums
            for project_id, *sums in IngestTally.objects.values("project_id")
            .annotate(**{f"{column}_sum": Sum(column) for column in columns})
            .values_list("project_id", *(f"{column}_sum" for column in columns))
            .order_by()
        }
        for index, (_, name, help_text) in enumerate(_INGEST_COUNTERS):
            family = CounterMetricFamily(f"costboard_events_{name}", help_text, labels=["project"])
            for project in projects:
                family.add_metric([project.slug], rows.get(project.id, [0] * len(columns))[index])
            yield family

    def _session_gauges(self, projects: list[_Project]) -> Iterator[Metric]:
        counts: dict[tuple[int, str], int] = {}
        runaway: dict[int, int] = {}
        for row in (
            Session.objects.filter(ended_at__isnull=True)
            .values("project_id", "state")
            .annotate(sessions=Count("pk"), flagged=Count("pk", filter=Q(runaway_at__isnull=False)))
            .order_by()
        ):
            counts[(row["project_id"], row["state"])] = row["sessions"]
            runaway[row["project_id"]] = runaway.get(row["project_id"], 0) + row["flagged"]
        by_state = GaugeMetricFamily(
            "costboard_sessions",
            "Sessions not ended, by budget state.",
            labels=["project", "state"],
        )
        flagged = GaugeMetricFamily(
            "costboard_sessions_runaway",
            "Sessions not ended that a runaway rule flagged.",
            labels=["project"],
        )
        for project in projects:
            for state in Session.State.values:
                by_state.add_metric([project.slug, state], counts.get((project.id, state), 0))
            flagged.add_metric([project.slug], runaway.get(project.id, 0))
        yield by_state
        yield flagged

    def _budget_events(self, projects: list[_Project]) -> Metric:
        counts = {
            (row["project_id"], row["kind"]): row["events"]
            for row in BudgetEvent.objects.values("project_id", "kind")
            .annotate(events=Count("pk"))
            .order_by()
        }
        kinds = list(BudgetEvent.Kind.values)
        kinds += sorted({kind for _, kind in counts} - set(kinds))
        family = CounterMetricFamily(
            "costboard_budget_events",
            "Budget events recorded (retention may delete old ones of ended sessions).",
            labels=["project", "kind"],
        )
        for project in projects:
            for kind in kinds:
                family.add_metric([project.slug, kind], counts.get((project.id, kind), 0))
        return family

    def _cost(self, projects: list[_Project]) -> Metric:
        costs: dict[int, Decimal] = {
            row["project_id"]: row["cost"]
            for row in DailyRollup.objects.values("project_id")
            .annotate(cost=Sum("cost_usd"))
            .order_by()
        }
        family = CounterMetricFamily(
            "costboard_cost_usd",
            "Priced cost in USD of every step stored (daily rollups; repricing may change it).",
            labels=["project"],
        )
        for project in projects:
            family.add_metric([project.slug], float(costs.get(project.id) or Decimal(0)))
        return family

    def _outbox(self) -> Metric:
        family = GaugeMetricFamily(
            "costboard_outbox_items",
            "Side effects waiting to go out (pending) or given up on (failed), by kind.",
            labels=["kind", "status"],
        )
        rows = OutboxItem.objects.values_list("kind", "status").annotate(n=Count("pk")).order_by()
        counts = {(kind, status): n for kind, status, n in rows}
        for kind in sorted(outbox_kinds() | {kind for kind, _ in counts}):
            for status in OutboxItem.Status.values:
                family.add_metric([kind, status], counts.get((kind, status), 0))
        return family

    def _rate_limited(self, projects: list[_Project]) -> Iterator[Metric]:
        counts = rate_limited_counts()
        if counts is None:  # Redis unreachable: better no series than one that drops to 0
            return
        family = CounterMetricFamily(
            "costboard_api_rate_limited",
            "API requests refused (429) for exceeding their key's requests per second; nothing "
            "of them stored. Kept in Redis (every worker's) or, without Redis, per process.",
            labels=["project"],
        )
        for project in projects:
            family.add_metric([project.slug], counts.get(project.id, 0))
        yield family

    def _in_flight_limited(self, projects: list[_Project]) -> Iterator[Metric]:
        counts = in_flight_refused_counts()
        if counts is None:  # Redis unreachable, as above
            return
        family = CounterMetricFamily(
            "costboard_api_in_flight_limited",
            "API requests refused (429) because their key already had its most requests "
            "being answered at once; nothing of them stored. Kept in Redis (every worker's) "
            "or, without Redis, per process.",
            labels=["project"],
        )
        for project in projects:
            family.add_metric([project.slug], counts.get(project.id, 0))
        yield family


def _has_metrics_token(request: HttpRequest) -> bool:
    expected = settings.COSTBOARD_METRICS_TOKEN
    if not expected:
        return False
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(
        value.strip().encode(), expected.encode()
    )


def _may_read(request: HttpRequest) -> bool:
    user = request.user
    return (user.is_authenticated and user.is_staff) or _has_metrics_token(request)


@never_cache
@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _may_read(request):
        how = (
            "send Authorization: Bearer <COSTBOARD_METRICS_TOKEN> or log in as staff"
            if settings.COSTBOARD_METRICS_TOKEN
            else "log in as staff (set COSTBOARD_METRICS_TOKEN to let a scraper in)"
        )
        response = HttpResponse(
            f"401 Unauthorized: /metrics needs a staff login or a bearer token; {how}.\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        response["WWW-Authenticate"] = 'Bearer realm="costboard-metrics"'
        return response
    registry = CollectorRegistry()
    registry.register(CostboardCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
