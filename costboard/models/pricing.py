"""What a token costs: the rate table's rows, one series per provider and model, each row
from its date on (and, optionally, in a daily window)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from django.db import models
from django.db.models import F, Q

from costboard.models.fields import rate_field

# A built-in price without a start date applies since this instant ("always").
PRICE_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


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
                fields=["provider", "model", "effective_from"],
                condition=Q(window_start__isnull=True),
                name="modelprice_series_from",
            ),
            models.UniqueConstraint(
                fields=["provider", "model", "effective_from", "window_start"],
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
        return f"{who}{self.model} from {self.effective_from:%Y-%m-%d}{hours}"
