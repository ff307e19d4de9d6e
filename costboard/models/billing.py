"""What providers bill (docs/billing.md): one row per provider × day × what the provider's
report names (model or line item, its project or workspace, API key, service tier), from one
source — a provider's cost or usage report, a CSV uploaded in the admin, or
`POST /api/v1/billing`. A cost source carries `cost_usd`; a usage source carries tokens. A
day's rows of one provider and source are replaced whole by each import of that day.

A provider's project (OpenAI) or workspace (Anthropic) is mapped to a Costboard project by
`ProviderProject`; a row of an unmapped one keeps its provider id with `project` null."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from costboard.models.fields import money_field
from costboard.models.projects import Project


class ProviderProject(models.Model):
    """A provider's project (OpenAI `project_id`) or workspace (Anthropic `workspace_id`)
    whose billed rows belong to a Costboard project."""

    class Provider(models.TextChoices):
        OPENAI = "openai", "OpenAI (project id, proj_…)"
        ANTHROPIC = "anthropic", "Anthropic (workspace id, wrkspc_…)"

    provider = models.CharField(max_length=32, choices=Provider.choices)
    external_id = models.CharField(
        max_length=200,
        help_text="The provider's project id (OpenAI, proj_…) or workspace id (Anthropic, "
        "wrkspc_…), as its usage and cost reports name it.",
    )
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        verbose_name = "provider project mapping"
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "external_id"], name="provider_project_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.provider} {self.external_id} → {self.project_id}"


class BilledUsage(models.Model):
    """One row of what a provider billed or reported for a UTC day."""

    class Source(models.TextChoices):
        OPENAI_COSTS = "openai_costs", "OpenAI Costs API"
        OPENAI_USAGE = "openai_usage", "OpenAI Usage API (completions)"
        ANTHROPIC_COST_REPORT = "anthropic_cost_report", "Anthropic cost report"
        ANTHROPIC_USAGE = "anthropic_usage", "Anthropic messages usage report"
        CSV = "csv", "CSV uploaded in the admin"
        API = "api", "POST /api/v1/billing"

    provider = models.CharField(max_length=64)
    source = models.CharField(max_length=32, choices=Source.choices)
    day = models.DateField(help_text="The UTC day billed.")
    model = models.CharField(max_length=200, null=True, blank=True)
    # OpenAI's line_item ("gpt-4o-2024-08-06, input"), Anthropic's description
    line_item = models.CharField(max_length=300, null=True, blank=True)
    # OpenAI's project_id, Anthropic's workspace_id (null: the provider named none)
    provider_project = models.CharField(max_length=200, null=True, blank=True)
    project = models.ForeignKey(
        Project, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    provider_api_key = models.CharField(max_length=200, null=True, blank=True)
    service_tier = models.CharField(max_length=64, null=True, blank=True)
    # USD, exact; null on a usage source (tokens only)
    cost_usd = models.DecimalField(max_digits=24, decimal_places=12, null=True, blank=True)
    # Costboard's token semantics (Anthropic's): input excludes cache reads and writes
    input_tokens = models.BigIntegerField(null=True, blank=True)
    output_tokens = models.BigIntegerField(null=True, blank=True)
    cache_read_input_tokens = models.BigIntegerField(null=True, blank=True)
    cache_creation_input_tokens = models.BigIntegerField(null=True, blank=True)
    requests = models.BigIntegerField(null=True, blank=True)
    imported_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "billed usage"
        verbose_name_plural = "billed usage"
        indexes = [
            models.Index(fields=["provider", "source", "day"], name="billed_provider_day"),
            models.Index(fields=["day", "provider"], name="billed_day_provider"),
        ]

    def __str__(self) -> str:
        return f"{self.provider} {self.day} {self.model or self.line_item or ''}"


class BillingDrift(models.Model):
    """A provider's UTC day whose billed cost for a project drifted from Costboard's estimate
    past the project's `reconciliation_drift_pct`: recorded once per project, provider and
    day, however often the day is imported again, and alerted (`billing_drift`) through the
    outbox like a budget event (docs/billing.md, "Reconciliation")."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    provider = models.CharField(max_length=64)
    day = models.DateField(help_text="The UTC day billed.")
    estimated_cost_usd = money_field()
    billed_cost_usd = money_field()
    drift_usd = money_field(help_text="billed − estimated")
    drift_pct = models.DecimalField(
        max_digits=12, decimal_places=2, help_text="drift ÷ billed × 100"
    )
    threshold_pct = models.DecimalField(
        max_digits=6, decimal_places=2, help_text="The project's threshold when it was passed."
    )
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "billing drift"
        ordering = ["-day", "provider"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "provider", "day"], name="billing_drift_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.provider} {self.day} {self.drift_pct}%"
