"""What goes out after a commit: the outbox of side effects (alerts, memory reads,
repricing, …), and the budget alerts it delivers: webhook endpoints and the delivery log."""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from costboard.egress import webhook_url_check
from costboard.models.anomalies import SpendAnomaly
from costboard.models.billing import BillingDrift
from costboard.models.budgets import BudgetEvent
from costboard.models.projects import Project

# forecast: a period budget projected to pass its USD limit this period (once per period);
# billing_drift: a provider's day billed past the project's drift threshold (docs/billing.md);
# anomaly: a day's spend far above its trailing 14 days (docs/budgets.md, "Spend anomalies");
# threshold: a period budget past one of its warn fractions (once per fraction and period)
ALERT_KINDS = [
    "soft_warned",
    "exhausted",
    "runaway",
    "forecast",
    "billing_drift",
    "anomaly",
    "threshold",
]


def _alert_kinds() -> list[str]:
    return list(ALERT_KINDS)


class WebhookEndpoint(models.Model):
    """Where a project's budget alerts are POSTed, signed with HMAC-SHA256 of the secret."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="webhooks")
    name = models.CharField(max_length=100, blank=True)
    url = models.URLField(max_length=500)
    secret = models.CharField(
        max_length=200, help_text="Shared secret: the X-Costboard-Signature is HMAC-SHA256."
    )
    kinds = models.JSONField(
        default=_alert_kinds,
        blank=True,
        help_text='Which alerts to send: any of "soft_warned", "exhausted", "runaway", '
        '"forecast", "billing_drift", "anomaly", "threshold".',
    )
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    # Not stored: what validation found worth telling whoever saves (a host that does not
    # resolve from here), for the admin to show.
    url_note = ""

    def __str__(self) -> str:
        return self.name or self.url

    def clean_fields(self, exclude: Collection[str] | None = None) -> None:
        """Also refuse a URL webhooks may not go to (costboard/egress.py), once the
        URL is a valid one: every ModelForm, the admin's too, shows it on the url field."""
        errors: dict[str, list[ValidationError]] = {}
        try:
            super().clean_fields(exclude)
        except ValidationError as exc:
            errors = exc.update_error_dict(errors)
        if "url" not in errors and "url" not in (exclude or ()):
            check = webhook_url_check(self.url)
            self.url_note = check.note
            if check.refusal:
                errors["url"] = [
                    ValidationError(
                        "This URL is refused: %(reason)s.",
                        code="egress",
                        params={"reason": check.refusal},
                    )
                ]
        if errors:
            raise ValidationError(errors)


def shown_target(channel: str, target: str) -> str:
    """A delivery's target as logs and the admin show it (AlertDelivery.target_shown)."""
    if channel == "pagerduty":
        return f"routing key …{target[-4:]}"
    if channel == "slack":
        parts = urlsplit(target)
        return f"{parts.scheme}://{parts.netloc}/…"
    return target


class AlertDelivery(models.Model):
    """One budget event, billing drift or spend anomaly sent (or being sent) through one
    channel to one target: the delivery log. Unique per source, channel, target and action,
    so an alert never goes out twice, and a PagerDuty incident is resolved once. Exactly one
    of `budget_event`, `billing_drift` and `spend_anomaly` is set."""

    class Channel(models.TextChoices):
        WEBHOOK = "webhook"
        EMAIL = "email"
        SLACK = "slack"
        PAGERDUTY = "pagerduty"

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    class Action(models.TextChoices):
        TRIGGER = "trigger", "trigger: the alert"
        # PagerDuty's resolve of the incident its trigger (same event, channel and target)
        # opened: the period rolled over, the limit was raised, the session acknowledged
        RESOLVE = "resolve", "resolve: the incident the alert opened"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    # no database constraint: budget events are keyed by (id, project_id) (docs/operations.md,
    # "Scaling out")
    budget_event = models.ForeignKey(
        BudgetEvent,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="deliveries",
        db_constraint=False,
    )
    billing_drift = models.ForeignKey(
        BillingDrift, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries"
    )
    spend_anomaly = models.ForeignKey(
        SpendAnomaly, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries"
    )
    channel = models.CharField(max_length=10, choices=Channel.choices)
    endpoint = models.ForeignKey(
        WebhookEndpoint,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="deliveries",
    )
    target = models.CharField(
        max_length=500,
        help_text="The URL, email address, Slack incoming-webhook URL or PagerDuty routing key.",
    )
    action = models.CharField(
        max_length=8, choices=Action.choices, default=Action.TRIGGER, db_default=Action.TRIGGER
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    response_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "alert deliveries"
        constraints = [
            models.UniqueConstraint(
                fields=["budget_event", "channel", "target", "action"], name="delivery_once"
            ),
            models.UniqueConstraint(
                fields=["billing_drift", "channel", "target", "action"],
                condition=models.Q(billing_drift__isnull=False),
                name="drift_delivery_once",
            ),
            models.UniqueConstraint(
                fields=["spend_anomaly", "channel", "target"],
                condition=models.Q(spend_anomaly__isnull=False),
                name="anomaly_delivery_once",
            ),
            models.CheckConstraint(
                condition=models.Q(
                    budget_event__isnull=False,
                    billing_drift__isnull=True,
                    spend_anomaly__isnull=True,
                )
                | models.Q(
                    budget_event__isnull=True,
                    billing_drift__isnull=False,
                    spend_anomaly__isnull=True,
                )
                | models.Q(
                    budget_event__isnull=True,
                    billing_drift__isnull=True,
                    spend_anomaly__isnull=False,
                ),
                name="delivery_one_source",
            ),
        ]
        indexes = [models.Index(fields=["project", "-created_at"], name="delivery_recent")]

    def __str__(self) -> str:
        return f"{self.channel} {self.target_shown} {self.status}"

    @property
    def target_shown(self) -> str:
        """The target as logs and the admin show it: a PagerDuty routing key by its last
        four characters, a Slack URL without its secret path."""
        return shown_target(self.channel, self.target)

    @property
    def kind(self) -> str:
        """The alert's kind: its budget event's, `billing_drift` or `anomaly`."""
        if self.budget_event_id is not None and self.budget_event is not None:
            return self.budget_event.kind
        if self.spend_anomaly_id is not None:
            return "anomaly"
        return "billing_drift"


class OutboxItem(models.Model):
    """A side effect (an alert to send, turns to read for memories, steps to reprice, …)
    written in the transaction that causes it and carried out after the commit by the
    dispatcher (costboard/outbox.py). Deleted once done; a failed one stays for the admin."""

    class Status(models.TextChoices):
        PENDING = "pending"
        FAILED = "failed"

    kind = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    # A dispatcher holds the item until then; past it, the item is taken to have died with it.
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="outbox_due",
                condition=models.Q(status="pending"),
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} {self.status}"
