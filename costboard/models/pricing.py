"""What a token costs: the rate table's rows, one series per provider, model and service
tier, each row from its date on (and, optionally, in a daily window); and the negotiated
adjustments (a percentage off or on list) applied over them."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from costboard.models.fields import rate_field
from costboard.models.projects import Project

# A built-in price without a start date applies since this instant ("always").
PRICE_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
# The service tier of a step that names none, and of the rate table's list prices
# (docs/pricing.md, "Service tiers").
STANDARD_TIER = "standard"
MAX_TIER_LENGTH = 32
# A tier word as sent: letters, digits and _ . - : (lower-cased when stored).
TIER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
# The same with its length, for a whole value (`fullmatch`): a page's `?tier=`.
TIER_WORD = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{MAX_TIER_LENGTH - 1}}}")
# Providers' words for their standard tier: OpenAI answers "default" (and "auto" is what a
# request asks for when it leaves the choice to the project's setting).
TIER_ALIASES = {"default": STANDARD_TIER, "auto": STANDARD_TIER}


def service_tier_word(sent: str) -> str:
    """A tier as stored: trimmed, lower case, a provider's word for standard as standard."""
    word = sent.strip().lower()
    return TIER_ALIASES.get(word, word) or STANDARD_TIER


class ModelPrice(models.Model):
    """USD per million tokens for one model at one provider, from `effective_from` on.

    A step is priced by the row of its (provider, model) series with the latest
    `effective_from` at or before the step's time; of rows with the same `effective_from`, one
    whose daily UTC window (`window_start`–`window_end`) holds the step's time of day beats the
    all-day row, and one whose window does not hold it is ignored (see pricing/rates.py).
    """

    class Source(models.TextChoices):
        BUILTIN = "builtin", "built-in (genai-prices)"
        MANUAL = "manual", "manual"

    provider = models.CharField(max_length=64, blank=True, db_index=True)
    model = models.CharField(max_length=200, help_text="The model name steps report.")
    service_tier = models.CharField(
        max_length=MAX_TIER_LENGTH,
        default=STANDARD_TIER,
        db_default=STANDARD_TIER,
        help_text="The service tier this row prices (standard, batch, flex, priority, or the "
        "provider's word, lower case); a step of a tier its model has no row for is priced "
        "at standard.",
    )
    model_regex = models.CharField(
        max_length=2000,
        blank=True,
        help_text="Optional: other model names this price covers (Python regex, matched "
        "against the lower-cased name).",
    )
    input_mtok = rate_field(default=Decimal(0))
    output_mtok = rate_field(default=Decimal(0))
    cache_read_mtok = rate_field(
        null=True, blank=True, help_text="Blank: cache reads at the input rate."
    )
    cache_write_mtok = rate_field(
        null=True, blank=True, help_text="Blank: cache writes at the input rate."
    )
    cache_write_1h_mtok = rate_field(
        null=True,
        blank=True,
        help_text="1-hour cache writes (Anthropic); blank: the cache write rate.",
    )
    input_audio_mtok = rate_field(
        null=True, blank=True, help_text="Audio input tokens; blank: the input rate."
    )
    cache_audio_read_mtok = rate_field(
        null=True,
        blank=True,
        help_text="Audio tokens read from the cache; blank: as genai-prices charges them, the "
        "audio input rate plus the cache read rate less the input rate.",
    )
    output_audio_mtok = rate_field(
        null=True, blank=True, help_text="Audio output tokens; blank: the output rate."
    )
    tiers = models.JSONField(
        default=list,
        blank=True,
        help_text='Long-context tiers: [{"start": 200000, "input_mtok": "6", …}]; above '
        "`start` input tokens (cache included) every token of the call is at the tier rate.",
    )
    context_window = models.PositiveIntegerField(null=True, blank=True)
    effective_from = models.DateTimeField(default=PRICE_EPOCH)
    window_start = models.TimeField(
        null=True,
        blank=True,
        help_text="Optional, with window end: a daily UTC window (peak hours, say) in which "
        "this price beats the all-day price of the same date. Both blank: all day.",
    )
    window_end = models.TimeField(
        null=True,
        blank=True,
        help_text="End of the daily window (UTC, not included); earlier than the start, the "
        "window wraps midnight (22:00–06:00).",
    )
    source = models.CharField(max_length=10, choices=Source.choices, default=Source.MANUAL)
    edited_by_admin = models.BooleanField(
        default=False, help_text="sync_prices never overwrites a row an admin edited."
    )
    external_id = models.CharField(max_length=200, blank=True, help_text="genai-prices model id")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["provider", "model", "effective_from"]
        constraints = [
            # one all-day row per series and date, and one row per window start beside it
            models.UniqueConstraint(
                fields=["provider", "model", "service_tier", "effective_from"],
                condition=Q(window_start__isnull=True),
                name="modelprice_series_from",
            ),
            models.UniqueConstraint(
                fields=["provider", "model", "service_tier", "effective_from", "window_start"],
                condition=Q(window_start__isnull=False),
                name="modelprice_series_window",
            ),
            models.CheckConstraint(
                condition=(
                    Q(window_start__isnull=True, window_end__isnull=True)
                    | (
                        Q(window_start__isnull=False, window_end__isnull=False)
                        & ~Q(window_start=F("window_end"))
                    )
                ),
                name="modelprice_window_both_or_neither",
                violation_error_message="A daily window needs a start and an end that differ, "
                "or neither (all day).",
            ),
        ]

    def __str__(self) -> str:
        who = f"{self.provider}/" if self.provider else ""
        hours = ""
        if self.window_start is not None and self.window_end is not None:
            hours = f" {self.window_start:%H:%M}–{self.window_end:%H:%M} UTC"
        tier = "" if self.service_tier == STANDARD_TIER else f" ({self.service_tier})"
        return f"{who}{self.model}{tier} from {self.effective_from:%Y-%m-%d}{hours}"


class PriceAdjustment(models.Model):
    """A negotiated rate: `percent` off (negative) or on (positive) the list price of a
    provider's steps from `effective_from` (a UTC day) on; optionally only one model family,
    only one project, or both. Of the adjustments in effect at a step's time, the most
    specific wins: project and family, then project, then family, then the provider alone;
    of two equally specific, the later date (docs/pricing.md, "Negotiated rates")."""

    provider = models.CharField(
        max_length=64, help_text="The rate table's provider id: openai, anthropic, google, …"
    )
    family = models.CharField(
        max_length=200,
        blank=True,
        help_text="Optional: one model family as pages show it (gpt-4o, claude-sonnet-4-5); "
        "blank: every model of the provider.",
    )
    project = models.ForeignKey(
        Project,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        help_text="Optional: one project's steps; blank: every project.",
    )
    percent = models.DecimalField(
        max_digits=9,
        decimal_places=4,
        validators=[MinValueValidator(Decimal(-100)), MaxValueValidator(Decimal(1000))],
        help_text="Percent on list: -12 for 12 % off, 5 for 5 % on; 0 ends an earlier one.",
    )
    effective_from = models.DateField(help_text="From this day on (UTC), for steps of then on.")
    note = models.CharField(max_length=200, blank=True, help_text="e.g. the contract's name.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["provider", "family", "project", "effective_from"]
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "family", "project", "effective_from"],
                condition=Q(project__isnull=False),
                name="priceadjustment_project_from",
            ),
            models.UniqueConstraint(
                fields=["provider", "family", "effective_from"],
                condition=Q(project__isnull=True),
                name="priceadjustment_from",
            ),
        ]

    def __str__(self) -> str:
        scope = self.provider + (f" {self.family}" if self.family else "")
        if self.project_id is not None:
            scope += f" (project {self.project_id})"
        return f"{self.percent:+}% {scope} from {self.effective_from:%Y-%m-%d}"
