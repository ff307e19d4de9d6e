"""Budget alerts: a project's webhooks and email addresses hear of its sessions' soft_warned,
exhausted and runaway events (cap_changed is not alerted), its period budgets' forecasts, and
its providers' days billed past its drift threshold (`billing_drift`, docs/billing.md).

Flow
----
1. Whatever records budget events (ingest, `session_recheck`, `session_flag_runaway`) calls
   `announce(events)` inside its transaction: one outbox item `alerts.dispatch` with the
   alertable events' ids (costboard/outbox.py). A rollback leaves none; nothing is sent from
   the request.
   A billing drift is queued the same way by the billing import (`alerts.billing_drift`,
   carried out by `drifts_dispatch`, its deliveries unique per drift and target).
2. The dispatcher carries it out (`alerts_dispatch`): one AlertDelivery per event and target
   — each active webhook of the project whose `kinds` include the event's kind, and each
   valid address of `Project.alert_emails` — and one `alert.deliver` item per new delivery,
   in one transaction with the item's delete. The unique constraint `delivery_once` (event,
   channel, target) makes a second run create nothing.
3. `alert.deliver` claims its delivery with a conditional UPDATE (only a pending delivery
   with no attempt in flight, so two dispatchers never send it at once), makes one attempt
   and records it in the delivery log; a retryable failure is tried again by the outbox.

What a webhook request and an email say (the payload, the signature, the email's text) is
costboard/budgets/alert_messages.py's.

Retry policy
------------
2xx: delivered. 4xx other than 408 (timeout) and 429 (too many requests): failed at once, no
retry — the receiver refused this request and would refuse it again (wrong URL, rejected
signature); fix it and use "Retry selected deliveries" in the admin. So is a URL the egress
check refuses (costboard/egress.py: the host is resolved once, every address checked,
and the request connects to a checked address). Anything else (5xx, 3xx — redirects are not
followed —, 408, 429, refused connections, timeouts) and any mail backend error: retried
after COSTBOARD_ALERT_RETRY_SECONDS × 2ⁿ seconds (n = 0, 1, …) until
COSTBOARD_ALERT_MAX_ATTEMPTS attempts, then failed. Delivery is at least once: a request that
timed out may have arrived and is sent again. A failed attempt keeps its status and a short
reason of ours ("HTTP 500 Internal Server Error"), never what the receiver replied.

The retries are the outbox's, with or without a broker (guard_sweep dispatches when there is
none), so the request that crossed the budget never waits for a receiver.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from costboard.budgets.alert_messages import alert_email, alert_payload, signature
from costboard.egress import (
    WebhookRefused,
    short,
    status_reason,
    webhook_destination,
    webhook_opener,
)
from costboard.models import (
    AlertDelivery,
    BillingDrift,
    BudgetEvent,
    Project,
    WebhookEndpoint,
)
from costboard.outbox import Attempt as OutboxAttempt
from costboard.outbox import Item, outbox_add, outbox_add_many, outbox_handler

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


def alert_addresses(text: str) -> list[str]:
    """The valid addresses of `Project.alert_emails` (split on commas, semicolons and
    whitespace), each once; an invalid one is skipped with a log line."""
    addresses: list[str] = []
    for item in re.split(r"[\s,;]+", text):
        if not item or item in addresses:
            continue
        try:
            validate_email(item)
        except ValidationError:
            log.warning("alert email %r is not a valid address; skipped", item)
            continue
        addresses.append(item)
    return addresses


# what an alert is delivered for: a budget event or a billing drift (AlertDelivery links one)
AlertSource = BudgetEvent | BillingDrift


@dataclass(frozen=True, slots=True)
class _Key:
    source_id: int  # the budget event's or the billing drift's
    channel: str
    target: str


def alerts_dispatch(event_ids: list[int]) -> int:
    """Create the deliveries of these budget events (once each, however often this runs) and
    queue an attempt at each new one. Returns how many were queued."""
    events = list(
        BudgetEvent.objects.filter(pk__in=event_ids, kind__in=ALERTED_KINDS).select_related(
            "project"
        )
    )
    if not events:
        return 0
    return _alerts_made(events, "budget_event", lambda event: event.kind)


@outbox_handler(DISPATCH)
def _dispatch_item(payload: dict[str, Any], attempt: OutboxAttempt) -> None:
    alerts_dispatch([int(i) for i in payload["event_ids"]])


def drifts_dispatch(drift_ids: list[int]) -> int:
    """Create the deliveries of these billing drifts — each active webhook of the project
    whose `kinds` include `billing_drift`, each address of `Project.alert_emails` — once each
    however often this runs, and queue an attempt at each new one. Returns how many."""
    drifts = list(BillingDrift.objects.filter(pk__in=drift_ids).select_related("project"))
    if not drifts:
        return 0
    return _alerts_made(drifts, "billing_drift", lambda drift: DRIFT_KIND)


def _alerts_made(sources: Sequence[AlertSource], link: str, kind_of: Callable[[Any], str]) -> int:
    """The deliveries of these alert sources (`link`: "budget_event" or "billing_drift") —
    each active webhook of the source's project whose `kinds` include its kind (`kind_of`),
    each address of `Project.alert_emails` — made once each (_deliveries_made)."""
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
        for endpoint in endpoints[project.pk]:
            if kind in (endpoint.kinds if isinstance(endpoint.kinds, list) else []):
                deliveries.append(
                    AlertDelivery(
                        project=project,
                        channel=AlertDelivery.Channel.WEBHOOK,
                        endpoint=endpoint,
                        target=endpoint.url,
                        **{link: source},
                    )
                )
        if project.pk not in addresses:
            addresses[project.pk] = alert_addresses(project.alert_emails)
        deliveries.extend(
            AlertDelivery(
                project=project,
                channel=AlertDelivery.Channel.EMAIL,
                target=address,
                **{link: source},
            )
            for address in addresses[project.pk]
        )
    return _deliveries_made(deliveries, link, sources)


def _deliveries_made(
    deliveries: list[AlertDelivery], source: str, sources: Sequence[AlertSource]
) -> int:
    """Store the deliveries not made before (by their source — `source` names the link, a
    budget event's or a billing drift's — channel and target) and queue an attempt at each
    new one; a racing run makes no second. Returns how many were queued."""
    source_id = f"{source}_id"
    existing = {
        _Key(*row)
        for row in AlertDelivery.objects.filter(**{f"{source}__in": sources}).values_list(
            source_id, "channel", "target"
        )
    }
    new = [
        d
        for d in deliveries
        if _Key(getattr(d, source_id) or 0, d.channel, d.target) not in existing
    ]
    if not new:
        return 0
    AlertDelivery.objects.bulk_create(new, ignore_conflicts=True)
    wanted = {_Key(getattr(d, source_id) or 0, d.channel, d.target) for d in new}
    created = AlertDelivery.objects.filter(
        **{f"{source}__in": sources}, status=AlertDelivery.Status.PENDING, attempts=0
    ).values_list("pk", "project_id", source_id, "channel", "target")
    queued = [
        Item(DELIVER, {"delivery_id": pk}, project_id)
        for pk, project_id, source_pk, channel, target in created.order_by("pk")
        if _Key(source_pk, channel, target) in wanted
    ]
    outbox_add_many(queued)
    return len(queued)


@outbox_handler(DRIFT_DISPATCH)
def _drift_item(payload: dict[str, Any], attempt: OutboxAttempt) -> None:
    drifts_dispatch([int(i) for i in payload["drift_ids"]])


# --- delivering: one attempt per task run ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    ok: bool
    response_code: int | None = None
    error: str = ""
    permanent: bool = False  # retrying would fail the same way


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
    Returns the delivery's status, or "skipped"."""
    now = timezone.now()
    attempt_no = _claim(delivery_id, now)
    if attempt_no is None:
        return "skipped"
    delivery = AlertDelivery.objects.select_related(
        "project",
        "endpoint",
        "budget_event__session",
        "budget_event__ledger__budget",
        "billing_drift",
    ).get(pk=delivery_id)
    try:
        if delivery.channel == AlertDelivery.Channel.WEBHOOK:
            attempt = _webhook_send(delivery)
        else:
            attempt = _email_send(delivery)
    except Exception as exc:  # recorded, never lost: the log shows what went wrong
        log.exception("alert delivery %s: unexpected error", delivery_id)
        attempt = Attempt(ok=False, error=_describe(exc))

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
    if attempt.ok:
        log.info(
            "alert delivery %s: %s to %s delivered", delivery_id, delivery.channel, delivery.target
        )
        return status
    log.warning(
        "alert delivery %s to %s: attempt %s failed (%s)%s",
        delivery_id,
        delivery.target,
        attempt_no,
        attempt.error,
        "" if status == AlertDelivery.Status.PENDING else "; giving up",
    )
    if status == AlertDelivery.Status.PENDING:
        raise DeliveryFailed(attempt.error)
    return status


@outbox_handler(
    DELIVER,
    max_attempts=lambda: settings.COSTBOARD_ALERT_MAX_ATTEMPTS,
    retry_seconds=lambda: float(settings.COSTBOARD_ALERT_RETRY_SECONDS),
    lease_seconds=CLAIM_LEASE_SECONDS,
    atomic=False,  # the delivery row records each attempt itself
)
def _deliver_item(payload: dict[str, Any], attempt: OutboxAttempt) -> None:
    alert_deliver(int(payload["delivery_id"]), final=attempt.final)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# --- sending: a webhook request or an email ---------------------------------------------------


def _webhook_send(delivery: AlertDelivery) -> Attempt:
    endpoint = delivery.endpoint
    if endpoint is None:
        return Attempt(ok=False, error="the webhook endpoint was deleted", permanent=True)
    if not endpoint.active:
        return Attempt(ok=False, error="the webhook endpoint is inactive", permanent=True)
    try:  # resolved once here; the request connects to these checked addresses only
        destination = webhook_destination(delivery.target)
    except WebhookRefused as exc:
        return Attempt(ok=False, error=short(f"refused: {exc}"), permanent=True)
    except (OSError, UnicodeError) as exc:  # the name does not resolve (now): retried
        return Attempt(ok=False, error=short(f"cannot resolve the host: {_describe(exc)}"))
    payload = alert_payload(delivery)
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=str).encode()
    timestamp = int(time.time())
    request = urllib.request.Request(  # noqa: S310 — http(s) only: webhook_destination above
        delivery.target,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "Costboard",
            "X-Costboard-Event": delivery.kind,
            "X-Costboard-Delivery": str(delivery.pk),
            "X-Costboard-Timestamp": str(timestamp),
            "X-Costboard-Signature": signature(endpoint.secret, timestamp, body),
        },
    )
    timeout = float(settings.COSTBOARD_ALERT_TIMEOUT_SECONDS)
    try:
        with webhook_opener(destination).open(request, timeout=timeout) as response:
            code = response.status
    except urllib.error.HTTPError as exc:  # every status outside 2xx
        code = exc.code
        exc.close()  # unread: a failure keeps its status, never the receiver's body
        permanent = 400 <= code < 500 and code not in {408, 429}
        return Attempt(ok=False, response_code=code, error=status_reason(code), permanent=permanent)
    except urllib.error.URLError as exc:  # refused, timeout while connecting, TLS
        return Attempt(ok=False, error=short(f"cannot connect: {exc.reason}"))
    except http.client.HTTPException as exc:  # a malformed reply: its text is the receiver's
        return Attempt(ok=False, error=f"bad HTTP reply ({type(exc).__name__})")
    except (OSError, ValueError) as exc:  # timeout, reset, …
        return Attempt(ok=False, error=short(_describe(exc)))
    if 200 <= code < 300:
        return Attempt(ok=True, response_code=code)
    return Attempt(ok=False, response_code=code, error=status_reason(code))


def _email_send(delivery: AlertDelivery) -> Attempt:
    subject, body = alert_email(alert_payload(delivery))
    try:
        send_mail(subject, body, None, [delivery.target], fail_silently=False)
    except Exception as exc:  # SMTP errors come in many types; each is retried
        return Attempt(ok=False, error=_describe(exc))
    return Attempt(ok=True)


def alert_deliveries_retry(*, delivery_ids: list[int]) -> int:
    """Send failed deliveries again (the admin's retry action): each back to pending with its
    attempts kept and a fresh round of outbox attempts. Others are left as they are. Returns
    how many were queued."""
    with transaction.atomic():
        failed = list(
            AlertDelivery.objects.select_for_update()
            .filter(pk__in=delivery_ids, status=AlertDelivery.Status.FAILED)
            .order_by("pk")
            .values_list("pk", "project_id")
        )
        AlertDelivery.objects.filter(pk__in=[pk for pk, _ in failed]).update(
            status=AlertDelivery.Status.PENDING
        )
        outbox_add_many(Item(DELIVER, {"delivery_id": pk}, project) for pk, project in failed)
    return len(failed)
