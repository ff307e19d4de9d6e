"""A bad environment value stops start-up with a message naming the variable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from costboard.settings import env_base_url, env_bool, env_decimal, env_fraction, env_int

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def started(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`python <args>` in a fresh process from the checkout, its settings read from `env` over
    this process's environment: what start-up makes of it."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "costboard.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("COSTBOARD_SESSION_TOKEN_CAP", "lots"),
        ("COSTBOARD_SESSION_TOKEN_CAP", "0"),
        ("COSTBOARD_SESSION_COST_CAP_USD", "five"),
        ("COSTBOARD_WARN_AT_PCT", "80"),
        ("COSTBOARD_API_RATE_LIMIT", "fast"),
        ("COSTBOARD_API_RATE_LIMIT", "-1"),
        ("COSTBOARD_API_MAX_IN_FLIGHT", "-1"),
        ("WEB_CONCURRENCY", "0"),
        ("DJANGO_DEBUG", "maybe"),
        ("DATABASE_URL", "mysql://root@localhost/x"),
        ("DATABASE_URL", "postgres://u@primary:5432"),
        ("COSTBOARD_OPENAI_API_BASE", "api.openai.com"),
        ("COSTBOARD_ANTHROPIC_API_BASE", "ftp://proxy.example"),
        ("DATABASE_REPLICA_URLS", "postgres://u@replica:port/costboard"),
        ("COSTBOARD_REPLICA_MAX_LAG_S", "soon"),
        ("COSTBOARD_REPLICA_MAX_LAG_S", "-1"),
        ("COSTBOARD_REPLICA_TIMEOUT_S", "soon"),
        ("COSTBOARD_REPLICA_TIMEOUT_S", "0"),
        ("COSTBOARD_REPLICA_RETRY_S", "-1"),
        ("DJANGO_EMAIL_BACKEND", "no.such.Backend"),
        ("DJANGO_EMAIL_BACKEND", "django.core.mail.backends.smtp.SMTPBackend"),
        ("DJANGO_HTTPS", "maybe"),
        ("DJANGO_HSTS_SECONDS", "-1"),
        ("DJANGO_HSTS_SECONDS", "3600"),  # without DJANGO_HTTPS=1: never sent
        ("CELERY_BROKER_URL", "redis//127.0.0.1:6379/0"),  # kombu: the host "is"
        ("CELERY_BROKER_URL", "http://127.0.0.1:6379/0"),
        ("CELERY_BROKER_URL", "127.0.0.1:6379"),
    ],
)
def test_startup_fails_naming_the_variable(name: str, value: str) -> None:
    result = started(["manage.py", "check"], {name: value})
    assert result.returncode != 0
    assert name in result.stderr
    assert "ImproperlyConfigured" in result.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DATABASE_URL", "postgres://app:s3cret-pw@primary:5432"),  # no database
        ("DATABASE_URL", "mysql://app:s3cret-pw@primary/x"),
        ("DATABASE_URL", "postgres://app:s3cret-pw@primary:port/x"),  # not a port
        ("DATABASE_REPLICA_URLS", "postgres://app:s3cret-pw@replica:port/costboard"),
        ("DATABASE_REPLICA_URLS", "mysql://app:s3cret-pw@replica/costboard"),
        ("CELERY_BROKER_URL", "redis://app:s3cret-pw@broker:port/0"),  # not a port
        ("CELERY_BROKER_URL", "htttp://app:s3cret-pw@broker:6379/0"),
    ],
)
def test_a_refused_database_url_is_named_without_its_password(name: str, value: str) -> None:
    """Start-up's refusal goes to the logs (gunicorn's, a container's): it named the URL with
    its password in it. The password is shown as ***, the rest as given."""
    env = {name: value}
    if name == "DATABASE_REPLICA_URLS":
        env["DATABASE_URL"] = "postgres://postgres@127.0.0.1:5432/costboard"
    result = started(["manage.py", "check"], env)
    assert result.returncode != 0 and "ImproperlyConfigured" in result.stderr
    assert "s3cret-pw" not in result.stderr
    assert name in result.stderr and "app:***@" in result.stderr


HTTPS_PROBE = """
import django, json
django.setup()
from django.conf import settings
from django.test import Client, override_settings
from django.test.utils import setup_test_environment
setup_test_environment()
plain = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}  # no manifest
with override_settings(STORAGES={**settings.STORAGES, "staticfiles": plain}):
    response = Client().get("/accounts/login/", HTTP_X_FORWARDED_PROTO="https")
cookie = response.cookies["csrftoken"]
print(json.dumps({
    "hsts": response.headers.get("Strict-Transport-Security"),
    "secure": bool(cookie["secure"]),
    "is_secure": response.wsgi_request.is_secure(),
}))
"""


@pytest.mark.parametrize(
    ("env", "seen"),
    [
        ({}, {"hsts": None, "secure": False, "is_secure": False}),
        ({"DJANGO_HTTPS": "1"}, {"hsts": None, "secure": True, "is_secure": True}),
        (
            {"DJANGO_HTTPS": "1", "DJANGO_HSTS_SECONDS": "31536000"},
            {"hsts": "max-age=31536000", "secure": True, "is_secure": True},
        ),
    ],
)
def test_behind_tls_the_cookies_are_secure_and_hsts_is_sent(
    env: dict[str, str], seen: dict[str, object]
) -> None:
    """Behind a TLS-terminating proxy the session and CSRF cookies went out without Secure and
    no HSTS could be sent: DJANGO_HTTPS=1 (and DJANGO_HSTS_SECONDS) say it is served over
    HTTPS. Off by default, so `make run` on http://127.0.0.1 keeps working."""
    result = started(["-c", HTTPS_PROBE], {"DJANGO_HTTPS": "0", "DJANGO_HSTS_SECONDS": "0", **env})
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == seen


def test_env_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_BOOL", "yes")
    monkeypatch.setenv("X_INT", " 42 ")
    monkeypatch.setenv("X_DEC", "5.25")
    monkeypatch.setenv("X_FRAC", "0.75")
    assert env_bool("X_BOOL", False) is True
    assert env_int("X_INT", 1) == 42
    assert env_decimal("X_DEC", "1") == Decimal("5.25")
    assert env_fraction("X_FRAC", "0.8") == Decimal("0.75")
    assert env_int("X_UNSET", 7) == 7
    monkeypatch.setenv("X_FRAC", "0")
    with pytest.raises(ImproperlyConfigured, match="X_FRAC"):
        env_fraction("X_FRAC", "0.8")
    monkeypatch.setenv("X_DEC", "-1")
    with pytest.raises(ImproperlyConfigured, match="X_DEC"):
        env_decimal("X_DEC", "1")
    # digits Python reads but nobody types in a setting: refused as the API refuses them
    for written in ("\uff11\uff12", "\u0661\u0662", "1_000"):
        monkeypatch.setenv("X_DEC", written)
        with pytest.raises(ImproperlyConfigured, match=r"X_DEC.*is not a decimal number"):
            env_decimal("X_DEC", "1")
        monkeypatch.setenv("X_INT", written)
        with pytest.raises(ImproperlyConfigured, match=r"X_INT.*is not an integer"):
            env_int("X_INT", 1)
    monkeypatch.setenv("X_URL", " http://127.0.0.1:9/ ")
    assert env_base_url("X_URL", "https://api.openai.com") == "http://127.0.0.1:9"
    assert env_base_url("X_UNSET", "https://api.openai.com") == "https://api.openai.com"


@pytest.mark.parametrize("value", ["", " ", " , "])
def test_a_blank_allowed_hosts_is_the_default_not_every_request_refused(value: str) -> None:
    code = (
        "import django; django.setup(); from django.conf import settings; "
        "print(','.join(settings.ALLOWED_HOSTS))"
    )
    result = started(["-c", code], {"DJANGO_ALLOWED_HOSTS": value})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "127.0.0.1,localhost,[::1]"


def test_a_metrics_token_read_from_a_secret_file_is_stripped() -> None:
    """A secret mounted as a file often ends in a newline; /metrics strips the bearer it is
    sent (tests/costboard/api/test_metrics.py), so a token kept with its newline would match
    no scraper's."""
    code = (
        "import django; django.setup(); from django.conf import settings; "
        "print(repr(settings.COSTBOARD_METRICS_TOKEN))"
    )
    result = started(["-c", code], {"COSTBOARD_METRICS_TOKEN": "s3cret\n"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "'s3cret'"


def test_every_outbox_kind_has_its_handler_in_a_fresh_process() -> None:
    """Services queue work by kind; the dispatcher (a worker, or guard_sweep) finds a handler
    only if the module that registers it was imported at start-up in that process."""
    from costboard.budgets.alerts import DELIVER, DISPATCH
    from costboard.budgets.services import RECHECK
    from costboard.pricing.services import REPRICE
    from memory_ui.hooks import DETECT

    kinds = [DELIVER, DISPATCH, RECHECK, REPRICE, DETECT]
    code = (
        "import django; django.setup(); from costboard.celery import app; "
        "from costboard.outbox import handler_of; "
        f"print(all(handler_of(k) for k in {kinds!r})); "
        "print('costboard.tasks.outbox_dispatch' in app.tasks)"
    )
    result = started(["-c", code], {})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]


def _random_page_cost(database_url: str) -> str:
    code = (
        "import django; django.setup()\n"
        "from django.db import connection\n"
        "with connection.cursor() as c:\n"
        "    c.execute('SHOW random_page_cost'); print(c.fetchone()[0])\n"
    )
    result = started(["-c", code], {"DATABASE_URL": database_url})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.skipif(
    not os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="PostgreSQL's setting"
)
def test_postgres_reads_are_priced_as_in_memory_unless_the_url_says_otherwise() -> None:
    url = os.environ["DATABASE_URL"]
    assert _random_page_cost(url) == "1.1"
    joiner = "&" if "?" in url else "?"
    assert _random_page_cost(f"{url}{joiner}options=-c%20random_page_cost%3D2") == "2"


def _replica_settings(**env: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import json, django; django.setup(); from django.conf import settings; "
        "print(json.dumps({a: [d['HOST'], d['PORT'], d['NAME'], d['TEST'].get('MIRROR'), "
        "d['OPTIONS'].get('connect_timeout'), d['CONN_MAX_AGE'], d['OPTIONS'].get('options')] "
        "for a, d in settings.DATABASES.items() if a != 'default'}))"
    )
    return started(["-c", code], env)


def test_each_replica_url_is_a_database_mirroring_the_primary_in_tests() -> None:
    result = _replica_settings(
        DATABASE_URL="postgres://costboard@primary:5432/costboard",
        DATABASE_REPLICA_URLS=(
            " postgres://costboard@replica-a:5433/costboard , "
            "postgres://costboard@replica-b/costboard?connect_timeout=1"
        ),
    )
    assert result.returncode == 0, result.stderr
    # the replica's statement_timeout: COSTBOARD_REPLICA_TIMEOUT_S (5 s), in milliseconds
    options = "-c random_page_cost=1.1 -c statement_timeout=5000"
    assert json.loads(result.stdout) == {
        "replica_1": ["replica-a", 5433, "costboard", "default", 3, None, options],
        "replica_2": ["replica-b", "", "costboard", "default", 1, None, options],
    }


def test_a_replicas_statement_timeout_follows_the_setting_and_not_behind_pgbouncer() -> None:
    env = {
        "DATABASE_URL": "postgres://costboard@primary:5432/costboard",
        "DATABASE_REPLICA_URLS": "postgres://costboard@replica-a:5433/costboard",
        "COSTBOARD_REPLICA_TIMEOUT_S": "0.25",
    }
    result = _replica_settings(**env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["replica_1"][-1] == (
        "-c random_page_cost=1.1 -c statement_timeout=250"
    )
    # PgBouncer refuses a startup `options` packet: the process's own bound is left
    pooled = _replica_settings(**env, COSTBOARD_DB_POOLER="pgbouncer")
    assert pooled.returncode == 0, pooled.stderr
    assert json.loads(pooled.stdout)["replica_1"][-1] is None


@pytest.mark.parametrize(
    ("env", "says"),
    [
        (
            {"DATABASE_URL": "", "DATABASE_REPLICA_URLS": "postgres://u@replica/costboard"},
            "DATABASE_URL is not PostgreSQL",
        ),
        (
            {
                "DATABASE_URL": "postgres://u@primary/costboard",
                "DATABASE_REPLICA_URLS": "sqlite:///replica.sqlite3",
            },
            "is not a PostgreSQL URL",
        ),
        (
            {
                "DATABASE_URL": "postgres://u@primary/costboard",
                "DATABASE_REPLICA_URLS": "postgres://u@replica:5432",
            },
            "'postgres://u@replica:5432' names no database",
        ),
    ],
)
def test_a_replica_that_cannot_be_one_stops_start_up(env: dict[str, str], says: str) -> None:
    result = _replica_settings(**env)
    assert result.returncode != 0
    assert "ImproperlyConfigured: DATABASE_REPLICA_URLS" in result.stderr
    assert says in result.stderr
