from __future__ import annotations

from django.apps import AppConfig


class CostboardConfig(AppConfig):
    name = "costboard"
    verbose_name = "Costboard"

    def ready(self) -> None:
        # Bind @shared_task to our configured app (broker from settings, eager without one).
        from costboard import celery  # noqa: F401
