from __future__ import annotations

from typing import Any

import genai_prices
from django.core.management.base import BaseCommand
from django.db import transaction

from costboard import tasks
from costboard.pricing.sync import prices_sync


class Command(BaseCommand):
    help = "Load or refresh built-in prices from genai-prices' bundled data (offline)."

    def handle(self, *args: Any, **options: Any) -> None:
        result = prices_sync()
        self.stdout.write(
            f"genai-prices {genai_prices.__version__}: {result.created} created, "
            f"{result.updated} updated, {result.unchanged} unchanged, "
            f"{result.kept_admin_edits} admin-edited kept"
        )
        if result.changed:
            matches = [m.as_dict() for m in result.changed]
            transaction.on_commit(lambda: tasks.prices_reprice.delay(matches))
