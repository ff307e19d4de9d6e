from __future__ import annotations

from django.apps import AppConfig


class MemoryUiConfig(AppConfig):
    name = "memory_ui"
    verbose_name = "Memory"

    def ready(self) -> None:
        from costboard.hooks import after_ingest_register, hourly_register

        # Importing lifecycle registers its Celery tasks with the worker (autodiscovery finds
        # only memory_ui.tasks); beat names them in CELERY_BEAT_SCHEDULE.
        from memory_ui.hooks import memory_detect_after_ingest, memory_lifecycle_hourly

        after_ingest_register(memory_detect_after_ingest)
        hourly_register(memory_lifecycle_hourly)
