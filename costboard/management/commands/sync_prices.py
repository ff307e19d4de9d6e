from __future__ import annotations

from typing import Any

import genai_prices
from django.core.management.base import BaseCommand

from costboard.outbox import outbox_dispatch_without_broker
from costboard.pricing.services import prices_reprice_later
from costboard.pricing.sync import prices_sync


class Command(BaseCommand):
    help = "Load or refresh built-in prices from genai-prices' bundled data (offline)."

    def handle(self, *args: Any, **options: Any) -> None:
        result = prices_sync()
        self.stdout.write(
            f"genai-prices {genai_prices.__version__}: {result.created} created, "
            f"{result.updated} updated, {result.unchanged} unchanged, {result.removed} removed, "
            f"{result.kept_admin_edits} admin-edited kept"
        )
        prices_reprice_later(result.changed)
        outbox_dispatch_without_broker()  # the repricing, now when there is no worker
