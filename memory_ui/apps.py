from __future__ import annotations

from django.apps import AppConfig


class MemoryUiConfig(AppConfig):
    name = "memory_ui"
    verbose_name = "Memory"

    def ready(self) -> None:
        # Register the lifecycle's Celery tasks with the worker (autodiscovery finds only
        # memory_ui.tasks); beat names them in CELERY_BEAT_SCHEDULE.
        from memory_ui import lifecycle  # noqa: F401
