from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string


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
        _email_backend_checked(settings.EMAIL_BACKEND)

        # Bind @shared_task to our configured app (broker from settings, eager without one),
        # and register our tasks in every process: services enqueue some by name, which
        # finds them only once registered (autodiscovery runs in workers, not in web
        # processes). And bound every replica connection's waits (replicas' receiver of
        # connection_created) from the first connection on, whichever module is imported first.
        from costboard import celery, replicas, tasks  # noqa: F401


def _email_backend_checked(path: str) -> None:
    """DJANGO_EMAIL_BACKEND is imported now: a typo would otherwise surface only as every alert
    and report email failing, retried and then marked failed."""
    try:
        import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"DJANGO_EMAIL_BACKEND={path!r} cannot be imported ({exc}); use a Django email "
            "backend's dotted path, e.g. django.core.mail.backends.smtp.EmailBackend, or unset "
            "it (SMTP when EMAIL_HOST is set, else the console)."
        ) from None
