from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings


class CostboardConfig(AppConfig):
    name = "costboard"
    verbose_name = "Costboard"

    def ready(self) -> None:
        # Settings our own modules parse, checked before anything runs: a bad entry stops
        # start-up naming its variable and the fix (settings.py imports none of ours).
        from costboard.client_address import trusted_proxies
        from costboard.egress import webhook_allow_list

        trusted_proxies(settings.TRUSTED_PROXIES)
        webhook_allow_list(settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS)

        # Bind @shared_task to our configured app (broker from settings, eager without one),
        # and register our tasks in every process: services enqueue some by name, which
        # finds them only once registered (autodiscovery runs in workers, not in web
        # processes).
        from costboard import celery, tasks  # noqa: F401
