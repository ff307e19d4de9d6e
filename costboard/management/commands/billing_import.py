"""`manage.py billing_import --provider openai|anthropic --since YYYY-MM-DD [--until
YYYY-MM-DD]`: a provider's cost and usage reports for those UTC days, each day replaced whole
(docs/billing.md)."""

from __future__ import annotations

import argparse
from datetime import date
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from costboard.billing.providers import PROVIDERS
from costboard.billing.services import ImportFailed, ProviderError, billing_import


def _day(value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a date: write YYYY-MM-DD (a UTC day), e.g. 2026-11-01"
        ) from None


class Command(BaseCommand):
    help = (
        "Import a provider's billed costs and reported usage (OpenAI's Costs and Usage APIs, "
        "Anthropic's cost and messages usage reports) for the UTC days since..until, each day "
        "replacing that day's imported rows. Needs COSTBOARD_OPENAI_ADMIN_KEY or "
        "COSTBOARD_ANTHROPIC_ADMIN_KEY."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--provider", required=True, choices=PROVIDERS)
        parser.add_argument("--since", required=True, type=_day, help="the first UTC day")
        parser.add_argument(
            "--until", type=_day, default=None, help="the last UTC day, included (today)"
        )

    def handle(self, *args: Any, provider: str, since: date, until: date | None, **_: Any) -> None:
        last = until or timezone.now().date()
        if until is None and last < since:
            raise CommandError(
                f"--since {since} is after today ({last} UTC, the default --until): "
                "give a day up to today"
            )
        if last < since:
            raise CommandError(f"--until {last} is before --since {since}: swap them")
        try:
            result = billing_import(provider, since, last)
        except ImportFailed as exc:
            if exc.result.days:
                self.stdout.write(str(exc.result))
            raise CommandError(
                f"{exc}; days not stored from the failing window on (run again to retry)"
            ) from None
        except ProviderError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(result))
