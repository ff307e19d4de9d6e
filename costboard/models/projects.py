"""Who reports and who sees: a project with its caps and rules, its API keys (only their
hashes stored), and the people who may see its pages."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Collection
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, validate_email
from django.db import models
from django.utils import timezone

from costboard.egress import webhook_url_check
from costboard.models.fields import cap_field
from costboard.tag_values import TAG_KEY

ALERT_CHANNELS = ("webhook", "email", "slack", "pagerduty")
# an Events API v2 integration key (a service's, or an event orchestration's "R0…")
ROUTING_KEY = re.compile(r"[A-Za-z0-9]{32}")


def alert_channels_fault(value: Any) -> str | None:
    """What is wrong with a list of alert channels (a project's defaults, a budget's), or
    None: a list of distinct names of ALERT_CHANNELS."""
    names = ", ".join(f'"{name}"' for name in ALERT_CHANNELS)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return f'must be a list of channel names, e.g. ["webhook", "slack"]: any of {names}'
    unknown = [item for item in value if item not in ALERT_CHANNELS]
    if unknown:
        return f"{unknown[0]!r} is not a channel: use any of {names}"
    if len(set(value)) != len(value):
        return "names a channel twice: list each once"
    return None


def channel_setup_fault(project: Project, channels: Collection[str]) -> tuple[str, str] | None:
    """(the project field to set, why) when `channels` name Slack or PagerDuty and the
    project has no Slack URL or routing key; else None."""
    if "slack" in channels and not project.slack_webhook_url:
        return (
            "slack_webhook_url",
            "slack needs the project's Slack incoming-webhook URL: set it on the project "
            "(admin, Projects) or leave slack out",
        )
    if "pagerduty" in channels and not project.pagerduty_routing_key:
        return (
            "pagerduty_routing_key",
            "pagerduty needs the project's PagerDuty routing key: set it on the project "
            "(admin, Projects) or leave pagerduty out",
        )
    return None


# how `alert_emails` and `report_recipients` are split into addresses
ADDRESS_SEPARATORS = re.compile(r"[\s,;]+")


def addresses_read(text: str) -> tuple[list[str], list[str]]:
    """An address list (`alert_emails`, `report_recipients`) as (the addresses, each once
    whatever its case, by its first spelling; the items that are no address). The senders
    mail the first and skip the second; the admin names the second."""
    valid: list[str] = []
    invalid: list[str] = []
    seen: set[str] = set()
    for item in ADDRESS_SEPARATORS.split(text):
        if not item or item.casefold() in seen:
            continue
        seen.add(item.casefold())
        try:
            validate_email(item)
        except ValidationError:
            invalid.append(item)
        else:
            valid.append(item)
    return valid, invalid


def default_alert_channels() -> list[str]:
    """A project's channels until someone picks: the two it had before Slack and PagerDuty."""
    return ["webhook", "email"]


class Project(models.Model):
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=100, unique=True)
    token_cap = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Per-session token cap; blank: the environment default."
    )
    cost_cap_usd = cap_field(help_text="Per-session USD cap; blank: the environment default.")
    warn_at_pct = models.DecimalField(
        max_digits=4,
        decimal_places=3,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0.001")), MaxValueValidator(Decimal(1))],
        help_text="Soft warning as a fraction of the cap (0.8 = 80%); blank: the default.",
    )
    # The `system` session (steps sent without a session_id) has caps of its own.
    system_token_cap = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Token cap of the `system` session; blank: as above."
    )
    system_cost_cap_usd = cap_field(help_text="USD cap of the `system` session; blank: as above.")
    # Runaway rules (0 turns a rule off). The per-turn ones run inside ingest, the window
    # ones in the sweep every minute.
    runaway_failed_steps = models.PositiveIntegerField(
        default=5, help_text="Retry loop: this many consecutive failed steps in one turn."
    )
    runaway_repeated_steps = models.PositiveIntegerField(
        default=8,
        help_text="Retry loop: the same step (type, model, prompt size) this many times in a "
        "row in one turn.",
    )
    runaway_turn_steps = models.PositiveIntegerField(
        default=50, help_text="A turn with more than this many steps (a correction cycle)."
    )
    runaway_burn_window_minutes = models.PositiveIntegerField(
        default=10, help_text="Burn rate and projected overrun: the sliding window, in minutes."
    )
    runaway_burn_factor = models.DecimalField(
        max_digits=8,
        decimal_places=2,
        default=Decimal(10),
        validators=[MinValueValidator(Decimal(0))],
        help_text="Burn rate: tokens per minute over the window above this many times the "
        "project's normal rate.",
    )
    runaway_burn_floor = models.PositiveIntegerField(
        default=20_000,
        help_text="Burn rate: never flagged below this many tokens per minute.",
    )
    runaway_overrun_minutes = models.PositiveIntegerField(
        default=30,
        help_text="Projected overrun: at the window's rate the session reaches a cap within "
        "this many minutes.",
    )
    runaway_max_hours = models.PositiveIntegerField(
        default=8, help_text="A session still active this many hours after it started."
    )
    runaway_stops = models.BooleanField(
        default=True,
        help_text="A runaway session is told to stop: its state becomes exhausted (what "
        "clients stop on) until someone acknowledges it on the flagged page.",
    )
    retention_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Steps older than this are deleted (rollups stay), and ended sessions' "
        "budget events after it; blank: keep all.",
    )
    alert_emails = models.TextField(
        blank=True,
        help_text="Budget alerts (soft warned, exhausted, runaway) by email too: addresses, "
        "one per line or comma-separated.",
    )
    # Where alerts go beyond the signed webhooks and email (docs/budgets.md, "Alerts"): a
    # Slack incoming webhook, a PagerDuty Events API v2 routing key, and which channels a
    # budget without its own list uses.
    slack_webhook_url = models.URLField(
        "Slack incoming-webhook URL",
        max_length=500,
        blank=True,
        help_text="https://hooks.slack.com/services/…: alerts and spend reports as Slack "
        "messages; blank: no Slack.",
    )
    pagerduty_routing_key = models.CharField(
        "PagerDuty routing key",
        max_length=64,
        blank=True,
        help_text="An Events API v2 integration key: a budget exhausted triggers an incident, "
        "resolved when the period rolls over or the limit is raised; blank: no PagerDuty.",
    )
    alert_channels = models.JSONField(
        default=default_alert_channels,
        blank=True,
        help_text='The channels of budgets that name none: any of "webhook", "email", '
        '"slack", "pagerduty".',
    )
    # The weekly and monthly showback (docs/reports.md)
    report_recipients = models.TextField(
        blank=True,
        help_text="Who gets the weekly and monthly spend report by email: addresses, one per "
        "line or comma-separated; blank: nobody (the page /reports/ is there either way).",
    )
    report_tag_key = models.CharField(
        max_length=64,
        blank=True,
        help_text='The tag key the report groups spend by (e.g. "customer"); blank: the '
        "report has no tag table.",
    )
    reconciliation_drift_pct = models.DecimalField(
        "reconciliation drift alert (%)",
        max_digits=6,
        decimal_places=2,
        null=True,
        blank=True,
        default=Decimal(5),
        validators=[MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(1000))],
        help_text="Alert (billing_drift) when one provider's billed cost for a day differs "
        "from Costboard's estimate by more than this percentage of the billed cost, once per "
        'provider and day (docs/billing.md, "Reconciliation"); blank: no drift alerts.',
    )
    # Spend anomalies (docs/budgets.md, "Spend anomalies"): checked by the sweep
    anomaly_k = models.DecimalField(
        "anomaly: standard deviations",
        max_digits=6,
        decimal_places=2,
        null=True,
        blank=True,
        default=Decimal(3),
        validators=[MinValueValidator(Decimal(0))],
        help_text="Alert (anomaly) when a day's spend, the project's or one tag value's, is "
        "more than this many standard deviations above its trailing 14 days' mean; blank: "
        "no anomaly alerts.",
    )
    anomaly_floor_usd = models.DecimalField(
        "anomaly floor (USD)",
        max_digits=14,
        decimal_places=4,
        default=Decimal(5),
        validators=[MinValueValidator(Decimal(0))],
        help_text="…and above this many dollars: a small day is never an anomaly.",
    )
    api_rate_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="API requests per second per key (beyond it: 429); 0 turns the limit off; "
        "blank: COSTBOARD_API_RATE_LIMIT.",
    )
    api_max_in_flight = models.PositiveIntegerField(
        "API requests in flight",
        null=True,
        blank=True,
        help_text="API requests per key being answered at once (beyond it: 429); 0 turns the "
        "limit off; blank: COSTBOARD_API_MAX_IN_FLIGHT.",
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    # Not stored: what validation found worth telling whoever saves (a Slack host that does
    # not resolve from here), for the admin to show.
    slack_url_note = ""

    def __str__(self) -> str:
        return self.name

    def clean_fields(self, exclude: Collection[str] | None = None) -> None:
        """Also the alert channels' fields (docs/budgets.md, "Alerts"): the Slack URL through
        the egress check (costboard/egress.py), the routing key's shape, the channel names."""
        errors: dict[str, list[ValidationError]] = {}
        try:
            super().clean_fields(exclude)
        except ValidationError as exc:
            errors = exc.update_error_dict(errors)
        skip = set(exclude or ())
        if self.slack_webhook_url and not {"slack_webhook_url"} & (set(errors) | skip):
            check = webhook_url_check(self.slack_webhook_url)
            self.slack_url_note = check.note
            if check.refusal:
                errors["slack_webhook_url"] = [
                    ValidationError(
                        "This URL is refused: %(reason)s. Use the https://hooks.slack.com/… "
                        "URL of the Slack app's incoming webhook.",
                        code="egress",
                        params={"reason": check.refusal},
                    )
                ]
        for name in ("alert_emails", "report_recipients"):
            bad = [] if name in skip or name in errors else addresses_read(getattr(self, name))[1]
            if bad:
                shown = ", ".join(f"“{item[:80]}”" for item in bad[:5])
                errors[name] = [
                    ValidationError(
                        "Not an email address: %(shown)s. Write bare addresses "
                        "(ann@example.com), one per line or comma-separated.",
                        code="address",
                        params={"shown": shown},
                    )
                ]
        tag_key = self.report_tag_key
        if tag_key and "report_tag_key" not in skip and not TAG_KEY.fullmatch(tag_key):
            errors["report_tag_key"] = [
                ValidationError(
                    "Not a tag key: up to 64 of a-z 0-9 _ . - as agents send tags (e.g. "
                    "customer), or blank for no tag table.",
                    code="tag_key",
                )
            ]
        key = self.pagerduty_routing_key
        if key and "pagerduty_routing_key" not in skip and not ROUTING_KEY.fullmatch(key):
            errors["pagerduty_routing_key"] = [
                ValidationError(
                    "Not a PagerDuty routing key: use the 32-letter-and-digit Integration Key "
                    "of the service's Events API v2 integration (PagerDuty, Service, "
                    "Integrations), or leave it blank.",
                    code="routing_key",
                )
            ]
        if "alert_channels" not in skip and "alert_channels" not in errors:
            fault = alert_channels_fault(self.alert_channels)
            if fault:
                errors["alert_channels"] = [ValidationError(fault, code="channels")]
        if errors:
            raise ValidationError(errors)

    def clean(self) -> None:
        """Default channels that need a Slack URL or a routing key the project lacks."""
        super().clean()
        if alert_channels_fault(self.alert_channels) is None:
            found = channel_setup_fault(self, self.alert_channels)
            if found is not None:
                raise ValidationError({"alert_channels": found[1]})


def _key_hash(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


class ApiKey(models.Model):
    """An API key of a project. Only its SHA-256 is stored; the key itself is shown once.

    Its role says what it may do: `ingest` (the default) sends usage and reads what an agent
    reads (budgets, context, memory); `read` only reads (the spend export among them);
    `admin` does everything, budgets' edits too (docs/api.md, "Keys and roles")."""

    PREFIX = "cb_"

    class Role(models.TextChoices):
        INGEST = "ingest", "ingest: send usage, read what an agent reads"
        READ = "read", "read: reads only (spend export)"
        ADMIN = "admin", "admin: everything, budget edits too"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    role = models.CharField(
        max_length=8, choices=Role.choices, default=Role.INGEST, db_default=Role.INGEST
    )
    prefix = models.CharField(max_length=12, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.project.slug})"

    @classmethod
    def issue(
        cls, *, project: Project, name: str = "", role: str = Role.INGEST
    ) -> tuple[ApiKey, str]:
        raw_key = cls.PREFIX + secrets.token_urlsafe(32)
        key = cls.objects.create(
            project=project,
            name=name,
            role=role,
            prefix=raw_key[:10],
            key_hash=_key_hash(raw_key),
        )
        return key, raw_key

    @classmethod
    def hash_of(cls, raw_key: str) -> str:
        return _key_hash(raw_key)

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None


class Membership(models.Model):
    """Who may see a project's pages. Staff see every project."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "project"], name="membership_user_project")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project}"
