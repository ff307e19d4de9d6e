from __future__ import annotations

from django.apps import AppConfig


class DevtoolsConfig(AppConfig):
    """seed_demo and the bench_* commands; `make run` and the benchmarks use them from the
    checkout."""

    name = "devtools"
    verbose_name = "Costboard dev tools"
