"""What an alert says: the JSON body a webhook receives and its signature, the subject and
text of an alert email, a Slack message and a PagerDuty event, each made from one payload
(`alert_payload`). Sending them, and when, is costboard/budgets/alerts.py's; the Slack and
PagerDuty bodies are shown in docs/budgets.md, "Alerts".

Webhook requests
----------------
`POST <url>`, body JSON (UTF-8)::

    {"delivery_id": 17, "event_id": 42, "kind": "exhausted", "at": "2026-05-01T12:00:00+00:00",
     "project": "acme", "session_id": "chat-42", "state": "exhausted", "runaway": false,
     "tokens_used": 1000, "token_cap": 1000, "cost_usd": "0.0078", "cost_cap_usd": "5.00",
     "detail": {...}, "session_url": "https://costboard.example/sessions/5/?project=acme"}

A billing drift (`"kind": "billing_drift"`, docs/billing.md, "Reconciliation") says which
provider's UTC day was billed how far from Costboard's estimate::

    {"delivery_id": 18, "event_id": 7, "kind": "billing_drift", "at": "2026-11-02T06:00:00+00:00",
     "project": "acme", "provider": "openai", "day": "2026-11-01",
     "estimated_cost_usd": "90.00", "billed_cost_usd": "100.00", "drift_usd": "10.00",
     "drift_pct": "10.00", "threshold_pct": "5.00",
     "reconciliation_url": "https://costboard.example/reconciliation/?project=acme&…"}

`event_id` is then the drift's id (its own sequence, not a budget event's).

A period budget's crossing has `"session_id": null`, the budget in its period under `budget`
(`<period budget>`, docs/api.md), `member` and `budget_url` (its page).

A spend anomaly (`"kind": "anomaly"`, docs/budgets.md, "Spend anomalies") says whose day's
spend rose how far above its trailing days, in figures and in words (`event_id`: the
anomaly's id; `tag` null for the whole project, whose `top_tag` names the tag value whose
share rose most)::

    {"delivery_id": 19, "event_id": 3, "kind": "anomaly", "at": "2026-11-20T12:00:00+00:00",
     "project": "acme", "day": "2026-11-20", "tag": null, "spend_usd": "41.20",
     "mean_usd": "6.10", "stddev_usd": "2.30", "history_days": 14, "k": "3.00",
     "floor_usd": "5.00", "top_tag": "customer=acme", "top_share": "0.7800",
     "explanation": "$41.20 today against $6.10 ± $2.30 over 14 days; 78 % from customer=acme",
     "overview_url": "https://costboard.example/?project=acme"}

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
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from costboard.budgets.caps import session_budget
from costboard.budgets.engine import reached
from costboard.budgets.periods import HOUR, member_days, period_budget_view, rolling
from costboard.models import (
    AlertDelivery,
    BillingDrift,
    BudgetEvent,
    PeriodBudget,
    Project,
    Session,
    SpendAnomaly,
    usd,
)
from costboard.slack_text import slack_cut, slack_escaped, slack_literal, text_cut

SIGNATURE_TOLERANCE_SECONDS = 300


# --- the payload ------------------------------------------------------------------------------


def session_url(session: Session, project: Project) -> str:
    path = f"{reverse('session', args=[session.pk])}?project={project.slug}"
    return f"{settings.COSTBOARD_BASE_URL.rstrip('/')}{path}"


def budget_url(budget_id: int) -> str:
    return f"{settings.COSTBOARD_BASE_URL.rstrip('/')}{reverse('budget', args=[budget_id])}"


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


def _period_payload(delivery: AlertDelivery, event: BudgetEvent) -> dict[str, Any]:
    """A period budget's crossing: `session_id` null, the budget in the period it crossed in
    under `budget`, its limits as the caps; `member` the per-member budget's member it
    crossed for (null for other budgets)."""
    ledger = event.ledger
    assert ledger is not None  # noqa: S101 — narrows the type: a period event has its ledger
    budget = ledger.budget
    now = timezone.now()
    if rolling(budget) and ledger.window_start is not None:
        # the window the ledger's totals are of, not the one at the send (a late send's
        # window may hold none of the spend it names)
        now = ledger.window_start + ((budget.window_hours or 1) - 1) * HOUR
    key = (budget.pk, ledger.member)
    view = period_budget_view(budget, ledger, now=now, days=member_days([key], now)[key])
    return {
        "delivery_id": delivery.pk,
        "event_id": event.pk,
        "kind": event.kind,
        "at": event.at.isoformat(),
        "project": delivery.project.slug,
        "session_id": None,
        "member": ledger.member or None,
        "budget": view,
        "state": ledger.state,
        "runaway": False,
        "tokens_used": event.tokens_used,
        "token_cap": budget.token_limit,
        "cost_usd": usd(event.cost_usd),
        "cost_cap_usd": usd(budget.cost_limit_usd),
        "detail": event.detail,
        "session_url": None,
        "budget_url": budget_url(budget.pk),
    }


def _drift_payload(delivery: AlertDelivery, drift: BillingDrift) -> dict[str, Any]:
    project = delivery.project
    day = drift.day.isoformat()
    # `until` the day: the page's default period (the 30 days to today) has left the day
    # behind a month after the alert, and then names it outside the period shown
    query = urlencode(
        {"project": project.slug, "provider": drift.provider, "day": day, "until": day}
    )
    return {
        "delivery_id": delivery.pk,
        "event_id": drift.pk,
        "kind": "billing_drift",
        "at": drift.at.isoformat(),
        "project": project.slug,
        "provider": drift.provider,
        "day": drift.day.isoformat(),
        "estimated_cost_usd": usd(drift.estimated_cost_usd),
        "billed_cost_usd": usd(drift.billed_cost_usd),
        "drift_usd": usd(drift.drift_usd),
        "drift_pct": format(drift.drift_pct, "f"),
        "threshold_pct": format(drift.threshold_pct, "f"),
        "reconciliation_url": f"{settings.COSTBOARD_BASE_URL.rstrip('/')}"
        f"{reverse('reconciliation')}?{query}",
    }


def _anomaly_payload(delivery: AlertDelivery, anomaly: SpendAnomaly) -> dict[str, Any]:
    project = delivery.project
    return {
        "delivery_id": delivery.pk,
        "event_id": anomaly.pk,
        "kind": "anomaly",
        "at": anomaly.at.isoformat(),
        "project": project.slug,
        "day": anomaly.day.isoformat(),
        "tag": f"{anomaly.tag_key}={anomaly.tag_value}" if anomaly.tag_key else None,
        "spend_usd": usd(anomaly.spend_usd),
        "mean_usd": usd(anomaly.mean_usd),
        "stddev_usd": usd(anomaly.stddev_usd),
        "history_days": anomaly.history_days,
        "k": format(anomaly.k, "f"),
        "floor_usd": usd(anomaly.floor_usd),
        "top_tag": anomaly.top_tag or None,
        "top_share": None if anomaly.top_share is None else format(anomaly.top_share, "f"),
        "explanation": anomaly.explanation,
        "overview_url": f"{settings.COSTBOARD_BASE_URL.rstrip('/')}{reverse('overview')}"
        f"?{urlencode({'project': project.slug})}",
    }


def alert_payload(delivery: AlertDelivery) -> dict[str, Any]:
    """What a webhook receives and an email says (module docstring)."""
    if delivery.billing_drift is not None:
        return _drift_payload(delivery, delivery.billing_drift)
    if delivery.spend_anomaly is not None:
        return _anomaly_payload(delivery, delivery.spend_anomaly)
    event = delivery.budget_event
    assert event is not None  # noqa: S101 — narrows the type: a delivery has one of them
    session = event.session
    if session is None:
        return _period_payload(delivery, event)
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


# --- email ------------------------------------------------------------------------------------


def _caps_reached(payload: dict[str, Any], fraction: Decimal) -> str:
    """ "token cap", "cost cap" or "token and cost caps": those reached at `fraction`."""
    hit = []
    token_cap, cost, cost_cap = payload["token_cap"], payload["cost_usd"], payload["cost_cap_usd"]
    try:
        if reached(payload["tokens_used"], _decimal(token_cap), fraction):
            hit.append("token")
        if cost is not None and reached(Decimal(cost), _decimal(cost_cap), fraction):
            hit.append("cost")
    except (InvalidOperation, TypeError):
        pass
    if not hit:
        return "budget"
    return f"{' and '.join(hit)} cap{'s' if len(hit) > 1 else ''}"


def _decimal(value: Any) -> Decimal | None:
    return None if value is None else Decimal(value)


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
    if kind == BudgetEvent.Kind.THRESHOLD:  # a period budget's warn fraction
        try:
            share = Decimal(str(detail["threshold"]))
        except (KeyError, InvalidOperation):
            return "passed a warn threshold of its budget"
        percent = format((share * 100).normalize(), "f")
        return f"passed {percent}% of its {_caps_reached(payload, share)}"
    if kind == BudgetEvent.Kind.FORECAST:
        return (
            f"is projected to pass its cost cap on {detail.get('crossing_date')} "
            f"(${detail.get('forecast_cost_usd')} by the period's end at "
            f"${detail.get('forecast_daily_usd')}/day)"
        )
    why = detail.get("reason") or detail.get("rule")
    return "looks runaway" + (f" ({why})" if why else "")


def _drift_email(payload: dict[str, Any]) -> tuple[str, str]:
    more = "more" if Decimal(payload["drift_usd"]) > 0 else "less"
    subject = (
        f"[Costboard] {payload['project']}: {payload['provider']} billed {payload['day']} "
        f"{payload['drift_pct'].lstrip('-')}% {more} than estimated"
    )
    lines = [
        f"{payload['provider']} billed ${payload['billed_cost_usd']} to project "
        f"{payload['project']} for {payload['day']} (UTC); Costboard's steps estimated "
        f"${payload['estimated_cost_usd']}.",
        "",
        f"Drift:       ${payload['drift_usd']} ({payload['drift_pct']}% of the billed cost; "
        f"the project's threshold is {payload['threshold_pct']}%)",
        f"Details:     {payload['reconciliation_url']}",
        "",
        f"Costboard alert delivery {payload['delivery_id']} (billing drift {payload['event_id']}).",
        "One alert per provider and day, however often the day is imported again.",
        "These emails go to the addresses in the project's alert emails (admin, Projects).",
    ]
    return subject, "\n".join(lines) + "\n"


def _anomaly_email(payload: dict[str, Any]) -> tuple[str, str]:
    whose = payload["tag"] or "spend"
    subject = (
        f"[Costboard] {payload['project']}: {whose} on {payload['day']} far above its usual "
        f"(${payload['spend_usd']})"
    )
    lines = [
        f"Project {payload['project']}, {payload['day']} (UTC): {payload['explanation']}.",
        "",
        f"The alert: more than {payload['k']} standard deviations above the mean of the days "
        f"before, and above ${payload['floor_usd']}.",
        f"Overview:    {payload['overview_url']}",
        "",
        f"Costboard alert delivery {payload['delivery_id']} (spend anomaly {payload['event_id']}).",
        "One alert per project or tag value and day.",
        "These emails go to the addresses in the project's alert emails (admin, Projects).",
    ]
    return subject, "\n".join(lines) + "\n"


# An email subject's characters at most: a mail header line may not pass 998 octets (RFC
# 5322), and a name quoted with escapes ('\U000e0001…') is one word with nowhere to fold
SUBJECT_CHARS = 250


def _email(payload: dict[str, Any]) -> tuple[str, str]:
    """The subject, whole and on one line, and the body of an alert email."""
    if payload["kind"] == "billing_drift":
        subject, body = _drift_email(payload)
    elif payload["kind"] == "anomaly":
        subject, body = _anomaly_email(payload)
    else:
        subject, body = _budget_email(payload)
    return " ".join(subject.splitlines()), body


def alert_email(payload: dict[str, Any]) -> tuple[str, str]:
    """The subject and plain-text body of an alert email. The subject is one line: a session
    id or a tag value is whatever an agent sent, a line break included, and a header with one
    is refused by the mail library (every attempt would fail); and past SUBJECT_CHARS it is
    cut with "…" (the body has it all)."""
    subject, body = _email(payload)
    if len(subject) > SUBJECT_CHARS:
        subject = subject[: SUBJECT_CHARS - 1] + "…"
    return subject, body


def _budget_email(payload: dict[str, Any]) -> tuple[str, str]:
    """A budget event's email: a session's crossing or a period budget's."""
    headline = alert_headline(payload)
    budget = payload.get("budget")
    if budget is not None:  # a period budget's crossing
        member = f" for {budget['member']!r}" if budget.get("member") else ""
        who = (
            f"budget {budget['name']!r}{member} ({budget['period']} from {budget['period_start']})"
        )
        where = f"Budget:      {budget['name']} (id {budget['id']}, {budget['scope']})"
    else:
        who = f"session {payload['session_id']}"
        where = f"Session:     {payload['session_url']}"
    subject = f"[Costboard] {payload['project']}: {who} {headline}"
    cost_cap = f" of ${payload['cost_cap_usd']}" if payload["cost_cap_usd"] else ""
    token_cap = f" of {payload['token_cap']:,}" if payload["token_cap"] is not None else ""
    lines = [
        f"{who[0].upper()}{who[1:]} of project {payload['project']} {headline}.",
        "",
        f"Event:       {payload['kind']} at {payload['at']}",
        f"State:       {payload['state']}" + (", runaway" if payload["runaway"] else ""),
        f"Tokens used: {payload['tokens_used']:,}{token_cap}",
        f"Cost:        ${payload['cost_usd']}{cost_cap}",
        f"Detail:      {json.dumps(payload['detail'], sort_keys=True)}",
        where,
        "",
        f"Costboard alert delivery {payload['delivery_id']} (budget event {payload['event_id']}).",
        "These emails go to the addresses in the project's alert emails (admin, Projects).",
    ]
    return subject, "\n".join(lines) + "\n"


def probe_payload(project: Project, *, at: datetime) -> dict[str, Any]:
    """What "Send a test alert" (the project admin) sends through each channel."""
    return {
        "delivery_id": None,
        "event_id": None,
        "kind": "test",
        "at": at.isoformat(),
        "project": project.slug,
        "message": "A test alert from Costboard's admin: this channel reaches you.",
    }


def probe_email(payload: dict[str, Any]) -> tuple[str, str]:
    return (
        f"[Costboard] {payload['project']}: a test alert",
        f"{payload['message']}\n\nSent at {payload['at']} for project {payload['project']}.\n",
    )


def alert_summary(payload: dict[str, Any]) -> str:
    """One line: what happened to what ("acme: budget 'monthly' (month from …) exhausted its
    cost cap"), the email's subject without its tag."""
    if payload["kind"] == "test":
        return f"{payload['project']}: a test alert from Costboard"
    subject, _ = _email(payload)
    return subject.removeprefix("[Costboard] ")


def alert_link(payload: dict[str, Any]) -> str | None:
    """The page of what the alert is about (absolute when COSTBOARD_BASE_URL is set)."""
    for key in ("budget_url", "session_url", "reconciliation_url", "overview_url", "url"):
        if isinstance(payload.get(key), str):
            return str(payload[key])
    return None


def _money(amount: Any) -> str:
    return "—" if amount is None else f"${amount}"


def alert_facts(payload: dict[str, Any]) -> list[tuple[str, str]]:
    """The alert's facts as (label, text) pairs: what a Slack message shows as fields and a
    PagerDuty event carries as custom details."""
    budget = payload.get("budget")
    facts: list[tuple[str, str]] = []
    if isinstance(budget, dict):
        scope = budget["scope"] + (f" {budget['scope_value']}" if budget["scope_value"] else "")
        if budget.get("member"):
            scope += f" (member {budget['member']})"
        facts.append(("Budget", f"{budget['name']} (id {budget['id']})"))
        facts.append(("Scope", scope))
        facts.append(
            ("Spend / limit", f"{_money(budget['cost_usd'])} / {_money(budget['cost_limit_usd'])}")
        )
        if budget["token_limit"] is not None:
            facts.append(
                ("Tokens / limit", f"{budget['tokens_used']:,} / {budget['token_limit']:,}")
            )
        if budget.get("forecast_cost_usd") is not None:
            facts.append(("Forecast", f"{_money(budget['forecast_cost_usd'])} by the period's end"))
        facts.append(("Period", f"{budget['period']} from {budget['period_start']}"))
    elif payload.get("session_id") is not None:
        facts.append(("Session", str(payload["session_id"])))
        facts.append(
            ("Spend / cap", f"{_money(payload['cost_usd'])} / {_money(payload['cost_cap_usd'])}")
        )
        facts.append(("Tokens / cap", f"{payload['tokens_used']:,} / {payload['token_cap']:,}"))
        facts.append(("State", payload["state"] + (", runaway" if payload["runaway"] else "")))
    elif payload["kind"] == "billing_drift":
        facts.append(("Provider", f"{payload['provider']}, {payload['day']} (UTC)"))
        facts.append(
            (
                "Billed / estimated",
                f"{_money(payload['billed_cost_usd'])} / {_money(payload['estimated_cost_usd'])}",
            )
        )
        facts.append(("Drift", f"{_money(payload['drift_usd'])} ({payload['drift_pct']}%)"))
    elif payload["kind"] == "anomaly":
        facts.append(
            ("Day", f"{payload['day']} (UTC)" + (f", {payload['tag']}" if payload["tag"] else ""))
        )
        facts.append(("Spend", str(payload["explanation"])))
    facts.append(("Project", str(payload["project"])))
    return facts


# --- Slack ------------------------------------------------------------------------------------


# Block Kit's limits: a section's text, one of its fields
SECTION_CHARS, FIELD_CHARS = 3000, 2000


def slack_message(payload: dict[str, Any]) -> dict[str, Any]:
    """The JSON an incoming webhook receives: `text` (the notification's line) and Block Kit
    blocks — the headline, the facts as fields (budget, scope and member, spend / limit, the
    forecast when known) and the link (absolute when COSTBOARD_BASE_URL is set). What users
    named (a project, session, budget, member, tag value) shows as written, and text past
    a block's limit is cut with "…" (costboard/slack_text.py)."""
    summary = alert_summary(payload)
    link = alert_link(payload)
    headline = slack_literal(summary)
    if payload["kind"] == "test":
        headline += f"\n{slack_escaped(payload['message'])}"
    blocks: list[dict[str, Any]] = [
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": f"*{slack_cut(headline, SECTION_CHARS - 2)}*"},
        }
    ]
    facts = alert_facts(payload) if payload["kind"] != "test" else []
    if facts:
        fields = []
        for label, text in facts[:10]:
            shown = f"*{label}*\n"
            fields.append(
                {
                    "type": "mrkdwn",
                    "text": shown + slack_cut(slack_literal(text), FIELD_CHARS - len(shown)),
                }
            )
        blocks.append({"type": "section", "fields": fields})
    context = f"Costboard · {payload['kind']} at {payload['at']}"
    if link is not None and link.startswith(("http://", "https://")):
        context += f" · <{link}|Open in Costboard>"
    elif link is not None:
        context += f" · {slack_escaped(link)}"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    # the notification's line is mrkdwn too: a budget named "<!channel>" must not ping
    text = slack_literal(summary) + ("" if link is None else f" {slack_escaped(link)}")
    return {"text": text, "blocks": blocks}


# --- PagerDuty --------------------------------------------------------------------------------

DEDUP_KEY_CHARS = 255  # the Events API v2's limit
SUMMARY_CHARS = 1024  # the Events API v2's limit on `payload.summary`


def dedup_key(parts: list[str]) -> str:
    """`costboard:<part>:…`; past PagerDuty's 255 characters, the long tail hashed."""
    key = ":".join(["costboard", *parts])
    if len(key) <= DEDUP_KEY_CHARS:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"{key[: DEDUP_KEY_CHARS - len(digest) - 1]}:{digest}"


def pagerduty_trigger(
    payload: dict[str, Any], *, routing_key: str, dedup: str, severity: str
) -> dict[str, Any]:
    """An Events API v2 `trigger` event: the summary, Costboard's host as the source, the
    event's time, the facts as custom details and the link (when absolute)."""
    base = settings.COSTBOARD_BASE_URL
    link = alert_link(payload)
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": dedup,
        "payload": {
            "summary": text_cut(alert_summary(payload), SUMMARY_CHARS),
            "source": urlsplit(base).hostname or "costboard",
            "severity": severity,
            "timestamp": payload["at"],
            "component": str(payload["budget"]["name"])
            if isinstance(payload.get("budget"), dict)
            else "sessions",
            "group": str(payload["project"]),
            "class": str(payload["kind"]),
            "custom_details": dict(alert_facts(payload)),
        },
        "client": "Costboard",
    }
    if base:
        event["client_url"] = base
    if link is not None and link.startswith(("http://", "https://")):
        event["links"] = [{"href": link, "text": "Open in Costboard"}]
    return event


def pagerduty_resolve(*, routing_key: str, dedup: str) -> dict[str, Any]:
    """An Events API v2 `resolve` event: the incident its `dedup_key` opened."""
    return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": dedup}


def incident_dedup_key(delivery: AlertDelivery) -> str:
    """The PagerDuty incident a delivery triggers or resolves: one per budget, member and
    period (`costboard:<project>:budget:<id>:<member>:<period start>`; a rolling budget's
    episodes after its first add `:episode:<n>`, so a late resolve of the last one never
    closes the next), per session (`costboard:<project>:session:<id>`), else per alert."""
    slug = delivery.project.slug
    event = delivery.budget_event
    if event is not None and event.ledger is not None:
        ledger = event.ledger
        parts = [slug, "budget", str(ledger.budget_id), ledger.member]
        parts.append(ledger.period_start.isoformat())
        if event.episode:
            parts += ["episode", str(event.episode)]
        return dedup_key(parts)
    if event is not None and event.session_id is not None:
        return dedup_key([slug, "session", str(event.session_id)])
    return dedup_key([slug, delivery.kind, str(delivery.budget_event_id or delivery.pk)])


def incident_severity(delivery: AlertDelivery) -> str:
    """critical when agents are told to stop (a stop budget, a session), else error."""
    event = delivery.budget_event
    if event is not None and event.ledger is not None:
        stops = event.ledger.budget.action == PeriodBudget.Action.STOP
        return "critical" if stops else "error"
    return "critical"
