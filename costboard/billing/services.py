"""Billing's writes (docs/billing.md): a provider's days imported, billed rows sent by hand
(the API and the admin's CSV upload), and the mapping of a provider's projects to ours.

A day of one provider and source is replaced whole, in one transaction: re-importing it
stores the same rows again and changes nothing else. An import reads the providers' reports a
window of days at a time and stores each day of a window only once every report of the
window has arrived whole, so a failure (an outage past the retries, a garbage answer) leaves
the days stored before it and stores nothing of the window it hit."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal

from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from costboard.billing.providers import (
    MAX_BUCKETS,
    PROVIDERS,
    REPORTS,
    Billed,
    Client,
    ProviderError,
    Sleep,
    admin_key,
)
from costboard.billing.reconcile import Wanted, grouped, reconcile
from costboard.billing.uploads import UploadRow
from costboard.budgets.alerts import DRIFT_DISPATCH
from costboard.models import BilledUsage, BillingDrift, Project, ProviderProject
from costboard.outbox import Item, outbox_add_many

__all__ = [
    "ImportFailed",
    "ImportResult",
    "ProviderError",
    "billing_import",
    "billing_rows_replace",
    "drifts_record",
    "provider_project_delete",
    "provider_project_save",
    "scheduled_import",
]


@dataclass
class ImportResult:
    provider: str
    days: list[date] = field(default_factory=list)  # the days stored, in order
    rows: dict[str, int] = field(default_factory=dict)  # source → rows stored

    def __str__(self) -> str:
        if not self.days:
            return f"{self.provider}: no day stored"
        sources = ", ".join(f"{n} {source}" for source, n in sorted(self.rows.items()))
        return (
            f"{self.provider}: {len(self.days)} days stored ({self.days[0]} to "
            f"{self.days[-1]}): {sources or 'no rows'}"
        )


class ImportFailed(ProviderError):
    """An import stopped by `error`; `result` holds the days stored before it."""

    def __init__(self, error: ProviderError, result: ImportResult) -> None:
        super().__init__(error.provider, error.field, error.message)
        self.result = result


def billing_import(
    provider: str,
    since: date,
    until: date,
    *,
    sleep: Sleep = time.sleep,
    window_days: int = MAX_BUCKETS,
) -> ImportResult:
    """Import `provider`'s cost and usage reports for the UTC days `since` to `until`
    (included), a window of `window_days` at a time, each day in its own transaction.
    Raises ProviderError (nothing stored for the window it hit; earlier days stay)."""
    if provider not in PROVIDERS:
        raise ProviderError(provider, "provider", f"not one of {', '.join(PROVIDERS)}")
    if until < since:
        raise ProviderError(provider, "until", f"{until} is before since ({since})")
    client = Client.configured(provider, sleep=sleep)
    result = ImportResult(provider)
    try:
        _windows(client, since, until, max(1, min(window_days, MAX_BUCKETS)), result)
    except ProviderError as exc:
        raise ImportFailed(exc, result) from None
    return result


def _windows(client: Client, since: date, until: date, width: int, result: ImportResult) -> None:
    provider = client.provider
    mapping = _mapping(provider)
    first = since
    while first <= until:
        last = min(until, first + timedelta(days=width - 1))
        # every report of the window, whole, before any of its days is stored
        window: dict[date, dict[str, list[Billed]]] = defaultdict(dict)
        for report in REPORTS[provider]:
            for day, rows in client.buckets(report, first, last):
                if first <= day <= last:
                    window[day].setdefault(report.source, []).extend(rows)
        for day in sorted(window):
            stored = _day_replace(provider, day, window[day], mapping)
            result.days.append(day)
            for source, count in stored.items():
                result.rows[source] = result.rows.get(source, 0) + count
        first = last + timedelta(days=1)


def scheduled_import(*, sleep: Sleep = time.sleep) -> list[str]:
    """The daily job (Celery beat, guard_sweep): yesterday and today (UTC) for each provider
    with an admin key. A provider's failure is reported, not raised, so the other runs."""
    today = timezone.now().date()
    lines = []
    for provider in PROVIDERS:
        if not admin_key(provider):
            continue
        try:
            lines.append(
                str(billing_import(provider, today - timedelta(days=1), today, sleep=sleep))
            )
        except ProviderError as exc:
            lines.append(f"{provider}: billing import failed: {exc}")
    return lines


# "BILLDAYS": the advisory lock every replacement of billed days takes (PostgreSQL), so two
# imports of one day at once (the beat's and a command's) cannot both delete, then both insert
_LOCK_KEY = 0x4249_4C4C_4441_5953


def _days_locked() -> None:
    """Inside a transaction: wait for any other replacement of billed days to commit. One
    lock for every day (replacements are short and rare); SQLite serializes writes anyway."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])


def _mapping(provider: str) -> dict[str, int]:
    return dict(
        ProviderProject.objects.filter(provider=provider).values_list("external_id", "project_id")
    )


def _day_replace(
    provider: str, day: date, by_source: dict[str, list[Billed]], mapping: dict[str, int]
) -> dict[str, int]:
    """One day's rows of each source given, replacing that day's rows of the source."""
    now = timezone.now()
    with transaction.atomic():
        _days_locked()
        BilledUsage.objects.filter(provider=provider, day=day, source__in=list(by_source)).delete()
        made = BilledUsage.objects.bulk_create(
            BilledUsage(
                provider=provider,
                source=source,
                day=day,
                model=billed.model,
                line_item=billed.line_item,
                provider_project=billed.provider_project,
                project_id=mapping.get(billed.provider_project or ""),
                provider_api_key=billed.provider_api_key,
                service_tier=billed.service_tier,
                cost_usd=billed.cost_usd,
                input_tokens=billed.input_tokens,
                output_tokens=billed.output_tokens,
                cache_read_input_tokens=billed.cache_read_input_tokens,
                cache_creation_input_tokens=billed.cache_creation_input_tokens,
                requests=billed.requests,
                imported_at=now,
            )
            for source, rows in by_source.items()
            for billed in rows
        )
        drifts_record([(provider, day)])
    counts: dict[str, int] = dict.fromkeys(by_source, 0)
    for row in made:
        counts[row.source] += 1
    return counts


@dataclass(frozen=True)
class Replaced:
    stored: int
    replaced: int  # rows of the same (day, provider, source) there before
    days: list[tuple[date, str]]  # (day, provider) named, in order


def billing_rows_replace(
    rows: Iterable[UploadRow], *, source: str, project: Project | None = None
) -> Replaced:
    """Rows sent by hand (source `api` or `csv`): each (day, provider) they name has its
    rows of that source replaced by them, all in one transaction. `project`: the rows are
    that project's alone (an API key's), and only its rows are replaced; None: a bill across
    projects (the admin's upload), whose (day, provider)s are replaced whole."""
    if source not in (BilledUsage.Source.API, BilledUsage.Source.CSV):
        raise ValueError(f"rows sent by hand come from api or csv, not {source!r}")
    rows = list(rows)
    named = sorted({(row.day, row.provider) for row in rows})
    now = timezone.now()
    with transaction.atomic():
        _days_locked()
        replaced = 0
        for day, provider in named:
            old = BilledUsage.objects.filter(source=source, day=day, provider=provider)
            if project is not None:
                old = old.filter(project=project)
            replaced += old.delete()[0]
        BilledUsage.objects.bulk_create(
            BilledUsage(
                provider=row.provider,
                source=source,
                day=row.day,
                model=row.model,
                project_id=row.project_id,
                cost_usd=row.cost_usd,
                input_tokens=row.input_tokens,
                output_tokens=row.output_tokens,
                imported_at=now,
            )
            for row in rows
        )
        # a key's send judges its own project alone: another's drift is its own bills' to raise
        drifts_record(
            [(provider, day) for day, provider in named],
            project_ids=None if project is None else [project.pk],
        )
    return Replaced(stored=len(rows), replaced=replaced, days=named)


def drifts_record(
    days: Iterable[tuple[str, date]], *, project_ids: list[int] | None = None
) -> list[BillingDrift]:
    """Inside the transaction that stored these (provider, UTC day)s' billed rows: each
    project (of `project_ids`, the ones the rows were sent for; None: every project, for a
    bill across projects) whose billed cost for one of them drifted from Costboard's
    estimate by more than its `reconciliation_drift_pct` of the billed cost gets a
    BillingDrift, once per project, provider and day (a day imported again adds none), and
    its alert is queued through the outbox. A day not over yet (today, UTC) is not judged:
    its bill and its steps are still coming. Returns the drifts recorded now."""
    today = timezone.now().date()
    pairs = sorted({(provider, day) for provider, day in days if day < today})
    if not pairs:
        return []
    thresholds: dict[int, Decimal | None] = {}
    found: list[BillingDrift] = []
    for provider, day in pairs:
        wanted = Wanted(project_ids, day, day, provider=provider)
        by_project = grouped(reconcile(wanted), ["project_id"])
        missing = [g.values["project_id"] for g in by_project]
        thresholds.update(
            Project.objects.filter(pk__in=[p for p in missing if p not in thresholds]).values_list(
                "pk", "reconciliation_drift_pct"
            )
        )
        for group in by_project:
            project_id = group.values["project_id"]
            assert isinstance(project_id, int)  # noqa: S101 — narrows the type
            threshold = thresholds.get(project_id)
            billed, drift = group.billed_cost_usd, group.drift_usd
            if threshold is None or billed <= 0 or abs(drift) * 100 <= threshold * billed:
                continue  # within the threshold (or no alert asked, or nothing billed)
            pct = group.drift_pct
            assert pct is not None  # noqa: S101 — narrows the type: billed > 0
            found.append(
                BillingDrift(
                    project_id=project_id,
                    provider=provider,
                    day=day,
                    estimated_cost_usd=group.estimated_cost_usd,
                    billed_cost_usd=billed,
                    drift_usd=drift,
                    drift_pct=pct,
                    threshold_pct=threshold,
                )
            )
    if not found:
        return []
    keys = {(d.project_id, d.provider, d.day) for d in found}
    existing = set(
        BillingDrift.objects.filter(
            provider__in={d.provider for d in found}, day__in={d.day for d in found}
        ).values_list("project_id", "provider", "day")
    )
    new = [d for d in found if (d.project_id, d.provider, d.day) not in existing]
    BillingDrift.objects.bulk_create(new, ignore_conflicts=True)  # a racing import: no second
    made = [
        drift
        for drift in BillingDrift.objects.filter(
            provider__in={d.provider for d in new}, day__in={d.day for d in new}
        ).order_by("pk")
        if (drift.project_id, drift.provider, drift.day) in keys - existing
    ]
    outbox_add_many(
        Item(DRIFT_DISPATCH, {"drift_ids": [drift.pk]}, drift.project_id) for drift in made
    )
    return made


def provider_project_save(mapping: ProviderProject) -> int:
    """Save a mapping and give its provider's rows of that project or workspace its
    Costboard project (the rows it no longer names lose theirs). Returns the rows moved."""
    with transaction.atomic():
        previous = None
        if mapping.pk is not None:
            previous = ProviderProject.objects.filter(pk=mapping.pk).first()
        mapping.save()
        moved = 0
        if previous is not None and (previous.provider, previous.external_id) != (
            mapping.provider,
            mapping.external_id,
        ):
            moved += _imported(previous.provider, previous.external_id).update(project=None)
        moved += _imported(mapping.provider, mapping.external_id).update(
            project_id=mapping.project_id
        )
    return moved


def provider_project_delete(mapping: ProviderProject) -> int:
    """Delete a mapping; its rows keep their provider id with no Costboard project."""
    with transaction.atomic():
        moved = _imported(mapping.provider, mapping.external_id).update(project=None)
        mapping.delete()
    return moved


def _imported(provider: str, external_id: str) -> QuerySet[BilledUsage]:
    """The imported rows (not those sent by hand) of one provider project or workspace."""
    return BilledUsage.objects.filter(provider=provider, provider_project=external_id).exclude(
        source__in=(BilledUsage.Source.API, BilledUsage.Source.CSV)
    )
