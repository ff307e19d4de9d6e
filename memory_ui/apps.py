from __future__ import annotations

from django.apps import AppConfig


class MemoryUiConfig(AppConfig):
    name = "memory_ui"
    verbose_name = "Memory"
