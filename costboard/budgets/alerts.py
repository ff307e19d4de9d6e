"""Budget alerts: a project's channels — webhooks, email, Slack, PagerDuty (docs/budgets.md,
"Channels") — hear of its sessions' soft_warned, exhausted and runaway events (cap_changed is
not alerted), its period budgets' crossings and forecasts, its providers' days billed past
its drift threshold (`billing_drift`, docs/billing.md), and its days of unusual spend
(`anomaly`, costboard/budgets/anomalies.py). A period budget's own `channels`, else the
project's `alert_channels`, say which; PagerDuty is paged for exhausted only (PAGED_KINDS),
and its incident resolved when that is over (`incidents_resolve`).

Flow
----
1. Whatever records budget events (ingest, `session_recheck`, `session_flag_runaway`) calls
   `announce(events)` inside its transaction: one outbox item `alerts.dispatch` with the
   alertable events' ids (costboard/outbox.py). A rollback leaves none; nothing is sent from
   the request.
   A billing drift is queued the same way by the billing import (`alerts.billing_drift`,
   carried out by `drifts_dispatch`, its deliveries unique per drift and target), and a
   spend anomaly by the sweep (`alerts.anomaly`, `anomalies_dispatch`).
2. The dispatcher carries it out (`alerts_dispatch`): one AlertDelivery per event and target
   of its channels — each active webhook of the project whose `kinds` include the event's
   kind, each valid address of `Project.alert_emails`, the Slack URL, the PagerDuty routing
   key — and one `alert.deliver` item per new delivery, in one transaction with the item's
   delete. The unique constraint `delivery_once` (event, channel, target, action) makes a
   second run create nothing.
3. `alert.deliver` claims its delivery with a conditional UPDATE (only a pending delivery
   with no attempt in flight, so two dispatchers never send it at once), makes one attempt
   and records it in the delivery log; a retryable failure is tried again by the outbox.
   The deliveries a dispatcher claims together go out COSTBOARD_ALERT_CONCURRENCY at a time,
   each target's one after another (`_delivery_lanes`): a receiver slow to answer holds up
   its own alerts, not another channel's or project's.
4. A PagerDuty incident is over when the budget's period ended or its ledger is no longer
   exhausted (a rolling budget's: its window now, summed from its hours, under its limits),
   or the session is no longer exhausted or was acknowledged since: the sweep
   (every minute), a budget's update and an acknowledgement call `incidents_resolve`, which
   makes one `resolve` delivery per trigger (the same constraint) and queues it. A resolve
   whose trigger is still pending waits for it (queued again a retry later), so PagerDuty
   never hears the resolve first.

What each channel says is costboard/budgets/alert_messages.py's; the senders (one POST
through the egress rules, an email) are costboard/budgets/alert_senders.py's.

Retry policy
------------
2xx: delivered. 4xx other than 408 (timeout) and 429 (too many requests): failed at once, no
retry — the receiver refused this request and would refuse it again (wrong URL, rejected
signature); fix it and use "Retry selected deliveries" in the admin. So is a URL the egress
check refuses (costboard/egress.py: the host is resolved once, every address checked,
and the request connects to a checked address), and a 3xx: redirects are not followed (the
egress rules) and a retry would be redirected the same, so the error names where the URL
redirects ("HTTP 301 Moved Permanently: the URL redirects to https://…/hook; …use the final
URL"). Anything else (5xx, 408, 429, refused connections, timeouts) and any mail backend
error: retried
after COSTBOARD_ALERT_RETRY_SECONDS × 2ⁿ seconds (n = 0, 1, …) until
COSTBOARD_ALERT_MAX_ATTEMPTS attempts, then failed. Delivery is at least once: a request that
timed out may have arrived and is sent again. A failed attempt keeps its status and a short
reason of ours ("HTTP 500 Internal Server Error"), never what the receiver replied.

The retries are the outbox's, with or without a broker (guard_sweep dispatches when there is
none), so the request that crossed the budget never waits for a receiver.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.utils import timezone

from costboard.budgets.alert_senders import (
    Attempt,
    alert_addresses,
    channel_send,
    describe,
)
from costboard.budgets.periods import PeriodLimits, window_totals
from costboard.models import (
    AlertDelivery,
    BillingDrift,
    BudgetEvent,
    OutboxItem,
    PeriodBudget,
    Project,
    SpendAnomaly,
    WebhookEndpoint,
)
from costboard.models.projects import ALERT_CHANNELS, default_alert_channels
from costboard.outbox import ALERTS_QUEUE, Item, outbox_add, outbox_add_many, outbox_handler
from costboard.outbox import Attempt as OutboxAttempt

__all__ = ["Attempt", "alert_addresses"]  # the senders' names, imported from here too

log = logging.getLogger(__name__)

ALERTED_KINDS = frozenset(
    {
        BudgetEvent.Kind.SOFT_WARNED,
        BudgetEvent.Kind.EXHAUSTED,
        BudgetEvent.Kind.RUNAWAY,
        BudgetEvent.Kind.FORECAST,
        BudgetEvent.Kind.THRESHOLD,
    }
)
# What pages (PagerDuty): a budget or session exhausted — a runaway that stops its session is
# one too (its exhausted event) — never a warning, a forecast or a drift.
PAGED_KINDS = frozenset({BudgetEvent.Kind.EXHAUSTED})
# A claimed attempt with no outcome after this long is taken to have died with its worker.
# Longer than the task's hard time limit, so a live attempt is never taken over.
CLAIM_LEASE_SECONDS = 300
_ERROR_CHARS = 2000
# outbox kinds (costboard/outbox.py)
DISPATCH = "alerts.dispatch"
DELIVER = "alert.deliver"
# a provider's day billed past a project's drift threshold (costboard/billing/services.py)
DRIFT_DISPATCH = "alerts.billing_drift"
DRIFT_KIND = "billing_drift"
PAGERDUTY = AlertDelivery.Channel.PAGERDUTY
TRIGGER, RESOLVE = AlertDelivery.Action.TRIGGER, AlertDelivery.Action.RESOLVE
# a day's spend far above its trailing 14 days (costboard/budgets/anomalies.py)
ANOMALY_DISPATCH = "alerts.anomaly"
ANOMALY_KIND = "anomaly"


# --- announcing: inside the transaction that recorded the events ----------------------------


def announce(events: Iterable[BudgetEvent]) -> None:
    """Queue the alertable events for dispatch, in the transaction that recorded them."""
    alertable = [e for e in events if e.kind in ALERTED_KINDS and e.pk is not None]
    if alertable:
        outbox_add(
            DISPATCH,
            {"event_ids": [e.pk for e in alertable]},
            project_id=alertable[0].project_id,
        )


# --- dispatching: one delivery per event and target ------------------------------------------


# what an alert is delivered for: a budget event, a billing drift or a spend anomaly
# (AlertDelivery links one)
AlertSource = BudgetEvent | BillingDrift | SpendAnomaly


@dataclass(frozen=True, slots=True)
class _Key:
    source_id: int  # the budget event's, the billing drift's or the spend anomaly's
    channel: str
    target: str


def alerts_dispatch(event_ids: list[int]) -> int:
    """Create the deliveries of these budget events (once each, however often this runs) and
    queue an attempt at each new one. Returns how many were queued."""
    events = list(
        BudgetEvent.objects.filter(pk__in=event_ids, kind__in=ALERTED_KINDS).select_related(
            "project", "ledger__budget"
        )
    )
    if not events:
        return 0
    return _alerts_made(events, "budget_event", lambda event: event.kind)


@outbox_handler(DISPATCH, queue=ALERTS_QUEUE)
def _dispatch_item(payload: dict[str, Any], attempt: OutboxAttempt) -> None:
    alerts_dispatch([int(i) for i in payload["event_ids"]])


def drifts_dispatch(drift_ids: list[int]) -> int:
    """Create the deliveries of these billing drifts — through the project's default
    channels (_alerts_made) — once each however often this runs, and queue an attempt at
    each new one. Returns how many."""
    drifts = list(BillingDrift.objects.filter(pk__in=drift_ids).select_related("project"))
    if not drifts:
        return 0
    return _alerts_made(drifts, "billing_drift", lambda drift: DRIFT_KIND)


def alert_channels_of(source: Any) -> list[str]:
    """The channels an alert goes through: its period budget's `channels`, else (none chosen,
    or no budget: a session's event, a drift) its project's `alert_channels`."""
    chosen: Any = None
    if isinstance(source, BudgetEvent) and source.ledger_id is not None:
        ledger = source.ledger
        chosen = ledger.budget.channels if ledger is not None else None
    if not chosen:
        chosen = source.project.alert_channels
    if not isinstance(chosen, list):
        chosen = default_alert_channels()
    return [channel for channel in ALERT_CHANNELS if channel in chosen]


def _alerts_made(sources: Sequence[AlertSource], link: str, kind_of: Callable[[Any], str]) -> int:
    """The deliveries of these alert sources (`link`: "budget_event", "billing_drift" or
    "spend_anomaly") through each source's channels (alert_channels_of): each active webhook
    of its project whose `kinds` include its kind (`kind_of`), each address of
    `Project.alert_emails`, the project's Slack URL, and its PagerDuty routing key for a kind
    that pages (PAGED_KINDS) — made once each (_deliveries_made)."""
    endpoints: dict[int, list[WebhookEndpoint]] = defaultdict(list)
    for endpoint in WebhookEndpoint.objects.filter(
        project_id__in={s.project_id for s in sources}, active=True
    ).order_by("pk"):
        endpoints[endpoint.project_id].append(endpoint)
    addresses: dict[int, list[str]] = {}
    deliveries: list[AlertDelivery] = []
    for source in sources:
        project: Project = source.project
        kind = kind_of(source)
        channels = alert_channels_of(source)

        if "webhook" in channels:
            for endpoint in endpoints[project.pk]:
                if kind in (endpoint.kinds if isinstance(endpoint.kinds, list) else []):
                    deliveries.append(
                        _delivery(source, link, "webhook", endpoint.url, endpoint=endpoint)
                    )
        if "email" in channels:
            if project.pk not in addresses:
                addresses[project.pk] = alert_addresses(project.alert_emails)
            deliveries.extend(
                _delivery(source, link, "email", address) for address in addresses[project.pk]
            )
        if "slack" in channels and project.slack_webhook_url:
            deliveries.append(_delivery(source, link, "slack", project.slack_webhook_url))
        if "pagerduty" in channels and project.pagerduty_routing_key and kind in PAGED_KINDS:
            deliveries.append(_delivery(source, link, "pagerduty", project.pagerduty_routing_key))
    return _deliveries_made(deliveries, link, sources)


def _delivery(
    source: AlertSource, link: str, channel: str, target: str, **more: Any
) -> AlertDelivery:
    return AlertDelivery(
        project=source.project, channel=channel, target=target, **{link: source}, **more
    )


def _deliveries_made(
    deliveries: list[AlertDelivery], source: str, sources: Sequence[AlertSource]
) -> int:
    """Store the deliveries not made before (by their source — `source` names the link, a
    budget event's or a billing drift's — channel and target) and queue an attempt at each
    new one; a racing run makes no second. Returns how many were queued."""
    source_id = f"{source}_id"
    made = AlertDelivery.objects.filter(**{f"{source}__in": sources}, action=TRIGGER)
    existing = {_Key(*row) for row in made.values_list(source_id, "channel", "target")}
    new = [
        d
        for d in deliveries
        if _Key(getattr(d, source_id) or 0, d.channel, d.target) not in existing
    ]
    if not new:
        return 0
    AlertDelivery.objects.bulk_create(new, ignore_conflicts=True)
    wanted = {_Key(getattr(d, source_id) or 0, d.channel, d.target) for d in new}
    created = made.filter(status=AlertDelivery.Status.PENDING, attempts=0).values_list(
        "pk", "project_id", source_id, "channel", "target"
    )
    queued = [
        Item(DELIVER, {"delivery_id": pk}, project_id)
        for pk, project_id, source_pk, channel, target in created.order_by("pk")
        if _Key(source_pk, channel, target) in wanted
    ]
    outbox_add_many(queued)
    return len(queued)


@outbox_handler(DRIFT_DISPATCH, queue=ALERTS_QUEUE)
def _drift_item(payload: dict[str, Any], attempt: OutboxAttempt) -> None:
    drifts_dispatch([int(i) for i in payload["drift_ids"]])


def anomalies_dispatch(anomaly_ids: list[int]) -> int:
    """Create the deliveries of these spend anomalies (kind `anomaly`), once each however
    often this runs, and queue an attempt at each new one. Returns how many."""
    anomalies = list(SpendAnomaly.objects.filter(pk__in=anomaly_ids).select_related("project"))
    if not anomalies:
        return 0
    return _alerts_made(anomalies, "spend_anomaly", lambda anomaly: ANOMALY_KIND)


@outbox_handler(ANOMALY_DISPATCH, queue=ALERTS_QUEUE)
def _anomaly_item(payload: dict[str, Any], attempt: OutboxAttempt) -> None:
    anomalies_dispatch([int(i) for i in payload["anomaly_ids"]])


# --- resolving: PagerDuty's incidents closed when what paged is over --------------------------


def _open_triggers() -> QuerySet[AlertDelivery]:
    """PagerDuty triggers with no resolve made yet."""
    resolves = AlertDelivery.objects.filter(
        budget_event_id=OuterRef("budget_event_id"),
        channel=PAGERDUTY,
        target=OuterRef("target"),
        action=RESOLVE,
    )
    return AlertDelivery.objects.filter(
        channel=PAGERDUTY, action=TRIGGER, budget_event__isnull=False
    ).exclude(Exists(resolves))


def _over(now: datetime) -> Q:
    """What paged is over: its budget's period ended or its ledger is no longer exhausted
    (a limit raised); its session no longer exhausted or acknowledged since. (A rolling
    budget's ledger still stored exhausted is judged by its window now: `_windows_under`.)"""
    ledger = Q(budget_event__ledger__isnull=False) & (
        Q(budget_event__ledger__period_end__lte=now)
        | ~Q(budget_event__ledger__state=BudgetEvent.Kind.EXHAUSTED)
    )
    session = Q(budget_event__session__isnull=False) & (
        ~Q(budget_event__session__state=BudgetEvent.Kind.EXHAUSTED)
        | Q(budget_event__session__acknowledged_at__gte=F("budget_event__at"))
    )
    return ledger | session


def _windows_under(triggers: QuerySet[AlertDelivery], now: datetime) -> list[int]:
    """The triggers (of `triggers`) of rolling budgets' ledgers still stored exhausted whose
    window at `now` is under the limits: a ledger keeps the window's totals at its last batch,
    so with no batch since, the spend that left the window is still in them. Each window is
    summed from its hours as every read of it is (`window_totals`: the budget page, the API,
    the stops), in one query."""
    rows = list(
        triggers.filter(
            budget_event__ledger__budget__period=PeriodBudget.Period.ROLLING,
            budget_event__ledger__state=BudgetEvent.Kind.EXHAUSTED,
        ).values_list("pk", "budget_event__ledger__budget_id", "budget_event__ledger__member")
    )
    if not rows:
        return []
    budgets = PeriodBudget.objects.in_bulk({budget_id for _, budget_id, _ in rows})
    sums = window_totals({(budgets[pk], member) for _, pk, member in rows}, now)
    return [
        trigger
        for trigger, pk, member in rows
        if not PeriodLimits.of(budgets[pk]).exhausted(*sums[(pk, member)])
    ]


def incidents_resolve(
    *, now: datetime, budget_id: int | None = None, session_id: int | None = None
) -> int:
    """Queue a PagerDuty `resolve` for each trigger whose incident is over (_over), of one
    budget or session or of all: once per trigger, whatever races (the unique constraint
    `delivery_once` holds the resolve like the trigger). A resolve is a delivery as any
    other, retried alike, and sent after its trigger. Called by the sweep (a period rolled
    over, a rolling window moved past the spend), a budget's update (a limit raised) and an
    acknowledgement; returns how many."""
    triggers = _open_triggers()
    if budget_id is not None:
        triggers = triggers.filter(budget_event__ledger__budget_id=budget_id)
    if session_id is not None:
        triggers = triggers.filter(budget_event__session_id=session_id)
    over = _over(now)
    under = _windows_under(triggers, now) if session_id is None else []
    if under:
        over |= Q(pk__in=under)
    triggers = triggers.filter(over)
    found = list(triggers.order_by("pk").values_list("project_id", "budget_event_id", "target"))
    if not found:
        return 0
    AlertDelivery.objects.bulk_create(
        [
            AlertDelivery(
                project_id=project_id,
                budget_event_id=event_id,
                channel=PAGERDUTY,
                target=target,
                action=RESOLVE,
            )
            for project_id, event_id, target in found
        ],
        ignore_conflicts=True,
    )
    wanted = {(event_id, target) for _, event_id, target in found}
    created = AlertDelivery.objects.filter(
        channel=PAGERDUTY,
        action=RESOLVE,
        budget_event_id__in={event_id for event_id, _ in wanted},
        status=AlertDelivery.Status.PENDING,
        attempts=0,
    ).values_list("pk", "project_id", "budget_event_id", "target")
    queued = [
        Item(DELIVER, {"delivery_id": pk}, project_id)
        for pk, project_id, event_id, target in created.order_by("pk")
        if (event_id, target) in wanted
    ]
    outbox_add_many(queued)
    if queued:
        log.info("PagerDuty: %s incident(s) to resolve", len(queued))
    return len(queued)


def _waits_for_trigger(delivery_id: int, now: datetime) -> bool:
    """A resolve whose trigger is still being attempted waits for it (a resolve before its
    trigger would leave the incident open): its attempt is queued again a retry later."""
    resolve = (
        AlertDelivery.objects.filter(pk=delivery_id, action=RESOLVE, status="pending")
        .values_list("project_id", "budget_event_id", "channel", "target")
        .first()
    )
    if resolve is None:
        return False
    project_id, event_id, channel, target = resolve
    pending = AlertDelivery.objects.filter(
        budget_event_id=event_id, channel=channel, target=target, action=TRIGGER, status="pending"
    )
    if not pending.exists():
        return False
    later = now + timedelta(seconds=max(float(settings.COSTBOARD_ALERT_RETRY_SECONDS), 1.0))
    OutboxItem.objects.create(
        kind=DELIVER,
        payload={"delivery_id": delivery_id},
        project_id=project_id,
        next_attempt_at=later,
    )
    return True


# --- delivering: one attempt per task run ----------------------------------------------------


def _claim(delivery_id: int, now: datetime) -> int | None:
    """Take a pending delivery for one attempt; return the attempt's number, or None if it is
    delivered, failed, gone, or being attempted by another worker right now.

    An attempt in flight is one claimed (attempts > 0) whose outcome is not written yet (no
    response code, no error): every finished attempt that did not deliver writes one of them.
    """
    stale = now - timedelta(seconds=CLAIM_LEASE_SECONDS)
    claimable = (
        Q(attempts=0)
        | Q(response_code__isnull=False)
        | ~Q(error="")
        | Q(last_attempt_at__isnull=True)
        | Q(last_attempt_at__lt=stale)
    )
    claimed = AlertDelivery.objects.filter(
        claimable, pk=delivery_id, status=AlertDelivery.Status.PENDING
    ).update(attempts=F("attempts") + 1, last_attempt_at=now, response_code=None, error="")
    if claimed != 1:
        return None
    attempts = AlertDelivery.objects.filter(pk=delivery_id).values_list("attempts", flat=True)
    return attempts.first()


class DeliveryFailed(Exception):
    """A retryable attempt failed: the outbox tries again after its back-off."""


def alert_deliver(delivery_id: int, *, final: bool = True) -> str:
    """Make one attempt at a delivery and record it (see the module docstring). A retryable
    failure stays pending and raises DeliveryFailed, unless this is the `final` attempt.
    Returns the delivery's status, "waiting" (a resolve before its trigger went out) or
    "skipped" (delivered, failed or gone). A delivery still pending whose attempt is in
    flight — or whose worker died mid-send, its claim not yet stale — raises DeliveryFailed
    too, so its item is tried again rather than dropped."""
    now = timezone.now()
    if _waits_for_trigger(delivery_id, now):
        return "waiting"
    attempt_no = _claim(delivery_id, now)
    if attempt_no is None:
        pending = AlertDelivery.objects.filter(pk=delivery_id, status=AlertDelivery.Status.PENDING)
        if pending.exists():  # an attempt in flight, or one whose worker died (its lease
            # runs from the send, the item's from the batch's claim): ask again later
            raise DeliveryFailed("another attempt is in flight")
        return "skipped"
    delivery = AlertDelivery.objects.select_related(
        "project",
        "endpoint",
        "budget_event__session",
        "budget_event__ledger__budget",
        "billing_drift",
        "spend_anomaly",
    ).get(pk=delivery_id)
    try:
        attempt = channel_send(delivery)
    except Exception as exc:  # recorded, never lost: the log shows what went wrong
        log.exception("alert delivery %s: unexpected error", delivery_id)
        attempt = Attempt(ok=False, error=describe(exc))

    if attempt.ok:
        status = AlertDelivery.Status.DELIVERED
    elif attempt.permanent or final:
        status = AlertDelivery.Status.FAILED
    else:
        status = AlertDelivery.Status.PENDING
    AlertDelivery.objects.filter(pk=delivery_id, attempts=attempt_no).update(
        status=status,
        response_code=attempt.response_code,
        error=attempt.error[:_ERROR_CHARS],
        delivered_at=timezone.now() if attempt.ok else None,
    )
    target = delivery.target_shown  # never a routing key or a Slack URL in the log
    if attempt.ok:
        log.info("alert delivery %s: %s to %s delivered", delivery_id, delivery.channel, target)
        return status
    log.warning(
        "alert delivery %s to %s: attempt %s failed (%s)%s",
        delivery_id,
        target,
        attempt_no,
        attempt.error,
        "" if status == AlertDelivery.Status.PENDING else "; giving up",
    )
    if status == AlertDelivery.Status.PENDING:
        raise DeliveryFailed(attempt.error)
    return status


def _delivery_lanes(payloads: list[dict[str, Any]]) -> list[Hashable]:
    """The lane of each `alert.deliver` item (costboard/outbox.py): its delivery's channel and
    target, so one target hears its alerts one after another, in order (a PagerDuty resolve
    after its trigger), while the others' go out beside them; a delivery gone has its own."""
    ids = [int(payload["delivery_id"]) for payload in payloads]
    targets = {
        pk: (channel, target)
        for pk, channel, target in AlertDelivery.objects.filter(pk__in=ids).values_list(
            "pk", "channel", "target"
        )
    }
    return [targets.get(pk, ("", str(pk))) for pk in ids]


@outbox_handler(
    DELIVER,
    max_attempts=lambda: settings.COSTBOARD_ALERT_MAX_ATTEMPTS,
    retry_seconds=lambda: float(settings.COSTBOARD_ALERT_RETRY_SECONDS),
    lease_seconds=CLAIM_LEASE_SECONDS,
    atomic=False,  # the delivery row records each attempt itself
    queue=ALERTS_QUEUE,
    # the deliveries claimed together go out COSTBOARD_ALERT_CONCURRENCY at a time, a target's
    # one after another: a slow receiver holds up its own alerts, not the others'
    lanes=_delivery_lanes,
    concurrency=lambda: settings.COSTBOARD_ALERT_CONCURRENCY,
)
def _deliver_item(payload: dict[str, Any], attempt: OutboxAttempt) -> None:
    alert_deliver(int(payload["delivery_id"]), final=attempt.final)


def alert_deliveries_retry(*, delivery_ids: list[int]) -> int:
    """Send failed deliveries again (the admin's retry action): each back to pending with its
    attempts kept and a fresh round of outbox attempts. Others are left as they are. A
    PagerDuty trigger sent again has its resolve, if made, sent again after it (else the
    incident it reopens would stay open). Returns how many were queued."""
    with transaction.atomic():
        failed = list(
            AlertDelivery.objects.select_for_update()
            .filter(pk__in=delivery_ids, status=AlertDelivery.Status.FAILED)
            .order_by("pk")
            .values_list("pk", "project_id", "channel", "action", "budget_event_id", "target")
        )
        again = {pk: project for pk, project, *_ in failed}
        for _, project_id, channel, action, event_id, target in failed:
            if channel == PAGERDUTY and action == TRIGGER:
                resolves = AlertDelivery.objects.filter(
                    budget_event_id=event_id, channel=channel, target=target, action=RESOLVE
                ).exclude(status=AlertDelivery.Status.PENDING)
                again.update(dict.fromkeys(resolves.values_list("pk", flat=True), project_id))
        AlertDelivery.objects.filter(pk__in=list(again)).update(status=AlertDelivery.Status.PENDING)
        outbox_add_many(Item(DELIVER, {"delivery_id": pk}, again[pk]) for pk in sorted(again))
    return len(failed)
