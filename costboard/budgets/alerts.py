"""Budget alerts: a project's webhooks and email addresses hear of its sessions' soft_warned,
exhausted and runaway events (cap_changed is not alerted).

Flow
----
1. Whatever records budget events (ingest, `session_recheck`, `session_flag_runaway`) calls
   `announce(events)` inside its transaction. After the commit one `alerts_dispatch` task is
   enqueued with the alertable events' ids; a rollback sends nothing.
2. `alerts_dispatch` makes one AlertDelivery per event and target: each active webhook of the
   project whose `kinds` include the event's kind, and each valid address of
   `Project.alert_emails`. The unique constraint `delivery_once` (event, channel, target) and
   `ignore_conflicts` make a second dispatch of the same event create nothing. It then
   enqueues `alert_deliver` for each delivery not yet attempted.
3. `alert_deliver` claims its delivery with a conditional UPDATE (only a pending delivery
   with no attempt in flight, so two workers never send it at once), makes one attempt,
   records it in the delivery log and retries with back-off.

Webhook requests
----------------
`POST <url>`, body JSON (UTF-8)::

    {"delivery_id": 17, "event_id": 42, "kind": "exhausted", "at": "2026-05-01T12:00:00+00:00",
     "project": "acme", "session_id": "chat-42", "state": "exhausted", "runaway": false,
     "tokens_used": 1000, "token_cap": 1000, "cost_usd": "0.0078", "cost_cap_usd": "5.00",
     "detail": {...}, "session_url": "https://costboard.example/sessions/5/?project=acme"}

`tokens_used` and `cost_usd` are the session's at the crossing; the caps are those crossed
(the session's current caps for a runaway event); `state` and `runaway` are the session's when
sent. USD amounts are decimal strings, as in the API's `<budget>`. `session_url` is absolute
when COSTBOARD_BASE_URL is set, else a path.

Headers: `Content-Type: application/json`, `User-Agent: Costboard`, `X-Costboard-Event: <kind>`,
`X-Costboard-Delivery: <delivery id>` (the same on every attempt: a receiver dedupes on it),
`X-Costboard-Timestamp: <unix seconds>` and
`X-Costboard-Signature: sha256=<hex>`, where hex is HMAC-SHA256 with the endpoint's secret as
key over the bytes `f"{timestamp}.{body}"` (Stripe's scheme). A receiver recomputes it over the
raw body as received, compares in constant time, and refuses a timestamp more than a few
minutes old, so a captured request cannot be replayed later: `verify_signature` does all three.

Retry policy
------------
2xx: delivered. 4xx other than 408 (timeout) and 429 (too many requests): failed at once, no
retry — the receiver refused this request and would refuse it again (wrong URL, rejected
signature); fix it and use "Retry selected deliveries" in the admin. Anything else (5xx, 3xx —
redirects are not followed —, 408, 429, refused connections, timeouts) and any mail backend
error: retried after COSTBOARD_ALERT_RETRY_SECONDS × 2ⁿ seconds (n = 0, 1, …) until
COSTBOARD_ALERT_MAX_ATTEMPTS attempts, then failed. Delivery is at least once: a request that
timed out may have arrived and is sent again.

Without a broker (tasks run in-process) a failed attempt is not retried: the back-off would
hold up the request that crossed the budget. The delivery is marked failed, and can be retried
from the admin.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import logging
import re
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from celery import shared_task
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.db import transaction
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from costboard.budgets.caps import session_budget
from costboard.models import (
    AlertDelivery,
    BudgetEvent,
    Project,
    Session,
    WebhookEndpoint,
    usd,
)

log = logging.getLogger(__name__)

ALERTED_KINDS = frozenset(
    {BudgetEvent.Kind.SOFT_WARNED, BudgetEvent.Kind.EXHAUSTED, BudgetEvent.Kind.RUNAWAY}
)
SIGNATURE_TOLERANCE_SECONDS = 300
# A claimed attempt with no outcome after this long is taken to have died with its worker.
# Longer than the task's hard time limit, so a live attempt is never taken over.
CLAIM_LEASE_SECONDS = 300
_ERROR_CHARS = 2000


# --- announcing: inside the transaction that recorded the events ----------------------------


def announce(events: Iterable[BudgetEvent]) -> None:
    """Enqueue one `alerts_dispatch` for the alertable events once the transaction commits."""
    event_ids = [e.pk for e in events if e.kind in ALERTED_KINDS and e.pk is not None]
    if event_ids:
        # robust: a broker that is down must not turn a committed ingest into an error
        transaction.on_commit(partial(_dispatch_enqueue, event_ids), robust=True)


def _dispatch_enqueue(event_ids: list[int]) -> None:
    alerts_dispatch.delay(event_ids)


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


@shared_task(soft_time_limit=120, time_limit=150)
def alerts_dispatch(event_ids: list[int]) -> int:
    """Create the deliveries of these budget events (once each, however often this runs) and
    enqueue those not yet attempted. Returns how many were enqueued."""
    events = list(
        BudgetEvent.objects.filter(pk__in=event_ids, kind__in=ALERTED_KINDS).select_related(
            "project"
        )
    )
    if not events:
        return 0
    endpoints: dict[int, list[WebhookEndpoint]] = defaultdict(list)
    for endpoint in WebhookEndpoint.objects.filter(
        project_id__in={e.project_id for e in events}, active=True
    ).order_by("pk"):
        endpoints[endpoint.project_id].append(endpoint)
    addresses: dict[int, list[str]] = {}

    deliveries: list[AlertDelivery] = []
    for event in events:
        project: Project = event.project
        for endpoint in endpoints[project.pk]:
            kinds = endpoint.kinds if isinstance(endpoint.kinds, list) else []
            if event.kind in kinds:
                deliveries.append(
                    AlertDelivery(
                        project=project,
                        budget_event=event,
                        channel=AlertDelivery.Channel.WEBHOOK,
                        endpoint=endpoint,
                        target=endpoint.url,
                    )
                )
        if project.pk not in addresses:
            addresses[project.pk] = alert_addresses(project.alert_emails)
        deliveries.extend(
            AlertDelivery(
                project=project,
                budget_event=event,
                channel=AlertDelivery.Channel.EMAIL,
                target=address,
            )
            for address in addresses[project.pk]
        )
    if deliveries:
        AlertDelivery.objects.bulk_create(deliveries, ignore_conflicts=True)

    # Not yet attempted: one attempted already has its own retries scheduled.
    pending = list(
        AlertDelivery.objects.filter(
            budget_event__in=events, status=AlertDelivery.Status.PENDING, attempts=0
        )
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    for delivery_id in pending:
        alert_deliver.delay(delivery_id)
    return len(pending)


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


@shared_task(bind=True, soft_time_limit=120, time_limit=150)
def alert_deliver(self: Any, delivery_id: int) -> str:
    """Make one attempt at a delivery and record it; retry with back-off (see the module
    docstring). Returns the delivery's status, or "skipped"."""
    now = timezone.now()
    attempt_no = _claim(delivery_id, now)
    if attempt_no is None:
        return "skipped"
    delivery = AlertDelivery.objects.select_related(
        "project", "endpoint", "budget_event__session"
    ).get(pk=delivery_id)
    try:
        if delivery.channel == AlertDelivery.Channel.WEBHOOK:
            attempt = _webhook_send(delivery)
        else:
            attempt = _email_send(delivery)
    except Exception as exc:  # recorded, never lost: the log shows what went wrong
        log.exception("alert delivery %s: unexpected error", delivery_id)
        attempt = Attempt(ok=False, error=_describe(exc))

    tries = self.request.retries + 1  # attempts of this task (the admin's retry starts anew)
    max_attempts = settings.COSTBOARD_ALERT_MAX_ATTEMPTS
    in_process = bool(self.request.is_eager or self.request.called_directly)
    if attempt.ok:
        status = AlertDelivery.Status.DELIVERED
    elif attempt.permanent or tries >= max_attempts or in_process:
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
        countdown = float(settings.COSTBOARD_ALERT_RETRY_SECONDS) * 2**self.request.retries
        raise self.retry(countdown=countdown, max_retries=max_attempts - 1)
    return status


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# --- the payload ------------------------------------------------------------------------------


def session_url(session: Session, project: Project) -> str:
    path = f"{reverse('session', args=[session.pk])}?project={project.slug}"
    return f"{settings.COSTBOARD_BASE_URL.rstrip('/')}{path}"


def _caps_crossed(
    event: BudgetEvent, current_token_cap: int, current_cost_cap: str | None
) -> tuple[int, str | None]:
    """The caps recorded with a crossing (those it crossed), else the session's current ones."""
    detail = event.detail if isinstance(event.detail, dict) else {}
    token_cap, cost_cap = detail.get("token_cap"), detail.get("cost_cap_usd")
    if isinstance(token_cap, int) and isinstance(cost_cap, str):
        try:
            return token_cap, usd(Decimal(cost_cap))
        except InvalidOperation:
            pass
    return current_token_cap, current_cost_cap


def alert_payload(delivery: AlertDelivery) -> dict[str, Any]:
    """What a webhook receives and an email says (module docstring)."""
    event = delivery.budget_event
    session = event.session
    project = delivery.project
    budget = session_budget(session, project)
    token_cap, cost_cap = _caps_crossed(event, budget["token_cap"], budget["cost_cap_usd"])
    return {
        "delivery_id": delivery.pk,
        "event_id": event.pk,
        "kind": event.kind,
        "at": event.at.isoformat(),
        "project": project.slug,
        "session_id": session.external_id,
        "state": budget["state"],
        "runaway": budget["runaway"],
        "tokens_used": event.tokens_used,
        "token_cap": token_cap,
        "cost_usd": usd(event.cost_usd),
        "cost_cap_usd": cost_cap,
        "detail": event.detail,
        "session_url": session_url(session, project),
    }


# --- webhooks ---------------------------------------------------------------------------------


def signature(secret: str, timestamp: int | str, body: bytes) -> str:
    """The X-Costboard-Signature value: HMAC-SHA256(secret, f"{timestamp}.{body}")."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={digest.hexdigest()}"


def verify_signature(
    secret: str,
    timestamp: int | str,
    body: bytes | str,
    header: str,
    *,
    tolerance_seconds: int | None = SIGNATURE_TOLERANCE_SECONDS,
    now: float | None = None,
) -> bool:
    """For receivers: True if `header` (X-Costboard-Signature; several comma-separated values
    are allowed, e.g. while rotating secrets) signs this timestamp and raw body with `secret`,
    and the timestamp is within `tolerance_seconds` of now (None: any age)."""
    try:
        sent_at = int(str(timestamp))
    except ValueError:
        return False
    if tolerance_seconds is not None:
        current = time.time() if now is None else now
        if abs(current - sent_at) > tolerance_seconds:
            return False
    raw = body.encode() if isinstance(body, str) else body
    expected = signature(secret, sent_at, raw)
    return any(
        hmac.compare_digest(expected.encode(), candidate.strip().encode())
        for candidate in header.split(",")
    )


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A webhook is POSTed where it is configured; urllib would re-send a redirected POST as
    a GET without its body."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirects)


def _webhook_send(delivery: AlertDelivery) -> Attempt:
    endpoint = delivery.endpoint
    if endpoint is None:
        return Attempt(ok=False, error="the webhook endpoint was deleted", permanent=True)
    if not endpoint.active:
        return Attempt(ok=False, error="the webhook endpoint is inactive", permanent=True)
    if urlsplit(delivery.target).scheme not in {"http", "https"}:
        return Attempt(ok=False, error="the URL is not http(s)", permanent=True)
    payload = alert_payload(delivery)
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, default=str).encode()
    timestamp = int(time.time())
    request = urllib.request.Request(
        delivery.target,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "Costboard",
            "X-Costboard-Event": delivery.budget_event.kind,
            "X-Costboard-Delivery": str(delivery.pk),
            "X-Costboard-Timestamp": str(timestamp),
            "X-Costboard-Signature": signature(endpoint.secret, timestamp, body),
        },
    )
    timeout = float(settings.COSTBOARD_ALERT_TIMEOUT_SECONDS)
    try:
        with _opener.open(request, timeout=timeout) as response:
            code = response.status
    except urllib.error.HTTPError as exc:  # every status outside 2xx
        code = exc.code
        try:
            reply = exc.read(300).decode("utf-8", "replace").strip()
        except (OSError, http.client.HTTPException):
            reply = ""
        error = f"HTTP {code} {exc.reason}" + (f": {reply}" if reply else "")
        permanent = 400 <= code < 500 and code not in {408, 429}
        return Attempt(ok=False, response_code=code, error=error, permanent=permanent)
    except urllib.error.URLError as exc:  # refused, unknown host, timeout while connecting
        return Attempt(ok=False, error=f"cannot connect: {exc.reason}")
    except (OSError, http.client.HTTPException, ValueError) as exc:  # timeout, reset, …
        return Attempt(ok=False, error=_describe(exc))
    if 200 <= code < 300:
        return Attempt(ok=True, response_code=code)
    return Attempt(ok=False, response_code=code, error=f"HTTP {code}")


# --- email ------------------------------------------------------------------------------------


def _caps_reached(payload: dict[str, Any], fraction: Decimal) -> str:
    """ "token cap", "cost cap" or "token and cost caps": those reached at `fraction`."""
    hit = []
    try:
        if payload["token_cap"] is not None and payload["tokens_used"] >= fraction * Decimal(
            payload["token_cap"]
        ):
            hit.append("token")
        if (
            payload["cost_cap_usd"] is not None
            and payload["cost_usd"] is not None
            and Decimal(payload["cost_usd"]) >= fraction * Decimal(payload["cost_cap_usd"])
        ):
            hit.append("cost")
    except (InvalidOperation, TypeError):
        pass
    if not hit:
        return "budget"
    return f"{' and '.join(hit)} cap{'s' if len(hit) > 1 else ''}"


def alert_headline(payload: dict[str, Any]) -> str:
    """What happened, after "session <id>": "exhausted its token cap", …"""
    kind = payload["kind"]
    detail = payload["detail"] if isinstance(payload["detail"], dict) else {}
    if kind == BudgetEvent.Kind.EXHAUSTED:
        if detail.get("reason") == "runaway":  # held at exhausted by a runaway, not a cap
            why = detail.get("runaway")
            return "was stopped as runaway" + (f" ({why})" if why else "")
        return f"exhausted its {_caps_reached(payload, Decimal(1))}"
    if kind == BudgetEvent.Kind.SOFT_WARNED:
        try:
            pct = Decimal(str(detail.get("warn_at_pct", settings.COSTBOARD_WARN_AT_PCT)))
        except InvalidOperation:
            pct = settings.COSTBOARD_WARN_AT_PCT
        return f"passed {pct * 100:.0f}% of its {_caps_reached(payload, pct)}"
    why = detail.get("reason") or detail.get("rule")
    return "looks runaway" + (f" ({why})" if why else "")


def alert_email(payload: dict[str, Any]) -> tuple[str, str]:
    """The subject and plain-text body of an alert email."""
    headline = alert_headline(payload)
    subject = f"[Costboard] {payload['project']}: session {payload['session_id']} {headline}"
    cost_cap = f" of ${payload['cost_cap_usd']}" if payload["cost_cap_usd"] else ""
    lines = [
        f"Session {payload['session_id']} of project {payload['project']} {headline}.",
        "",
        f"Event:       {payload['kind']} at {payload['at']}",
        f"State:       {payload['state']}" + (", runaway" if payload["runaway"] else ""),
        f"Tokens used: {payload['tokens_used']:,} of {payload['token_cap']:,}",
        f"Cost:        ${payload['cost_usd']}{cost_cap}",
        f"Detail:      {json.dumps(payload['detail'], sort_keys=True)}",
        f"Session:     {payload['session_url']}",
        "",
        f"Costboard alert delivery {payload['delivery_id']} (budget event {payload['event_id']}).",
        "These emails go to the addresses in the project's alert emails (admin, Projects).",
    ]
    return subject, "\n".join(lines) + "\n"


def _email_send(delivery: AlertDelivery) -> Attempt:
    subject, body = alert_email(alert_payload(delivery))
    try:
        send_mail(subject, body, None, [delivery.target], fail_silently=False)
    except Exception as exc:  # SMTP errors come in many types; each is retried
        return Attempt(ok=False, error=_describe(exc))
    return Attempt(ok=True)


def alert_deliveries_retry(*, delivery_ids: list[int]) -> int:
    """Send failed deliveries again (the admin's retry action): each back to pending with its
    attempts kept, queued once the transaction commits. Others are left as they are. Returns
    how many were queued."""
    with transaction.atomic():
        failed = list(
            AlertDelivery.objects.select_for_update()
            .filter(pk__in=delivery_ids, status=AlertDelivery.Status.FAILED)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        AlertDelivery.objects.filter(pk__in=failed).update(status=AlertDelivery.Status.PENDING)

        def enqueue() -> None:
            for delivery_id in failed:
                alert_deliver.delay(delivery_id)

        transaction.on_commit(enqueue)
    return len(failed)
