from __future__ import annotations

from django.apps import AppConfig


class CostboardConfig(AppConfig):
    name = "costboard"
    verbose_name = "Costboard"

    def ready(self) -> None:
        # Bind @shared_task to our configured app (broker from settings, eager without one),
        # and register our tasks in every process: services enqueue some by name, which
        # finds them only once registered (autodiscovery runs in workers, not in web
        # processes).
        from costboard import celery, tasks  # noqa: F401
