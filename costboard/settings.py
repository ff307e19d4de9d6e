"""Django settings for Costboard.

Everything a deployment changes comes from the environment (README.md, "Configuration"); a bad
value stops start-up with a message naming the variable.
"""

from __future__ import annotations

import importlib.util
import os
import re
import secrets
import warnings
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path

import dj_database_url
import django_stubs_ext
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue
from kombu.transport import TRANSPORT_ALIASES
from kombu.utils.url import url_to_parts

# Django's generic classes (ModelAdmin, ModelForm, Paginator…) take their type argument at run
# time too, as they do in django-stubs: `class ProjectAdmin(admin.ModelAdmin[Project])` under
# mypy's strict checks (pyproject.toml). Settings are read first, before any class is made.
django_stubs_ext.monkeypatch()

# Settings import no module of ours (tests/test_layout.py holds it): they are read before
# Django is set up, and a module of ours imported here would run, with all it imports, before
# any app is ready. A setting that needs our own parsing (TRUSTED_PROXIES,
# COSTBOARD_WEBHOOK_ALLOW_HOSTS) is checked as the app starts (costboard/apps.py), which
# stops start-up naming the variable as a bad value read here does.

# --- typed readers for environment variables ------------------------------------------------
# Each raises ImproperlyConfigured naming the variable and the fix, so a bad value stops
# start-up instead of surfacing later as a wrong cap or a crash in a request.

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use 1/0, true/false, yes/no.")


def _plain_number(raw: str) -> str:
    """The value stripped, if it is written in ASCII without `_` (int() and Decimal() would
    read "１２", "١٢" and "1_000" as numbers, as the API refuses them); else ValueError."""
    value = raw.strip()
    if not value.isascii() or "_" in value:
        raise ValueError(raw)
    return value


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(_plain_number(raw))
    except ValueError:
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not an integer; use e.g. {default}."
        ) from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum}.")
    return value


def env_decimal(name: str, default: str, *, minimum: Decimal = Decimal(0)) -> Decimal:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return Decimal(default)
    try:
        value = Decimal(_plain_number(raw))
    except (InvalidOperation, ValueError):
        raise ImproperlyConfigured(
            f"{name}={raw!r} is not a decimal number; use e.g. {default}."
        ) from None
    if not value.is_finite() or value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be a finite number >= {minimum}.")
    return value


def env_fraction(name: str, default: str) -> Decimal:
    """A fraction in (0, 1], e.g. 0.8 for 80%."""
    value = env_decimal(name, default)
    if not (Decimal(0) < value <= Decimal(1)):
        raise ImproperlyConfigured(
            f"{name}={os.environ.get(name)!r} must be a fraction above 0 and at most 1 "
            f"(0.8 means warn at 80%)."
        )
    return value


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def env_list(name: str, default: str) -> list[str]:
    """Comma-separated items; blank (or only commas) is the default, as for the readers above:
    an empty DJANGO_ALLOWED_HOSTS would answer every request 400."""
    return _items(os.environ.get(name, "")) or _items(default)


def env_base_url(name: str, default: str) -> str:
    """An http(s) base URL, its trailing slash dropped (blank: the default)."""
    value = env_str(name, default).strip().rstrip("/") or default
    if not value.startswith(("http://", "https://")):
        raise ImproperlyConfigured(
            f"{name}={value!r} must start with http:// or https://, e.g. {default}"
        )
    return value


# --- the settings ---------------------------------------------------------------------------

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"  # local state of a checkout: secret key, SQLite test database
VAR_DIR.mkdir(exist_ok=True)

DEBUG = env_bool("DJANGO_DEBUG", False)


def _secret_key() -> str:
    key = env_str("DJANGO_SECRET_KEY")
    if key:
        return key
    # No key given: keep one per checkout so sessions survive restarts of `make run`.
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")
# Served over HTTPS only (docs/operations.md, "Behind TLS"): the session and CSRF cookies are
# sent over HTTPS alone, a TLS-terminating proxy's X-Forwarded-Proto says the request was
# secure (the proxy must set it; with every request HTTPS, a client's own says nothing new),
# and DJANGO_HSTS_SECONDS (0: none) has browsers keep to HTTPS for that long.
HTTPS = env_bool("DJANGO_HTTPS", False)
# Messages wait for the next page in the session (the database), not in Django's default
# messages cookie, which is signed but readable: a new API key's one showing travelled in a
# Set-Cookie header that proxies log and the browser keeps.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = HTTPS
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if HTTPS else None
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 0, minimum=0)
if SECURE_HSTS_SECONDS and not HTTPS:
    raise ImproperlyConfigured(
        f"DJANGO_HSTS_SECONDS={SECURE_HSTS_SECONDS} without DJANGO_HTTPS=1: HSTS is sent only "
        "over HTTPS; set DJANGO_HTTPS=1 when Costboard is served over HTTPS, or unset it."
    )

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "drf_spectacular_sidecar",  # Swagger UI's files for /api/v1/docs, from the package
    "axes",  # login lockout after repeated failures (see AXES_* below)
    "csp",  # django-csp: the Content-Security-Policy header (CONTENT_SECURITY_POLICY below)
    "costboard",
    "memory_ui",
]
# The demo data and the benchmarks (seed_demo, bench_*): a dev-only app beside the checkout,
# left out of the installed distribution, so a production install runs without it.
if importlib.util.find_spec("devtools") is not None:
    INSTALLED_APPS.append("devtools")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "costboard.csp.PagePolicyMiddleware",  # Content-Security-Policy on pages (see below)
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "costboard.page_input.PageInputMiddleware",  # NUL in a page's filter or form: 400
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "costboard.replicas.ReadYourWritesMiddleware",  # after a write, pages read the primary
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # last, as django-axes asks: it answers a locked-out login with the lockout page
    "axes.middleware.AxesMiddleware",
]

# Every page's Content-Security-Policy (costboard/csp.py; docs/operations.md says how to extend
# it): scripts, styles, images, fonts and requests from this origin only, nothing inline, no
# eval, no plugin, never framed, forms posted here only.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

ROOT_URLCONF = "costboard.urls"
WSGI_APPLICATION = "costboard.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database: SQLite in the checkout unless DATABASE_URL says otherwise -------------------
_URL_PASSWORD = re.compile(r"(://[^/@:]*:)[^/@]*@")


def url_shown(text: str) -> str:
    """A database URL (or a message holding one) as start-up's refusals name it: its password
    as ***. They go to the logs (gunicorn's, a container's)."""
    return _URL_PASSWORD.sub(r"\1***@", text)


PREPARE_THRESHOLD = 5  # psycopg's default: runs of a statement before it is prepared
_database_url = env_str("DATABASE_URL")
_database_shown = url_shown(repr(_database_url))
if _database_url:
    try:
        # Persistent connections (checked before reuse): a reconnect every minute gave each
        # worker a cold PostgreSQL backend, its next request several times slower.
        _db = dj_database_url.parse(_database_url, conn_max_age=None, conn_health_checks=True)
    except Exception as exc:  # dj-database-url raises several types for a bad URL
        raise ImproperlyConfigured(
            f"DATABASE_URL={_database_shown} is not a database URL "
            f"({url_shown(str(exc))}); "
            "use e.g. postgres://user@127.0.0.1:5432/costboard."
        ) from None
    if _db.get("ENGINE") not in {
        "django.db.backends.postgresql",
        "django.db.backends.sqlite3",
    }:
        raise ImproperlyConfigured(
            f"DATABASE_URL={_database_shown}: Costboard runs on PostgreSQL (or SQLite)."
        )
    if not _db.get("NAME") and not _db.get("OPTIONS", {}).get("service"):
        raise ImproperlyConfigured(
            f"DATABASE_URL={_database_shown} names no database; add it after the host, e.g. "
            "postgres://user@127.0.0.1:5432/costboard."
        )
else:
    _db = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(BASE_DIR / "db.sqlite3"),
    }
if _db["ENGINE"] == "django.db.backends.postgresql":
    # Costboard's working set (this month's sessions, turns and rollups, the indexes) lives in
    # memory, where a random read costs about what a sequential one does: priced at the
    # default 4, a month of a year's sessions (the sessions list's window) was read by a scan
    # of every session there has been, growing with the history. `?options=` in DATABASE_URL
    # sets its own.
    _db.setdefault("OPTIONS", {}).setdefault("options", "-c random_page_cost=1.1")
    # psycopg prepares a statement once it has run five times on a connection (its own
    # default; Django's is never): ingest's statements are the same text every batch, their values
    # bound server-side, so from then on PostgreSQL neither parses nor, mostly, plans them.
    # A one-step post spent a third less of PostgreSQL's CPU (docs/benchmarks.md). Behind
    # PgBouncer none is prepared (below).
    _db["OPTIONS"].setdefault("prepare_threshold", PREPARE_THRESHOLD)
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # Writers queue for the database lock at BEGIN rather than failing half-way through.
    _db["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 30}
    # A file, not :memory:, so threaded tests share one test database; one per test process
    # so two runs side by side do not recreate each other's.
    _db["TEST"] = {"NAME": str(VAR_DIR / f"test-{os.getpid()}.sqlite3")}
    # The covering indexes' INCLUDE columns are PostgreSQL's; SQLite's plain index does.
    SILENCED_SYSTEM_CHECKS = ["models.W040"]
DATABASES = {"default": _db}

# --- read replicas (docs/operations.md, "Read replicas") -----------------------------------
# DATABASE_REPLICA_URLS, comma-separated: each becomes DATABASES["replica_1"], … The router
# (costboard/replicas.py) sends a read there only for the views that ask (pages, the spend and
# reconciliation APIs, the exports), and only while the replica is within
# COSTBOARD_REPLICA_MAX_LAG_S seconds of the primary; everything else reads the primary.
_replica_urls = env_list("DATABASE_REPLICA_URLS", "")
# A replica's answer to one statement is waited for this long (its server cancels the
# statement then; this process gives up a second later, when the server itself does not
# answer: frozen, or cut off). The page is then read from the primary.
COSTBOARD_REPLICA_TIMEOUT_S = env_decimal(
    "COSTBOARD_REPLICA_TIMEOUT_S", "5", minimum=Decimal("0.001")
)
# After a replica did not answer (or failed in a page), no page tries it for this long.
COSTBOARD_REPLICA_RETRY_S = env_decimal("COSTBOARD_REPLICA_RETRY_S", "30")
# as the primary's planner cost (above), and the statement timeout on the server
_REPLICA_OPTIONS = (
    f"-c random_page_cost=1.1 -c statement_timeout={int(COSTBOARD_REPLICA_TIMEOUT_S * 1000)}"
)
if _replica_urls and _db["ENGINE"] != "django.db.backends.postgresql":
    raise ImproperlyConfigured(
        "DATABASE_REPLICA_URLS is set but DATABASE_URL is not PostgreSQL: replicas stream from "
        "a PostgreSQL primary; unset DATABASE_REPLICA_URLS or point DATABASE_URL at the primary."
    )
for _number, _replica_url in enumerate(_replica_urls, start=1):
    _replica_shown = url_shown(repr(_replica_url))
    try:
        _replica = dj_database_url.parse(_replica_url, conn_max_age=None, conn_health_checks=True)
    except Exception as exc:  # dj-database-url raises several types for a bad URL
        raise ImproperlyConfigured(
            f"DATABASE_REPLICA_URLS: {_replica_shown} is not a database URL "
            f"({url_shown(str(exc))}); use e.g. "
            "postgres://user@replica-1:5432/costboard,postgres://user@replica-2:5432/costboard."
        ) from None
    if _replica.get("ENGINE") != "django.db.backends.postgresql":
        raise ImproperlyConfigured(
            f"DATABASE_REPLICA_URLS: {_replica_shown} is not a PostgreSQL URL; a replica is a "
            "PostgreSQL standby of DATABASE_URL's server, e.g. postgres://user@replica-1:5432/"
            "costboard."
        )
    # else every page that reads a replica would fail, naming no variable
    if not _replica.get("NAME") and not _replica.get("OPTIONS", {}).get("service"):
        raise ImproperlyConfigured(
            f"DATABASE_REPLICA_URLS: {_replica_shown} names no database; add it after the host, "
            "as in DATABASE_URL, e.g. postgres://user@replica-1:5432/costboard."
        )
    _replica_options = _replica.setdefault("OPTIONS", {})
    _replica_options.setdefault("options", _REPLICA_OPTIONS)
    _replica_options.setdefault("prepare_threshold", PREPARE_THRESHOLD)
    # A replica that does not answer costs a page at most this long once per lag check (it
    # then reads the primary), not libpq's default of waiting for ever.
    _replica_options.setdefault("connect_timeout", 3)
    # In tests a replica reads the test database: a real standby streams it from the
    # primary; otherwise it is the same database under a second connection.
    _replica["TEST"] = {"MIRROR": "default"}
    DATABASES[f"replica_{_number}"] = _replica
DATABASE_ROUTERS = ["costboard.replicas.ReplicaRouter"]
# Past this many seconds behind the primary a replica is not read (the pages say their data is
# current, read from the primary); 0 reads only a replica that has replayed all it received.
COSTBOARD_REPLICA_MAX_LAG_S = env_decimal("COSTBOARD_REPLICA_MAX_LAG_S", "10")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- behind a connection pooler (docs/operations.md, "Connection pooler") --------------------
# PgBouncer in transaction mode gives each transaction whichever server connection is free:
# nothing may outlive a transaction on its connection. Costboard's own SQL keeps to that (SET
# LOCAL, set_config(…, true), pg_advisory_xact_lock; tests/costboard/test_pooler.py scans for
# it); what Django and psycopg would keep on a connection is turned off here. Explicit only:
# nothing on a connection tells PgBouncer from PostgreSQL cheaply and for certain.
DB_POOLERS = ("", "pgbouncer")
COSTBOARD_DB_POOLER = env_str("COSTBOARD_DB_POOLER").strip().lower()
if COSTBOARD_DB_POOLER not in DB_POOLERS:
    raise ImproperlyConfigured(
        f"COSTBOARD_DB_POOLER={COSTBOARD_DB_POOLER!r} is not a pooler Costboard knows; use "
        "pgbouncer (PgBouncer in transaction mode), or leave it unset to connect directly."
    )
if COSTBOARD_DB_POOLER == "pgbouncer":
    for _alias, _pooled in DATABASES.items():
        if _pooled["ENGINE"] != "django.db.backends.postgresql":
            raise ImproperlyConfigured(
                f"COSTBOARD_DB_POOLER=pgbouncer needs PostgreSQL, but DATABASES[{_alias!r}] is "
                f"{_pooled['ENGINE']}; set DATABASE_URL=postgres://… to PgBouncer's address, or "
                "unset COSTBOARD_DB_POOLER."
            )
        _pooled_options = _pooled.setdefault("OPTIONS", {})
        # A prepared statement lives in one server session, the next execution may reach
        # another: psycopg prepares none (Django's default, held here whatever OPTIONS say).
        _pooled_options["prepare_threshold"] = None
        # A startup `options` packet is refused by PgBouncer ("unsupported startup parameter"):
        # the planner's random_page_cost goes on the database instead (ALTER DATABASE … SET).
        # A replica's statement timeout goes too; its connection's own bound stays
        # (costboard/replicas.py, `ReplicaConnection`).
        if _pooled_options.get("options") in ("-c random_page_cost=1.1", _REPLICA_OPTIONS):
            del _pooled_options["options"]
        # `.iterator()` would DECLARE a cursor WITH HOLD in one session and FETCH in another.
        _pooled["DISABLE_SERVER_SIDE_CURSORS"] = True
        # Persistent connections (CONN_MAX_AGE) stay: one idle at PgBouncer holds no server
        # connection, and its health check is a round trip to PgBouncer.

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# Login lockout (django-axes; docs/operations.md, "Logins"): 5 failed logins for one username
# from one client address lock that pair out, and that pair only: the same username from
# another address, and other usernames, log in as before. The lock ends 15 minutes after the
# failure that set it; tries while locked (the right password too) are refused, not counted,
# and do not restart the wait. A success before the lock forgets the failures. Staff lift a
# lockout in the admin (Login lockouts), `python manage.py axes_reset` lifts every one.
# AxesStandaloneBackend first: it refuses a locked-out pair before a password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = 5
AXES_COOLOFF_TIME = timedelta(minutes=15)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_LOCKOUT_CALLABLE = "costboard.dashboards.lockout.lockout_response"  # 429, Retry-After
AXES_CLIENT_IP_CALLABLE = "costboard.client_address.client_address"
AXES_VERBOSE = False  # its start-up banner and per-attempt lines: our log says enough
# The reverse proxies in front of Costboard, whose X-Forwarded-For names the client
# (costboard/client_address.py): addresses or CIDRs, comma-separated; none by default, and
# then X-Forwarded-For is ignored.
TRUSTED_PROXIES = env_list("DJANGO_TRUSTED_PROXIES", "")  # a bad entry stops start-up (apps.py)

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    "costboard.staticfinders.PlotlyFinder",  # plotly.js from the plotly package
]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # `collectstatic` (run by `make run`) writes each file under a content-hashed name, gzip
    # and brotli beside it; whitenoise serves those with a year's immutable cache and the
    # encoding the browser accepts (plotly.js: 4.8 MB, 1.2 MB brotli).
    "staticfiles": {"BACKEND": "costboard.static_storage.CompressedManifestStorage"},
}
# Also serve straight from the apps: runserver with DJANGO_DEBUG (unhashed names) works
# before any collectstatic, and an unhashed name still answers (with a minute's cache).
WHITENOISE_USE_FINDERS = True
# Pages link only hashed names: collectstatic keeps (and compresses) those alone, half the work.
WHITENOISE_KEEP_ONLY_HASHED_FILES = True
warnings.filterwarnings("ignore", message="No directory at: .*staticfiles")

# Ingest bodies may be up to 5 MB (docs/api.md, "Limits"); the view answers 413 past that.
DATA_UPLOAD_MAX_MEMORY_SIZE = 6 * 1024 * 1024

# --- Celery: Redis in production; no broker means tasks run in-process ----------------------
_broker = env_str("CELERY_BROKER_URL")
if _broker:
    # kombu reads a bad URL only when a task is first sent: `redis//host` as the host "is",
    # a port "abc" as a ValueError, `http://` as "No such transport". Refused here by name.
    _broker_shown = url_shown(repr(_broker))
    try:
        _broker_parts = url_to_parts(_broker)
    except ValueError as exc:  # a port that is not a number
        raise ImproperlyConfigured(
            f"CELERY_BROKER_URL={_broker_shown} is not a broker URL ({url_shown(str(exc))}); "
            "use e.g. redis://127.0.0.1:6379/0."
        ) from None
    if "://" not in _broker or _broker_parts.scheme not in TRANSPORT_ALIASES:
        raise ImproperlyConfigured(
            f"CELERY_BROKER_URL={_broker_shown} names no broker Celery knows; use e.g. "
            "redis://127.0.0.1:6379/0 (or unset it: tasks then run in-process)."
        )
CELERY_TASK_ALWAYS_EAGER = not _broker
CELERY_BROKER_URL = _broker or "memory://"
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"
# Queues that don't block each other (docs/operations.md, "Queues"): a worker per queue, so an
# hour's repricing never holds up an alert. A worker started without -Q consumes every queue
# listed here (one box: `celery -A costboard worker --beat`). The outbox's items are carried
# out by one task per queue, each taking only the kinds registered on its queue
# (costboard/outbox.py); `celery` takes the rest.
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES = [
    Queue(name)  # type: ignore[no-untyped-call]  # kombu has no type hints
    for name in ("celery", "alerts", "memory", "repricing", "billing")
]
CELERY_TASK_ROUTES = {
    "costboard.tasks.outbox_alerts": {"queue": "alerts"},
    "costboard.tasks.outbox_memory": {"queue": "memory"},
    "costboard.tasks.outbox_repricing": {"queue": "repricing"},
    "costboard.tasks.billing_import": {"queue": "billing"},
}
# Periodic jobs (`celery -A costboard worker --beat`, or a separate `celery beat`); each is
# safe to run twice. Without a broker, `manage.py guard_sweep --every 60` does the same.
CELERY_BEAT_SCHEDULE = {
    # alerts, memory detection, repricing, the rest: the outbox's items (costboard/outbox.py),
    # each queue's own; ticks queued behind a long run are dropped (expires), not piled up
    **{
        f"outbox-{queue}": {
            "task": f"costboard.tasks.outbox_{queue}",
            "schedule": 1.0,
            "options": {"expires": 10},
        }
        for queue in ("alerts", "memory", "repricing")
    },
    "outbox": {
        "task": "costboard.tasks.outbox_dispatch",
        "schedule": 1.0,
        "options": {"expires": 10},
    },
    "runaway-sweep": {"task": "costboard.tasks.runaway_sweep", "schedule": 60.0},
    "period-forecast": {"task": "costboard.tasks.period_forecast_sweep", "schedule": 900.0},
    # costboard/budgets/anomalies.py: a day's spend far above its trailing 14 days
    "spend-anomalies": {"task": "costboard.tasks.anomaly_sweep", "schedule": 300.0},
    "retention": {"task": "costboard.tasks.retention_sweep", "schedule": 3600.0},
    # costboard/partitions.py: the step table's month partitions, made ahead (PostgreSQL)
    "step-partitions": {"task": "costboard.tasks.step_partitions_ahead", "schedule": 3600.0},
    # memory_ui/lifecycle.py: TTL expiry; evict/merge/compress proposals for a person to decide
    "memory-ttl": {"task": "memory_ui.lifecycle.memory_ttl_sweep", "schedule": 900.0},
    "memory-proposals": {"task": "memory_ui.lifecycle.memory_proposals_sweep", "schedule": 3600.0},
    # costboard/billing/: yesterday's and today's bills of each provider with an admin key
    "billing-import": {"task": "costboard.tasks.billing_import", "schedule": 86400.0},
    # costboard/reports/: the weekly and monthly showback, hourly because a week ends at
    # midnight in each project's budget timezone; each goes to a recipient once (Monday's
    # first run after 00:00 UTC sends the UTC projects' week, the 1st's their month)
    "spend-reports": {"task": "costboard.tasks.spend_reports", "schedule": 3600.0},
}

# --- billing import (docs/billing.md) ---------------------------------------------------------
# Admin API keys of the organizations whose bills are imported (blank: that provider is not
# imported); the base URLs are for a proxy, or a test's local server.
COSTBOARD_OPENAI_ADMIN_KEY = env_str("COSTBOARD_OPENAI_ADMIN_KEY").strip()
COSTBOARD_ANTHROPIC_ADMIN_KEY = env_str("COSTBOARD_ANTHROPIC_ADMIN_KEY").strip()
COSTBOARD_OPENAI_API_BASE = env_base_url("COSTBOARD_OPENAI_API_BASE", "https://api.openai.com")
COSTBOARD_ANTHROPIC_API_BASE = env_base_url(
    "COSTBOARD_ANTHROPIC_API_BASE", "https://api.anthropic.com"
)

# --- budgets (docs/budgets.md, "Caps") -----------------------------------------------------
COSTBOARD_SESSION_TOKEN_CAP = env_int("COSTBOARD_SESSION_TOKEN_CAP", 100_000, minimum=1)
COSTBOARD_SESSION_COST_CAP_USD = env_decimal("COSTBOARD_SESSION_COST_CAP_USD", "5.00")
COSTBOARD_WARN_AT_PCT = env_fraction("COSTBOARD_WARN_AT_PCT", "0.8")
# stripped as /metrics strips the bearer it is sent: a secret file's newline would lock out all
COSTBOARD_METRICS_TOKEN = env_str("COSTBOARD_METRICS_TOKEN").strip()

# --- ingest's bounds (docs/api.md, "Limits") -------------------------------------------------
# A statement of ingest running longer than this is cancelled (PostgreSQL; 0: no limit): its
# transaction rolls back and the request answers 503 with Retry-After.
COSTBOARD_INGEST_STATEMENT_TIMEOUT_MS = env_int(
    "COSTBOARD_INGEST_STATEMENT_TIMEOUT_MS", 10_000, minimum=0
)
# An OTLP export is stored in chunks of at most this many spans, each its own transaction.
COSTBOARD_OTLP_CHUNK_SPANS = env_int("COSTBOARD_OTLP_CHUNK_SPANS", 1000, minimum=1)

# --- API limits per key (costboard/api/ratelimit.py, costboard/api/inflight.py) ------------
# Requests per second per API key (0: off); a project's own limit in the admin wins. Kept in
# Redis when the broker is Redis, so every worker shares it; otherwise in each process.
COSTBOARD_API_RATE_LIMIT = env_int("COSTBOARD_API_RATE_LIMIT", 50, minimum=0)
# Requests per API key being answered at once (0: off); a project's own value wins. Beyond it
# 429: a few long exports of one key cannot take every server thread from the others.
COSTBOARD_API_MAX_IN_FLIGHT = env_int("COSTBOARD_API_MAX_IN_FLIGHT", 2, minimum=0)
COSTBOARD_RATE_LIMIT_REDIS_URL = _broker if _broker.startswith(("redis://", "rediss://")) else ""
# gunicorn workers per machine, where gunicorn does not say (costboard/gunicorn_conf.py tells
# each worker its count): while Redis is away each process holds limit ÷ workers of both
# limits. WEB_CONCURRENCY is what gunicorn itself reads for --workers; 2 is `make run`'s.
COSTBOARD_WEB_WORKERS = env_int("WEB_CONCURRENCY", 2, minimum=1)

# --- memory search (memory_ui/ranking.py) ---------------------------------------------------
# score = Σ weight × component, each component in [0, 1]
COSTBOARD_MEMORY_WEIGHTS = {
    "relevance": 0.5,
    "importance": 0.2,
    "freshness": 0.15,
    "credibility": 0.15,
}
COSTBOARD_MEMORY_HALF_LIFE_DAYS = 30  # freshness halves every this many days

# --- alerts: budget events to webhooks and email (costboard/alerts.py) ---------------------
# Where Costboard is served, for absolute links in alerts; blank: links are paths.
COSTBOARD_BASE_URL = env_str("COSTBOARD_BASE_URL").strip().rstrip("/")
if COSTBOARD_BASE_URL and not COSTBOARD_BASE_URL.startswith(("http://", "https://")):
    raise ImproperlyConfigured(
        f"COSTBOARD_BASE_URL={COSTBOARD_BASE_URL!r} must start with http:// or https://, "
        "e.g. https://costboard.example.com."
    )
# PagerDuty's Events API v2 (a test points it at a local receiver)
COSTBOARD_PAGERDUTY_EVENTS_URL = env_base_url(
    "COSTBOARD_PAGERDUTY_EVENTS_URL", "https://events.pagerduty.com/v2/enqueue"
)
COSTBOARD_ALERT_TIMEOUT_SECONDS = env_int("COSTBOARD_ALERT_TIMEOUT_SECONDS", 5, minimum=1)
# A failed delivery is retried after 30 s, 60 s, 120 s, … until this many attempts.
COSTBOARD_ALERT_RETRY_SECONDS = env_int("COSTBOARD_ALERT_RETRY_SECONDS", 30, minimum=0)
COSTBOARD_ALERT_MAX_ATTEMPTS = env_int("COSTBOARD_ALERT_MAX_ATTEMPTS", 6, minimum=1)
# Deliveries a dispatcher sends at once (threads), each target's one after another, so a
# slow receiver holds up only its own alerts; 1: one after another (costboard/outbox.py).
COSTBOARD_ALERT_CONCURRENCY = env_int("COSTBOARD_ALERT_CONCURRENCY", 4, minimum=1)
# Intranet receivers webhooks may reach although loopback or private (costboard/egress.py):
# host names (.domain for its subdomains) and addresses or CIDRs, comma-separated.
# A bad entry stops start-up, named (costboard/apps.py).
COSTBOARD_WEBHOOK_ALLOW_HOSTS = env_list("COSTBOARD_WEBHOOK_ALLOW_HOSTS", "")

# Email: SMTP when EMAIL_HOST is set; otherwise mail is printed to the console, so `make run`
# never tries to reach a mail server. DJANGO_EMAIL_BACKEND overrides both (one that cannot be
# imported stops start-up, named: costboard/apps.py).
EMAIL_HOST = env_str("EMAIL_HOST").strip() or "localhost"
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured(
        "EMAIL_USE_TLS and EMAIL_USE_SSL are both on; use one (TLS for port 587, SSL for 465)."
    )
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL").strip() or "Costboard <costboard@localhost>"
EMAIL_BACKEND = env_str("DJANGO_EMAIL_BACKEND").strip() or (
    "django.core.mail.backends.smtp.EmailBackend"
    if env_str("EMAIL_HOST").strip()
    else "django.core.mail.backends.console.EmailBackend"
)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {"costboard": {"level": "INFO"}},
}
