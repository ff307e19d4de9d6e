"""Sending one alert through its channel — a signed webhook, an email, a Slack message, a
PagerDuty event — and the project admin's "Send a test alert". Which deliveries exist and
when they are attempted is costboard/budgets/alerts.py's; what each says is
costboard/budgets/alert_messages.py's. Nothing here writes to the database.

Every HTTP channel goes through the egress rules (costboard/egress.py): a webhook's or a Slack
URL is checked at every send and the request connects to the checked addresses only, with no
proxy and no redirect; PagerDuty's Events API URL is the operator's setting
(COSTBOARD_PAGERDUTY_EVENTS_URL), resolved but not refused. One retry policy for all of them
(the alerts module's docstring): 2xx delivered (PagerDuty answers 202), 3xx (a redirect,
naming where to) and 4xx but 408 and 429 failed at once, anything else retried. A failure
keeps its status and a short reason of ours, never the receiver's reply (a redirect's
Location is ours to show, cut to its scheme, host and path); a routing key or a Slack URL is
shown masked (`shown_target`).
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import parseaddr
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage
from django.utils import timezone
from django.utils.crypto import salted_hmac

from costboard.budgets.alert_messages import (
    alert_email,
    alert_payload,
    dedup_key,
    incident_dedup_key,
    incident_severity,
    pagerduty_resolve,
    pagerduty_trigger,
    probe_email,
    probe_payload,
    signature,
    slack_message,
)
from costboard.egress import (
    Destination,
    WebhookRefused,
    redirect_reason,
    short,
    status_reason,
    trusted_destination,
    webhook_destination,
    webhook_opener,
)
from costboard.models import AlertDelivery, Project, WebhookEndpoint
from costboard.models.alerts import shown_target
from costboard.models.projects import addresses_read

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Attempt:
    ok: bool
    response_code: int | None = None
    error: str = ""
    permanent: bool = False  # retrying would fail the same way


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def alert_addresses(text: str) -> list[str]:
    """The valid addresses of `Project.alert_emails` (split on commas, semicolons and
    whitespace), each once whatever its case (one mailbox, one mail: the first spelling);
    an invalid one is skipped with a log line (`addresses_read`)."""
    addresses, invalid = addresses_read(text)
    for item in invalid:
        log.warning("alert email %r is not a valid address; skipped", item)
    return addresses


# --- one POST ---------------------------------------------------------------------------------


def _destination(url: str, *, checked: bool) -> Destination | Attempt:
    """Where the request may connect, or the failed Attempt that says why not."""
    try:  # resolved once here; the request connects to these addresses only
        return webhook_destination(url) if checked else trusted_destination(url)
    except WebhookRefused as exc:
        return Attempt(ok=False, error=short(f"refused: {exc}"), permanent=True)
    except (OSError, UnicodeError) as exc:  # the name does not resolve (now): retried
        return Attempt(ok=False, error=short(f"cannot resolve the host: {describe(exc)}"))


# A host whose receiver let a request time out is left alone for a while: its next deliveries
# in this process fail at once (retried on their schedule) instead of each waiting out
# COSTBOARD_ALERT_TIMEOUT_SECONDS, while the alerts claimed behind them — a target's go one
# after another, and the dispatcher's few threads may all be taken — wait on a receiver that
# hangs. Dispatching threads share it (under the lock).
SILENT_FOR = timedelta(seconds=60)
_silent: dict[tuple[str, int], datetime] = {}  # (host, port) → until when
_silent_lock = threading.Lock()


def _timed_out(exc: BaseException) -> bool:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return isinstance(reason, TimeoutError)


def _still_silent(destination: Destination) -> datetime | None:
    """Until when the destination's host is left alone, if it is now."""
    key = (destination.host, destination.port)
    with _silent_lock:
        until = _silent.get(key)
        if until is not None and until <= timezone.now():
            del _silent[key]
            return None
        return until


def _fell_silent(destination: Destination) -> None:
    with _silent_lock:
        _silent[(destination.host, destination.port)] = timezone.now() + SILENT_FOR


def silent_hosts_forget() -> None:
    """Ask every host again at its next delivery (tests: a port of one test's receiver may
    be another's next)."""
    with _silent_lock:
        _silent.clear()


NO_REPLY = "no reply: the receiver closed the connection without answering"


def post_json(
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    checked: bool = True,
    path_secret: bool = False,
) -> Attempt:
    """POST a JSON body, with the retry policy's reading of what came back. `checked`: the
    URL goes through the egress check (one typed into the admin). A host that let a request
    time out in the last SILENT_FOR is not asked again until then: a retryable failure. A
    redirect fails at once, naming where it goes (`path_secret`: without its path, as for
    a Slack URL)."""
    destination = _destination(url, checked=checked)
    if isinstance(destination, Attempt):
        return destination
    silent = _still_silent(destination)
    if silent is not None:
        return Attempt(
            ok=False,
            error=short(
                f"not sent: {destination.host} let a request time out; "
                f"not asked again before {silent:%H:%M:%S} UTC"
            ),
        )
    request = urllib.request.Request(  # noqa: S310 — http(s) only: _host_and_port checks it
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "Costboard", **headers},
    )
    timeout = float(settings.COSTBOARD_ALERT_TIMEOUT_SECONDS)
    try:
        with webhook_opener(destination).open(request, timeout=timeout) as response:
            code = response.status
    except urllib.error.HTTPError as exc:  # every status outside 2xx
        code = exc.code
        location = exc.headers.get("Location") if exc.headers is not None else None
        exc.close()  # unread: a failure keeps its status, never the receiver's body
        if 300 <= code < 400:  # not followed, and a retry would be redirected the same
            error = redirect_reason(code, location, url, path_secret=path_secret)
            return Attempt(ok=False, response_code=code, error=error, permanent=True)
        permanent = 400 <= code < 500 and code not in {408, 429}
        return Attempt(ok=False, response_code=code, error=status_reason(code), permanent=permanent)
    except urllib.error.URLError as exc:  # refused, timeout while connecting, TLS
        if _timed_out(exc):
            _fell_silent(destination)
        return Attempt(ok=False, error=short(f"cannot connect: {exc.reason}"))
    except http.client.RemoteDisconnected:  # read the request, hung up without a word
        return Attempt(ok=False, error=NO_REPLY)
    except http.client.HTTPException as exc:  # a malformed reply: its text is the receiver's
        return Attempt(ok=False, error=f"bad HTTP reply ({type(exc).__name__})")
    except (OSError, ValueError) as exc:  # timeout, reset, …
        if _timed_out(exc):
            _fell_silent(destination)
        return Attempt(ok=False, error=short(describe(exc)))
    if 200 <= code < 300:
        return Attempt(ok=True, response_code=code)
    return Attempt(ok=False, response_code=code, error=status_reason(code))


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=str).encode()


# --- each channel -----------------------------------------------------------------------------


def _signed(secret: str, kind: str, delivery_id: str, body: bytes) -> dict[str, str]:
    timestamp = int(time.time())
    return {
        "X-Costboard-Event": kind,
        "X-Costboard-Delivery": delivery_id,
        "X-Costboard-Timestamp": str(timestamp),
        "X-Costboard-Signature": signature(secret, timestamp, body),
    }


def webhook_send(delivery: AlertDelivery) -> Attempt:
    endpoint = delivery.endpoint
    if endpoint is None:
        return Attempt(ok=False, error="the webhook endpoint was deleted", permanent=True)
    if not endpoint.active:
        return Attempt(ok=False, error="the webhook endpoint is inactive", permanent=True)
    body = _json(alert_payload(delivery))
    headers = _signed(endpoint.secret, delivery.kind, str(delivery.pk), body)
    return post_json(delivery.target, body, headers)


def message_id(kind: str, pk: int) -> str:
    """A delivery's Message-ID, the same at every attempt. Delivery is at least once: a
    dispatcher that dies between the SMTP server's yes and recording it sends the mail again,
    and the second carries the first's id, by which mail systems that drop a duplicate
    (Gmail, …) show it once. Unique to this installation by an HMAC of the delivery under
    SECRET_KEY; the domain is DEFAULT_FROM_EMAIL's."""
    token = salted_hmac("costboard.message-id", f"{kind}:{pk}").hexdigest()[:20]
    domain = parseaddr(settings.DEFAULT_FROM_EMAIL)[1].rpartition("@")[2].strip() or "localhost"
    try:
        domain = domain.encode("idna").decode("ascii")
    except UnicodeError:
        domain = "localhost"
    return f"<costboard.{kind}.{pk}.{token}@{domain}>"


def _mail(subject: str, body: str, address: str, *, message: str | None = None) -> Attempt:
    """One mail; `message`: its Message-ID (`message_id`), else one of Django's own."""
    headers = {"Message-ID": message} if message else {}
    try:
        EmailMessage(subject, body, None, [address], headers=headers).send()
    except Exception as exc:  # SMTP errors come in many types; each is retried
        return Attempt(ok=False, error=describe(exc))
    return Attempt(ok=True)


def email_send(delivery: AlertDelivery) -> Attempt:
    subject, body = alert_email(alert_payload(delivery))
    return _mail(subject, body, delivery.target, message=message_id("alert", delivery.pk))


def slack_send(delivery: AlertDelivery) -> Attempt:
    """The message to the incoming-webhook URL the delivery was made for."""
    body = _json(slack_message(alert_payload(delivery)))
    return post_json(delivery.target, body, {}, path_secret=True)


def _pagerduty_post(event: dict[str, Any]) -> Attempt:
    return post_json(settings.COSTBOARD_PAGERDUTY_EVENTS_URL, _json(event), {}, checked=False)


def pagerduty_send(delivery: AlertDelivery) -> Attempt:
    """A trigger (the alert) or a resolve, to the routing key the delivery was made for."""
    dedup = incident_dedup_key(delivery)
    if delivery.action == AlertDelivery.Action.RESOLVE:
        return _pagerduty_post(pagerduty_resolve(routing_key=delivery.target, dedup=dedup))
    event = pagerduty_trigger(
        alert_payload(delivery),
        routing_key=delivery.target,
        dedup=dedup,
        severity=incident_severity(delivery),
    )
    return _pagerduty_post(event)


SENDERS = {
    AlertDelivery.Channel.WEBHOOK: webhook_send,
    AlertDelivery.Channel.EMAIL: email_send,
    AlertDelivery.Channel.SLACK: slack_send,
    AlertDelivery.Channel.PAGERDUTY: pagerduty_send,
}


def channel_send(delivery: AlertDelivery) -> Attempt:
    return SENDERS[AlertDelivery.Channel(delivery.channel)](delivery)


# --- the admin's test -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbeSent:
    channel: str
    target: str  # as shown (shown_target)
    attempt: Attempt


def channels_test(project: Project, *, now: datetime) -> list[ProbeSent]:
    """Send a test alert now, in this request, to every channel the project has set up —
    each active webhook, each alert address, the Slack URL, the PagerDuty routing key (a
    `trigger` of severity info, resolved at once) — through the same senders as the alerts,
    recording nothing. Returns what each answered."""
    payload = probe_payload(project, at=now)
    body = _json(payload)
    sent: list[ProbeSent] = []
    for endpoint in WebhookEndpoint.objects.filter(project=project, active=True).order_by("pk"):
        headers = _signed(endpoint.secret, "test", "test", body)
        sent.append(ProbeSent("webhook", endpoint.url, post_json(endpoint.url, body, headers)))
    subject, text = probe_email(payload)
    for address in alert_addresses(project.alert_emails):
        sent.append(ProbeSent("email", address, _mail(subject, text, address)))
    if project.slack_webhook_url:
        url = project.slack_webhook_url
        attempt = post_json(url, _json(slack_message(payload)), {}, path_secret=True)
        sent.append(ProbeSent("slack", shown_target("slack", url), attempt))
    key = project.pagerduty_routing_key
    if key:
        dedup = dedup_key([project.slug, "test", now.isoformat()])
        attempt = _pagerduty_post(
            pagerduty_trigger(payload, routing_key=key, dedup=dedup, severity="info")
        )
        if attempt.ok:  # the test's incident closed again
            attempt = _pagerduty_post(pagerduty_resolve(routing_key=key, dedup=dedup))
        sent.append(ProbeSent("pagerduty", shown_target("pagerduty", key), attempt))
    return sent
